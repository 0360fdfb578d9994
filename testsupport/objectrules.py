"""What a real API server refuses (422) in the built-in objects this project writes.

Only the rules a generated object could break, with the API server's wording: object names
(DNS-1035 labels for Services, DNS-1123 labels for Namespaces, path segments for RBAC objects,
DNS-1123 subdomains for the rest), label keys and values (in metadata, pod templates and
selectors), and duplicate container names, port names and Service ports.
"""

from __future__ import annotations

import re
from typing import Any

from inference_operator.jsontypes import JsonObject

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
PATH_SEGMENT_KINDS = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def _invalid(path: str, value: Any, why: str) -> str:
    return f'{path}: Invalid value: "{value}": {why}'


def name_errors(kind: str, name: str) -> list[str]:
    """metadata.name as the API server judges it for `kind`."""
    path = "metadata.name"
    if kind in PATH_SEGMENT_KINDS:
        if name in (".", "..") or "/" in name or "%" in name:
            return [_invalid(path, name, "may not contain '/' or '%' and may not be '.' or '..'")]
        return []
    if kind == "Service":
        errors = [] if len(name) <= 63 else [_invalid(path, name, "must be no more than 63 characters")]
        return errors + ([] if DNS1035_LABEL.match(name) else [_invalid(path, name, DNS1035_MESSAGE)])
    if kind == "Namespace":
        errors = [] if len(name) <= 63 else [_invalid(path, name, "must be no more than 63 characters")]
        return errors + ([] if DNS1123_LABEL.match(name) else [_invalid(path, name, DNS1123_LABEL_MESSAGE)])
    errors = [] if len(name) <= 253 else [_invalid(path, name, "must be no more than 253 characters")]
    return errors + ([] if DNS1123_SUBDOMAIN.match(name) else [_invalid(path, name, DNS1123_SUBDOMAIN_MESSAGE)])


def label_errors(labels: Any, path: str) -> list[str]:
    errors: list[str] = []
    if not isinstance(labels, dict):
        return errors
    for key, value in labels.items():
        prefix, _, local = key.rpartition("/")
        if (prefix and not (len(prefix) <= 253 and DNS1123_SUBDOMAIN.match(prefix))) or not (
            len(local) <= 63 and QUALIFIED_NAME.match(local)
        ):
            errors.append(_invalid(path, key, "name part must be a qualified name of at most 63 characters"))
        if not isinstance(value, str):
            errors.append(_invalid(f"{path}", value, "label values must be strings"))
            continue
        if len(value) > 63:
            errors.append(_invalid(path, value, "must be no more than 63 characters"))
        if not LABEL_VALUE.match(value):
            errors.append(_invalid(path, value, LABEL_VALUE_MESSAGE))
    return errors


def _pod_errors(pod_spec: Any, path: str) -> list[str]:
    errors: list[str] = []
    if not isinstance(pod_spec, dict):
        return errors
    container_names: set[str] = set()
    port_names: set[str] = set()
    for list_name in ("initContainers", "containers"):
        for i, container in enumerate(pod_spec.get(list_name) or []):
            where = f"{path}.{list_name}[{i}]"
            name = container.get("name")
            if name in container_names:
                errors.append(f'{where}.name: Duplicate value: "{name}"')
            container_names.add(name)
            for j, port in enumerate(container.get("ports") or []):
                port_name = port.get("name")
                if port_name is None:
                    continue
                if port_name in port_names:
                    errors.append(f'{where}.ports[{j}].name: Duplicate value: "{port_name}"')
                port_names.add(port_name)
    return errors


def _service_errors(spec: Any) -> list[str]:
    errors: list[str] = []
    if not isinstance(spec, dict):
        return errors
    ports = spec.get("ports") or []
    names: set[str] = set()
    keys: set[tuple[Any, str]] = set()
    for i, port in enumerate(ports):
        name = port.get("name")
        if len(ports) > 1 and not name:
            errors.append(f"spec.ports[{i}].name: Required value")
        elif name in names:
            errors.append(f'spec.ports[{i}].name: Duplicate value: "{name}"')
        names.add(name)
        key = (port.get("port"), port.get("protocol", "TCP"))
        if key in keys:
            errors.append(f'spec.ports[{i}]: Duplicate value: "{key[0]}/{key[1]}"')
        keys.add(key)
    errors += label_errors(spec.get("selector"), "spec.selector")
    return errors


def object_errors(kind: str, obj: JsonObject, creating: bool) -> list[str]:
    """Field errors of a built-in object (names only on create: a name never changes)."""
    meta = obj.get("metadata") or {}
    errors = name_errors(kind, str(meta.get("name", ""))) if creating else []
    errors += label_errors(meta.get("labels"), "metadata.labels")
    spec = obj.get("spec")
    if kind == "Service":
        errors += _service_errors(spec)
    elif isinstance(spec, dict) and isinstance(spec.get("template"), dict):  # Deployment & other workloads
        template = spec["template"]
        errors += label_errors((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
        errors += label_errors((spec.get("selector") or {}).get("matchLabels"), "spec.selector.matchLabels")
        errors += _pod_errors(template.get("spec"), "spec.template.spec")
    elif isinstance(spec, dict) and isinstance(spec.get("selector"), dict):  # PodDisruptionBudget
        errors += label_errors(spec["selector"].get("matchLabels"), "spec.selector.matchLabels")
    return errors

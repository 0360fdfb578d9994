"""Operator-wide defaults for what a spec leaves unset, from the operator's environment (pure:
`config.load()` passes the environment in, once, at start).

A cluster has one GPU stack: either the device plugin (with one resource naming strategy) or
the DRA driver, and its hosts have one set of device-node groups. The chart states these once
(values `gpu.*`, passed as the variables below); an InferenceService that sets the field itself
wins.

    INFERENCE_OPERATOR_GPU_ALLOCATION           devicePlugin | dra            (default devicePlugin)
    INFERENCE_OPERATOR_GPU_RESOURCE_NAMING      single | mixed                (default single)
    INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS  comma-separated GIDs, or ""   (default 44,109)

How model-fetch init containers reach model sources (chart values `modelFetch.*`). These are the
platform's, never the InferenceService's: a proxy or a CA is what decides who sees a Hub token.

    INFERENCE_OPERATOR_FETCH_HTTPS_PROXY / _HTTP_PROXY / _NO_PROXY   proxy settings (default none)
    INFERENCE_OPERATOR_FETCH_CA_BUNDLE   PEM certificates trusted besides the public roots
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .models import GpuAllocation, ResourceNaming

ALLOCATION_ENV = "INFERENCE_OPERATOR_GPU_ALLOCATION"
RESOURCE_NAMING_ENV = "INFERENCE_OPERATOR_GPU_RESOURCE_NAMING"
SUPPLEMENTAL_GROUPS_ENV = "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS"
# video (44 on Debian and Ubuntu) and a common render GID. The render GID differs between hosts
# (109, 110 and 991 are all common): `stat -c %g /dev/kfd /dev/dri/renderD*` on a GPU node.
DEFAULT_SUPPLEMENTAL_GROUPS = (44, 109)
MAX_GID = 4294967295


E = TypeVar("E", GpuAllocation, ResourceNaming)


class SettingsError(ValueError):
    """An operator setting with a value the operator cannot use; the message names the variable."""


@dataclass(frozen=True)
class GpuDefaults:
    allocation: GpuAllocation = GpuAllocation.DEVICE_PLUGIN
    resource_naming: ResourceNaming = ResourceNaming.SINGLE
    supplemental_groups: tuple[int, ...] = DEFAULT_SUPPLEMENTAL_GROUPS

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GpuDefaults:
        """Pure: the defaults the variables in `environ` describe; unset variables keep ours."""
        defaults = cls()
        allocation = _enum(environ, ALLOCATION_ENV, GpuAllocation, defaults.allocation)
        naming = _enum(environ, RESOURCE_NAMING_ENV, ResourceNaming, defaults.resource_naming)
        groups = defaults.supplemental_groups
        if SUPPLEMENTAL_GROUPS_ENV in environ:
            groups = parse_groups(environ[SUPPLEMENTAL_GROUPS_ENV], SUPPLEMENTAL_GROUPS_ENV)
        return cls(allocation=allocation, resource_naming=naming, supplemental_groups=groups)


def _enum(environ: Mapping[str, str], name: str, enum: type[E], default: E) -> E:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return enum(raw)
    except ValueError:
        allowed = " or ".join(e.value for e in enum)
        raise SettingsError(f"{name}={raw!r}: must be {allowed}") from None


def parse_groups(raw: str, name: str) -> tuple[int, ...]:
    """`44,992` → (44, 992); empty → no groups. Bad input names `name`."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        groups = tuple(int(p) for p in parts)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: must be comma-separated group IDs, e.g. 44,992") from None
    if any(g < 1 or g > MAX_GID for g in groups):  # 0, root's group, would reach every container
        raise SettingsError(f"{name}={raw!r}: group IDs must be between 1 and {MAX_GID}")
    return groups


FETCH_HTTPS_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_HTTPS_PROXY"
FETCH_HTTP_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_HTTP_PROXY"
FETCH_NO_PROXY_ENV = "INFERENCE_OPERATOR_FETCH_NO_PROXY"
FETCH_CA_BUNDLE_ENV = "INFERENCE_OPERATOR_FETCH_CA_BUNDLE"
# An environment variable's value must fit the kernel's limit for one string (128 KiB).
MAX_CA_BUNDLE_BYTES = 64 * 1024
_PROXY = re.compile(r"^https?://[^\s/?#]+/?$")


@dataclass(frozen=True)
class FetchSettings:
    """Proxy and extra CA certificates for the model-fetch init containers."""

    https_proxy: str = ""
    http_proxy: str = ""
    no_proxy: str = ""
    ca_bundle: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FetchSettings:
        """Pure: the settings the variables in `environ` describe; a bad value names its variable."""
        proxies = {}
        for name in (FETCH_HTTPS_PROXY_ENV, FETCH_HTTP_PROXY_ENV):
            value = environ.get(name, "").strip()
            if value and not _PROXY.match(value):
                raise SettingsError(f"{name}={value!r}: must be a proxy URL, http(s)://host[:port]")
            proxies[name] = value
        no_proxy = environ.get(FETCH_NO_PROXY_ENV, "").strip()
        if any(c.isspace() for c in no_proxy):
            raise SettingsError(f"{FETCH_NO_PROXY_ENV}: a comma-separated list of hosts, without spaces")
        bundle = environ.get(FETCH_CA_BUNDLE_ENV, "").strip()
        if bundle and ("-----BEGIN CERTIFICATE-----" not in bundle or len(bundle.encode()) > MAX_CA_BUNDLE_BYTES):
            raise SettingsError(f"{FETCH_CA_BUNDLE_ENV}: PEM certificates of at most {MAX_CA_BUNDLE_BYTES} bytes")
        return cls(
            https_proxy=proxies[FETCH_HTTPS_PROXY_ENV],
            http_proxy=proxies[FETCH_HTTP_PROXY_ENV],
            no_proxy=no_proxy,
            ca_bundle=bundle + "\n" if bundle else "",
        )


NETWORK_POLICY_ENV = "INFERENCE_OPERATOR_NETWORK_POLICY"
OPERATOR_NAMESPACE_ENV = "INFERENCE_OPERATOR_NAMESPACE"
PROMETHEUS_NAMESPACES_ENV = "INFERENCE_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_PROMETHEUS_NAMESPACES: dict[str, object] = {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}
_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}
_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


@dataclass(frozen=True)
class NetworkPolicySettings:
    """Whether each InferenceService gets a NetworkPolicy (chart value networkPolicy.enabled),
    and who may reach its pods' non-serving ports: the operator's namespace (which asks the
    adapters sidecars how they stand) and Prometheus's (a namespace label selector).

        INFERENCE_OPERATOR_NETWORK_POLICY                    true | false    (default false; the
                                                             chart sets true)
        INFERENCE_OPERATOR_NAMESPACE                         the operator's namespace
        INFERENCE_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR     a LabelSelector as JSON (default:
                                                             the namespace named monitoring)
    """

    enabled: bool = False
    operator_namespace: str = ""
    prometheus_namespaces: dict[str, object] = field(default_factory=lambda: dict(DEFAULT_PROMETHEUS_NAMESPACES))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NetworkPolicySettings:
        """Pure: the settings `environ` describes; a bad value names its variable."""
        raw = environ.get(NETWORK_POLICY_ENV, "").strip().lower()
        if raw not in ("", "true", "false"):
            raise SettingsError(f"{NETWORK_POLICY_ENV}={raw!r}: must be true or false")
        namespace = environ.get(OPERATOR_NAMESPACE_ENV, "").strip()
        if raw == "true" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
            raise SettingsError(
                f"{OPERATOR_NAMESPACE_ENV}={namespace!r}: NetworkPolicies need the operator's namespace"
            )
        selector = dict(DEFAULT_PROMETHEUS_NAMESPACES)
        if text := environ.get(PROMETHEUS_NAMESPACES_ENV, "").strip():
            selector = parse_selector(text, PROMETHEUS_NAMESPACES_ENV)
        return cls(enabled=raw == "true", operator_namespace=namespace, prometheus_namespaces=selector)


def parse_selector(text: str, name: str) -> dict[str, object]:
    """A Kubernetes LabelSelector from JSON, its shape checked (the API server checks the rest);
    empty parts left out. One that selects every namespace is refused: say so with a list."""
    problem = f"{name}: must be a label selector as JSON, e.g. " + '{"matchLabels": {"name": "monitoring"}}'
    try:
        selector = json.loads(text)
    except ValueError:
        raise SettingsError(problem) from None
    if not isinstance(selector, dict) or set(selector) - _SELECTOR_KEYS:
        raise SettingsError(problem)
    selector = {k: v for k, v in selector.items() if v}  # Helm writes null and [] for unset parts
    if not selector:
        raise SettingsError(f"{name}: an empty selector would let every namespace in")
    labels = selector.get("matchLabels", {})
    expressions = selector.get("matchExpressions", [])
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise SettingsError(problem)
    if not isinstance(expressions, list) or not all(
        isinstance(e, dict) and isinstance(e.get("key"), str) and e.get("operator") in _OPERATORS for e in expressions
    ):
        raise SettingsError(problem)
    return selector


TRACES_ENDPOINT_ENV = "INFERENCE_OPERATOR_OTLP_TRACES_ENDPOINT"
TRACE_SAMPLE_RATIO_ENV = "INFERENCE_OPERATOR_TRACE_SAMPLE_RATIO"
_TRACES_URL = re.compile(r"^https?://[^\s/?#@]+(/[^\s?#]*)?$")


@dataclass(frozen=True)
class TracingSettings:
    """Where the operator sends the spans of its reconciles (chart values tracing.endpoint and
    tracing.samplingRatio): the platform's collector, never an address from an InferenceService.

        INFERENCE_OPERATOR_OTLP_TRACES_ENDPOINT   OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces
        INFERENCE_OPERATOR_TRACE_SAMPLE_RATIO     share of reconciles traced, 0..1 (default 1)
    """

    endpoint: str = ""  # "" = tracing off
    sampling_ratio: float = 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TracingSettings:
        """Pure: the settings the variables in `environ` describe; a bad value names its variable."""
        endpoint = environ.get(TRACES_ENDPOINT_ENV, "").strip()
        if endpoint and (len(endpoint) > 2048 or not _TRACES_URL.match(endpoint)):
            raise SettingsError(
                f"{TRACES_ENDPOINT_ENV}={endpoint!r}: must be an http(s) URL without user info or query"
            )
        text = environ.get(TRACE_SAMPLE_RATIO_ENV, "").strip() or "1"
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise SettingsError(f"{TRACE_SAMPLE_RATIO_ENV}={text!r}: must be a number from 0 to 1")
        return cls(endpoint=endpoint, sampling_ratio=ratio)


ACTIVATOR_SERVICE_ENV = "INFERENCE_OPERATOR_ACTIVATOR_SERVICE"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class ActivatorSettings:
    """Where the chart installed the activator that holds requests of services at zero.

    INFERENCE_OPERATOR_ACTIVATOR_SERVICE   NAMESPACE/NAME of its Service; unset: no activator,
                                           and a service at zero refuses connections
    """

    namespace: str = ""
    service: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.service)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ActivatorSettings:
        text = environ.get(ACTIVATOR_SERVICE_ENV, "").strip()
        if not text:
            return cls()
        namespace, _, service = text.partition("/")
        if not (_DNS_LABEL.match(namespace) and _DNS_LABEL.match(service)):
            raise SettingsError(f"{ACTIVATOR_SERVICE_ENV}={text!r}: must be NAMESPACE/NAME of a Service")
        return cls(namespace, service)

"""What an InferenceService may ask of its pods, as the platform team allows it (chart `policy.*`).

"May create InferenceServices" must not mean "may run pods as any ServiceAccount, at any
priority, from any image": the operator renders those pods with its own rights. So a spec that
names a ServiceAccount, a PriorityClass or an image outside the platform's lists, or asks for
the ServiceAccount token to be mounted when the platform does not allow it, is refused whole:
`Degraded=True`, reason `PolicyViolation`, naming the field and the value; nothing is rolled out
(a running Deployment keeps its previous spec) until the spec changes or the platform widens
the policy (an operator restart applies it to every InferenceService).

    INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS   comma-separated names         (default: default)
    INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES   comma-separated names         (default: none)
    INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES   comma-separated prefixes, *   (default: those of
                                                 the operator's own images)
    INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN        true | false                  (default: false)
    INFERENCE_OPERATOR_POLICY_SUPPLEMENTAL_GROUPS  comma-separated GIDs and     (default: 1-999,
                                                 ranges (1-999), or *; empty    the system groups
                                                 allows none                    hosts put video
                                                                                and render in)
    INFERENCE_OPERATOR_POLICY_GATEWAYS           comma-separated namespace/name (default: *)
                                                 of Gateways, namespace/*, or *
    INFERENCE_OPERATOR_POLICY_HOSTNAMES          comma-separated host names     (default: *)
                                                 and *.suffix patterns, or *

Supplemental groups reach every container of the pod (the credential holders too): GID 0 is
never allowed, and by default only system groups (below 1000, where distributions put video and
render; user and project groups, which own shared files, start at 1000). An HTTPRoute's
parentRefs decide which Gateway (so which listeners and addresses) serves the author's routes,
and its hostnames which requests it takes: an exact name beats another tenant's wildcard. A
parentRef without a namespace is the InferenceService's.

Pure: no I/O; the environment is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .models import HTTPRouteSpec, InferenceServiceSpec
from .reasons import Reason

SERVICE_ACCOUNTS_ENV = "INFERENCE_OPERATOR_POLICY_SERVICE_ACCOUNTS"
PRIORITY_CLASSES_ENV = "INFERENCE_OPERATOR_POLICY_PRIORITY_CLASSES"
IMAGE_REGISTRIES_ENV = "INFERENCE_OPERATOR_POLICY_IMAGE_REGISTRIES"
ALLOW_TOKEN_ENV = "INFERENCE_OPERATOR_POLICY_ALLOW_TOKEN"
SUPPLEMENTAL_GROUPS_ENV = "INFERENCE_OPERATOR_POLICY_SUPPLEMENTAL_GROUPS"
GATEWAYS_ENV = "INFERENCE_OPERATOR_POLICY_GATEWAYS"
HOSTNAMES_ENV = "INFERENCE_OPERATOR_POLICY_HOSTNAMES"
MAX_GID = 4294967295
DEFAULT_GROUPS = "1-999"
# namespace/name, namespace/*, or *; host names and *.suffix patterns, or * (as the chart's schema).
_GATEWAY = r"\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?/(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
_HOSTNAME = r"\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
ANY = "*"


class PolicyViolation(Exception):
    """A spec asks for what the platform does not allow; the message names field and value."""

    reason = Reason.POLICY_VIOLATION


def normalized_image(image: str) -> str:
    """`attacker/steal` and `ubuntu` are Docker Hub images: name the registry they come from."""
    first, _, rest = image.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        return f"docker.io/{image if rest else 'library/' + image}"
    return image


def normalized_prefix(prefix: str) -> str:
    """A registry prefix as image names start: `mirror.example` and `ghcr.io/org/` name hosts
    (kept), `org/` a Docker Hub namespace (`docker.io/org/`); always ending in one `/`."""
    path = prefix.rstrip("/")
    first = path.split("/", 1)[0]
    return f"{path}/" if "." in first or ":" in first or first == "localhost" else f"docker.io/{path}/"


def repository_prefix(image: str) -> str:
    """`ghcr.io/org/model-server:1.0` → `ghcr.io/org/`: where the operator's own images live."""
    name = normalized_image(image).split("@", 1)[0]
    return name.rsplit("/", 1)[0] + "/"


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


@dataclass(frozen=True)
class PodPolicy:
    service_accounts: tuple[str, ...] = ("default",)
    priority_classes: tuple[str, ...] = ()
    image_registries: tuple[str, ...] = (ANY,)
    allow_token: bool = False
    # Inclusive GID ranges; ANY_GROUP allows every GID but 0.
    supplemental_groups: tuple[tuple[int, int], ...] = ()
    gateways: tuple[str, ...] = (ANY,)
    hostnames: tuple[str, ...] = (ANY,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], own_images: Iterable[str]) -> PodPolicy:
        """The platform's policy; registries default to those of the operator's own images."""
        registries = _names(environ.get(IMAGE_REGISTRIES_ENV)) or tuple(
            dict.fromkeys(repository_prefix(i) for i in own_images)
        )
        token = environ.get(ALLOW_TOKEN_ENV, "").strip().lower()
        if token not in ("", "true", "false"):
            raise ValueError(f"{ALLOW_TOKEN_ENV}={token!r}: must be true or false")
        return cls(
            service_accounts=_names(environ.get(SERVICE_ACCOUNTS_ENV)) or ("default",),
            priority_classes=_names(environ.get(PRIORITY_CLASSES_ENV)) or (),
            image_registries=registries,
            allow_token=token == "true",
            supplemental_groups=_gid_ranges(environ.get(SUPPLEMENTAL_GROUPS_ENV, DEFAULT_GROUPS)),
            gateways=_patterns(environ, GATEWAYS_ENV, _GATEWAY),
            hostnames=_patterns(environ, HOSTNAMES_ENV, _HOSTNAME),
        )

    def image_allowed(self, image: str) -> bool:
        if ANY in self.image_registries:
            return True
        name = normalized_image(image)
        return any(name.startswith(normalized_prefix(prefix)) for prefix in self.image_registries)

    def group_allowed(self, gid: int) -> bool:
        return gid != 0 and any(low <= gid <= high for low, high in self.supplemental_groups)

    def gateway_allowed(self, namespace: str, name: str) -> bool:
        return any(p in (ANY, f"{namespace}/{name}", f"{namespace}/{ANY}") for p in self.gateways)

    def hostname_allowed(self, hostname: str) -> bool:
        """An exact name, or any name (a wildcard one too) under a `*.suffix` pattern."""
        return any(p in (ANY, hostname) or (p.startswith("*.") and hostname.endswith(p[1:])) for p in self.hostnames)


ANY_GROUP = (1, MAX_GID)


def _gid_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """`44,109,1000-1999` → ((44, 44), (109, 109), (1000, 1999)); `*` → every GID but 0."""
    ranges = []
    for part in _names(text) or ():
        if part == ANY:
            ranges.append(ANY_GROUP)
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit() or not 0 < int(low) <= int(high or low) <= MAX_GID:
            raise ValueError(f"{SUPPLEMENTAL_GROUPS_ENV}={text!r}: GIDs (1-{MAX_GID}), ranges such as 1000-1999, or *")
        ranges.append((int(low), int(high or low)))
    return tuple(ranges)


def _patterns(environ: Mapping[str, str], name: str, pattern: str) -> tuple[str, ...]:
    values = _names(environ.get(name)) or (ANY,)
    if bad := [v for v in values if not re.fullmatch(pattern, v)]:
        raise ValueError(f"{name}: {', '.join(bad)} is not a valid entry")
    return values


def violations(spec: InferenceServiceSpec, policy: PodPolicy, namespace: str = "") -> list[str]:
    """Every field of `spec` the policy refuses, as `field value: why` (empty when allowed).
    `namespace` is the InferenceService's: that of a parentRef that names none."""
    found = []
    scheduling = spec.scheduling
    account = scheduling.service_account_name
    if account and account not in policy.service_accounts:
        allowed = _list(policy.service_accounts)
        found.append(f"scheduling.serviceAccountName {account!r} is not allowed (allowed: {allowed})")
    priority = scheduling.priority_class_name
    if priority and ANY not in policy.priority_classes and priority not in policy.priority_classes:
        allowed = _list(policy.priority_classes)
        found.append(f"scheduling.priorityClassName {priority!r} is not allowed (allowed: {allowed})")
    if scheduling.automount_service_account_token and not policy.allow_token:
        found.append("scheduling.automountServiceAccountToken true is not allowed on this cluster")
    images = [("runtime.image", spec.runtime.image)]
    if spec.model.uri.startswith("oci://"):
        images.append(("model.uri", spec.model.uri.removeprefix("oci://")))
    for field, image in images:
        if image and not policy.image_allowed(image):
            found.append(f"{field} {image!r} is not from an allowed registry ({_list(policy.image_registries)})")
    groups = spec.resources.gpu.supplemental_groups or []
    if refused := [g for g in groups if not policy.group_allowed(g)]:
        allowed = _list(tuple(_range_text(r) for r in policy.supplemental_groups))
        found.append(f"resources.gpu.supplementalGroups {refused[0]} is not allowed (allowed: {allowed}; never 0)")
    if spec.routing.http_route is not None:
        found += _route_violations(spec.routing.http_route, policy, namespace)
    return found


def _route_violations(route: HTTPRouteSpec, policy: PodPolicy, namespace: str) -> list[str]:
    found = []
    parents = [f"{p.namespace or namespace}/{p.name}" for p in route.parent_refs]
    if refused := [p for p in parents if not policy.gateway_allowed(*p.split("/", 1))]:
        found.append(
            f"routing.httpRoute.parentRefs {refused[0]!r} is not an allowed Gateway (allowed: {_list(policy.gateways)})"
        )
    allowed = _list(policy.hostnames)
    if not route.hostnames and ANY not in policy.hostnames:
        found.append(f"routing.httpRoute.hostnames empty (every host) is not allowed (allowed: {allowed})")
    if refused := [h for h in route.hostnames if not policy.hostname_allowed(h)]:
        found.append(f"routing.httpRoute.hostnames {refused[0]!r} is not allowed (allowed: {allowed})")
    return found


def _range_text(gids: tuple[int, int]) -> str:
    low, high = gids
    return ANY if gids == ANY_GROUP else str(low) if low == high else f"{low}-{high}"


def check(spec: InferenceServiceSpec, policy: PodPolicy, namespace: str = "") -> None:
    """Raise PolicyViolation naming every refused field."""
    if found := violations(spec, policy, namespace):
        raise PolicyViolation("; ".join(found))


def _list(values: tuple[str, ...]) -> str:
    return ", ".join(values) if values else "none"

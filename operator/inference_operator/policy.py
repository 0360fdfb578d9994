"""What an InferenceService may ask of its pods, as the platform team allows it (chart `policy.*`).

"May create InferenceServices" must not mean "may run pods as any ServiceAccount, at any
priority, from any image": the operator renders those pods with its own rights. So a spec that
names a ServiceAccount, a PriorityClass or an image outside the platform's lists, or asks for
the ServiceAccount token to be mounted when the platform does not allow it, is refused whole:
`Degraded=True`, reason `PolicyViolation`, naming the field and the value; nothing is rolled out
(a running Deployment keeps its previous spec) until the spec changes or the platform widens
the policy (an operator restart applies it to every InferenceService).

The platform's lists are `settings.PodPolicy` (variables INFERENCE_OPERATOR_POLICY_*).

Supplemental groups reach every container of the pod (the credential holders too): GID 0 is
never allowed, and by default only system groups (below 1000, where distributions put video and
render; user and project groups, which own shared files, start at 1000). An HTTPRoute's
parentRefs decide which Gateway (so which listeners and addresses) serves the author's routes,
and its hostnames which requests it takes: an exact name beats another tenant's wildcard. A
parentRef without a namespace is the InferenceService's.

Pure: no I/O; the environment is passed in.
"""

from __future__ import annotations

from .models import HTTPRouteSpec, InferenceServiceSpec, ResourcesSpec
from .reasons import Reason
from .settings import ANY, ANY_GROUP, PodPolicy


class PolicyViolation(Exception):
    """A spec asks for what the platform does not allow; the message names field and value."""

    reason = Reason.POLICY_VIOLATION


def violations(spec: InferenceServiceSpec, policy: PodPolicy, namespace: str = "") -> list[str]:
    """Every field of `spec` the policy refuses, as `field value: why` (empty when allowed).
    `namespace` is the InferenceService's: that of a parentRef that names none."""
    found = _scheduling_violations(spec, policy) + _image_violations(spec, policy) + _group_violations(spec, policy)
    if spec.routing.http_route is not None:
        found += _route_violations(spec.routing.http_route, policy, namespace)
    return found


def _scheduling_violations(spec: InferenceServiceSpec, policy: PodPolicy) -> list[str]:
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
    return found


def _image_violations(spec: InferenceServiceSpec, policy: PodPolicy) -> list[str]:
    found = []
    images = [("runtime.image", spec.runtime.image)]
    if spec.model.uri.startswith("oci://"):
        images.append(("model.uri", spec.model.uri.removeprefix("oci://")))
    for field, image in images:
        if image and not policy.image_allowed(image):
            found.append(f"{field} {image!r} is not from an allowed registry ({_list(policy.image_registries)})")
    return found


def _group_violations(spec: InferenceServiceSpec, policy: PodPolicy) -> list[str]:
    found = []
    for field, resources in _resources(spec):
        groups = resources.gpu.supplemental_groups or []
        if refused := [g for g in groups if not policy.group_allowed(g)]:
            allowed = _list(tuple(_range_text(r) for r in policy.supplemental_groups))
            found.append(f"{field}.gpu.supplementalGroups {refused[0]} is not allowed (allowed: {allowed}; never 0)")
    return found


def _resources(spec: InferenceServiceSpec) -> list[tuple[str, ResourcesSpec]]:
    """Every pod's resources, by field: spec.resources, and each disaggregated role's own."""
    found = [("resources", spec.resources)]
    if (roles := spec.disaggregation) is not None:
        for name, role in (("prefill", roles.prefill), ("decode", roles.decode)):
            if role.resources is not None:
                found.append((f"disaggregation.{name}.resources", role.resources))
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

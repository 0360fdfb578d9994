"""How a model-server pod gets its AMD GPUs, in each allocation mode AMD's stack offers.

- device plugin, `single` naming (ROCm/k8s-device-plugin's default): every GPU or partition is
  `amd.com/gpu`; product, family, VRAM and partition select nodes through the labels the AMD GPU
  node labeller sets.
- device plugin, `mixed` naming: a partitioned GPU is advertised as `amd.com/<partition>`
  (`amd.com/cpx_nps4`), so the partition is the resource name, not a node label.
- DRA (`resource.k8s.io/v1`, the GPU Operator's DRA driver, DeviceClass `gpu.amd.com`): the pod
  references a ResourceClaimTemplate whose CEL selectors carry product, family, VRAM and
  partition; the scheduler picks devices, no extended resource and no node labels are involved.

In every mode the container sees only its own devices, so `ROCR_VISIBLE_DEVICES` names indices
0..count-1 (or the order `visibleDevices` gives) and `HIP_VISIBLE_DEVICES`, which indexes the
devices ROCr exposes, is 0..count-1. Pure functions of the Owner; the operator-wide defaults
(chart values `gpu.*`) come in on `Owner.gpu_defaults`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal

from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT, RESOURCE_CLAIM_TEMPLATE
from ..models import GPU_RESOURCE, GpuAllocation, GpuSpec, ResourceNaming
from ..settings import GpuDefaults
from .common import Owner, object_meta, standard_labels

RESOURCE_DOMAIN = "amd.com"
CLAIM_NAME = "gpu"
# The DRA driver publishes its attributes and capacities under its own name.
DRA_DRIVER = "gpu.amd.com"
CLAIM_HASH_ANNOTATION = "inference.rocm.dev/gpu-claim-hash"
GPU_TAINT_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}

# Node labels the AMD GPU node labeller sets (ROCm/k8s-device-plugin cmd/k8s-node-labeller: the
# `amd.com/gpu.<name>` form, with a value when every GPU of the node agrees).
NODE_LABELS = {
    "product_name": "amd.com/gpu.product-name",
    "family": "amd.com/gpu.family",
    "vram": "amd.com/gpu.vram",
}
# The partition label: the labeller's code emits the first key, AMD's docs and the GPU
# Operator name the second. Nodes with either one qualify.
PARTITION_LABELS = ("amd.com/gpu.compute-memory-partition", "amd.com/compute-memory-partition")
# DRA device attributes (ROCm/k8s-gpu-dra-driver docs/driver-attributes.md).
DRA_ATTRIBUTES = {"product_name": "productName", "family": "family", "partition": "partitionProfile"}


@dataclass(frozen=True)
class GpuPlan:
    """The effective allocation of one InferenceService: spec fields, else the operator's defaults."""

    count: int
    allocation: GpuAllocation
    resource_naming: ResourceNaming
    supplemental_groups: tuple[int, ...]


@dataclass(frozen=True)
class GpuWiring:
    """What the GPUs add to the pod: each part lands in one place of the Deployment."""

    resources: dict[str, str] = field(default_factory=dict)  # container requests and limits
    claims: list[JsonObject] = field(default_factory=list)  # container resources.claims
    pod_claims: list[JsonObject] = field(default_factory=list)  # pod spec.resourceClaims
    env: dict[str, str] = field(default_factory=dict)
    affinity: JsonObject | None = None
    tolerations: list[JsonObject] = field(default_factory=list)
    supplemental_groups: list[int] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)  # pod template


def plan(gpu: GpuSpec, defaults: GpuDefaults) -> GpuPlan:
    groups = defaults.supplemental_groups if gpu.supplemental_groups is None else tuple(gpu.supplemental_groups)
    return GpuPlan(
        count=gpu.count,
        allocation=gpu.allocation or defaults.allocation,
        resource_naming=gpu.resource_naming or defaults.resource_naming,
        supplemental_groups=groups,
    )


def resource_name(gpu: GpuSpec, naming: ResourceNaming) -> str:
    """The device plugin's extended resource: `amd.com/<partition>` under mixed naming."""
    if naming == ResourceNaming.MIXED and gpu.partition:
        return f"{RESOURCE_DOMAIN}/{gpu.partition}"
    return GPU_RESOURCE


def visible_devices_env(gpu: GpuSpec) -> dict[str, str]:
    """ROCr picks (and orders) the pod's devices; HIP then sees all of those, in that order."""
    identity = ",".join(str(i) for i in range(gpu.count))
    return {"ROCR_VISIBLE_DEVICES": gpu.visible_devices or identity, "HIP_VISIBLE_DEVICES": identity}


def node_affinity(gpu: GpuSpec, naming: ResourceNaming) -> JsonObject | None:
    """Required node affinity on the labeller's labels; the partition label in either spelling.

    Expressions within a term are ANDed and terms are ORed, so each spelling of the partition
    label gets a term of its own that repeats the other expressions. Under mixed naming the
    resource name already pins the partition (and a node with mixed partitions has no label).
    """

    def common() -> list[JsonObject]:
        return [
            {"key": label, "operator": "In", "values": [getattr(gpu, name)]}
            for name, label in NODE_LABELS.items()
            if getattr(gpu, name)
        ]

    if gpu.partition and naming == ResourceNaming.SINGLE:
        terms = [
            {"matchExpressions": [*common(), {"key": label, "operator": "In", "values": [gpu.partition]}]}
            for label in PARTITION_LABELS
        ]
    elif common():
        terms = [{"matchExpressions": common()}]
    else:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _cel_string(value: str) -> str:
    return json.dumps(value)  # a double-quoted CEL string literal with JSON's escapes


def _vram_bounds(vram: str) -> tuple[str, str]:
    """The labeller rounds memory to whole GiB (`192G`); the same rounding as a quantity range."""
    match = re.fullmatch(r"([0-9]+)([GM])", vram)
    if match is None:  # the schema's pattern keeps this from happening
        raise ValueError(f"resources.gpu.vram {vram!r} is not a number followed by G or M")
    amount, unit = Decimal(match.group(1)), match.group(2) + "i"
    half = Decimal("0.5")
    return f"{max(amount - half, Decimal(0))}{unit}", f"{amount + half}{unit}"


def dra_selectors(gpu: GpuSpec) -> list[str]:
    """CEL expressions a device must satisfy, one per constraint the spec sets."""
    expressions = [
        f"device.attributes[{_cel_string(DRA_DRIVER)}].{attribute} == {_cel_string(getattr(gpu, name))}"
        for name, attribute in DRA_ATTRIBUTES.items()
        if getattr(gpu, name)
    ]
    if gpu.vram:
        low, high = _vram_bounds(gpu.vram)
        memory = f"device.capacity[{_cel_string(DRA_DRIVER)}].memory"
        expressions.append(f'{memory}.compareTo(quantity("{low}")) >= 0 && {memory}.compareTo(quantity("{high}")) < 0')
    return expressions


def claim_template_spec(owner: Owner) -> JsonObject:
    """`spec` of the ResourceClaimTemplate: `count` devices of the class, filtered by the selectors."""
    gpu = owner.spec.resources.gpu
    request: JsonObject = {"deviceClassName": gpu.device_class_name, "allocationMode": "ExactCount", "count": gpu.count}
    if selectors := dra_selectors(gpu):
        request["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {
        # Claims made from the template carry the service's labels, so `kubectl get resourceclaims
        # -l inference.rocm.dev/inference-service=NAME` finds them.
        "metadata": {"labels": standard_labels(owner)},
        "spec": {"devices": {"requests": [{"name": CLAIM_NAME, "exactly": request}]}},
    }


def needs_claim_template(owner: Owner) -> bool:
    gpus = plan(owner.spec.resources.gpu, owner.gpu_defaults)
    return gpus.count > 0 and gpus.allocation == GpuAllocation.DRA


def build_resource_claim_template(owner: Owner) -> JsonObject:
    """The ResourceClaimTemplate the pods of a DRA-allocated service reference (same name)."""
    return {
        **RESOURCE_CLAIM_TEMPLATE.header(),
        "metadata": object_meta(owner),
        "spec": claim_template_spec(owner),
    }


def gpu_wiring(owner: Owner) -> GpuWiring:
    """Everything the pod needs for its GPUs; empty for a CPU-only service."""
    gpu = owner.spec.resources.gpu
    gpus = plan(gpu, owner.gpu_defaults)
    if gpus.count == 0:
        return GpuWiring()
    env = visible_devices_env(gpu)
    tolerations = [GPU_TAINT_TOLERATION]
    groups = list(gpus.supplemental_groups)
    if gpus.allocation == GpuAllocation.DRA:
        # A template's spec cannot change; a new one under the same name must roll the pods,
        # whose own template would otherwise be unchanged.
        digest = hashlib.sha256(json.dumps(claim_template_spec(owner), sort_keys=True).encode()).hexdigest()[:16]
        return GpuWiring(
            claims=[{"name": CLAIM_NAME}],
            pod_claims=[{"name": CLAIM_NAME, "resourceClaimTemplateName": owner.name}],
            env=env,
            tolerations=tolerations,
            supplemental_groups=groups,
            annotations={CLAIM_HASH_ANNOTATION: digest},
        )
    return GpuWiring(
        resources={resource_name(gpu, gpus.resource_naming): str(gpus.count)},
        env=env,
        affinity=node_affinity(gpu, gpus.resource_naming),
        tolerations=tolerations,
        supplemental_groups=groups,
    )


def gpu_view(objects: list[JsonObject]) -> list[JsonObject]:
    """What each model-server pod among rendered `objects` gets for its GPUs, one entry per
    Deployment: extended resources or claims, the claim template, env, placement, groups, devices."""
    templates = {o["metadata"]["name"]: o for o in objects if o["kind"] == RESOURCE_CLAIM_TEMPLATE.kind}
    return [_pod_gpu_view(o, templates) for o in objects if o["kind"] == DEPLOYMENT.kind]


def _pod_gpu_view(deployment: JsonObject, templates: dict[str, JsonObject]) -> JsonObject:
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    resources = container["resources"]
    extended = {k: v for k, v in resources.get("limits", {}).items() if k.startswith(f"{RESOURCE_DOMAIN}/")}
    view: JsonObject = {"name": deployment["metadata"]["name"]}
    if extended:
        view["resources"] = {"requests": dict(extended), "limits": dict(extended)}
    claims = pod.get("resourceClaims")
    if claims:
        view |= _claims_view(claims, resources, templates)
    env = {e["name"]: e["value"] for e in container.get("env", []) if e["name"].endswith("_VISIBLE_DEVICES")}
    if env:
        view["env"] = env
    view |= {key: pod[key] for key in ("affinity", "tolerations") if key in pod}
    if groups := pod["securityContext"].get("supplementalGroups"):
        view["supplementalGroups"] = groups
    view["devices"] = _devices(bool(extended), bool(claims))
    return view


def _claims_view(claims: list[JsonObject], resources: JsonObject, templates: dict[str, JsonObject]) -> JsonObject:
    view = {"resourceClaims": claims, "containerClaims": resources.get("claims", [])}
    for claim in claims:
        template = templates.get(claim.get("resourceClaimTemplateName", ""))
        if template is not None:
            view["resourceClaimTemplate"] = template["spec"]["spec"]
    return view


def _devices(extended: bool, claims: bool) -> str:
    if not (extended or claims):
        return "none (CPU only)"
    allocator = "the DRA driver (CDI)" if claims else "the device plugin"
    return f"/dev/kfd and the /dev/dri/renderD* of the allocated GPUs, mapped in by {allocator}"

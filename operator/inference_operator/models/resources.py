"""What a replica gets: AMD GPUs (or partitions) and how they are allocated, CPU, memory, and
where it is scheduled."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .names import LABEL_KEY_PATTERN, LABEL_VALUE_PATTERN, DnsSubdomain, Quantity

GPU_RESOURCE = "amd.com/gpu"
# The AMD DRA driver's DeviceClass (ROCm/k8s-gpu-dra-driver, GPU Operator 1.5+).
DRA_DEVICE_CLASS = "gpu.amd.com"
# Compute x memory partition modes as the device plugin and the DRA driver name them (the
# lower-cased sysfs current_compute_partition and current_memory_partition joined by "_").
PARTITION_PATTERN = r"^(spx|dpx|tpx|qpx|cpx)_(nps1|nps2|nps4|nps8)$"
# A GPU node label's value as AMD's node labeller writes it (product name, family).
NodeLabelValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=63)]


class GpuAllocation(StrEnum):
    """How a pod gets its GPUs: the device plugin's extended resource, or a DRA ResourceClaim."""

    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class ResourceNaming(StrEnum):
    """The device plugin's --resource_naming_strategy: `single` advertises every GPU and partition
    as amd.com/gpu; `mixed` advertises partitions as amd.com/<compute>_<memory>."""

    SINGLE = "single"
    MIXED = "mixed"


_DEVICES = "self.visibleDevices.split(',')"


class GpuSpec(SpecModel):
    """AMD GPUs (or GPU partitions) per replica: how many, how they are allocated (device plugin or
    DRA), which models, families, memory sizes and partition modes may serve, and the order the
    server sees them in."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.count) || self.count > 0"
                " || !(has(self.productName) || has(self.family) || has(self.vram) || has(self.partition))",
                "GPU placement fields are set but resources.gpu.count is 0",
            ),
            cel(
                f"!has(self.visibleDevices) || !has(self.count) || size({_DEVICES}) == self.count",
                "resources.gpu.visibleDevices must list exactly resources.gpu.count devices",
                ".visibleDevices",
            ),
            cel(
                f"!has(self.visibleDevices) || !has(self.count) || {_DEVICES}.all(d, int(d) < self.count)",
                "resources.gpu.visibleDevices may only name devices 0 to resources.gpu.count-1 (indices within the "
                "pod's own GPUs)",
                ".visibleDevices",
            ),
            cel(
                f"!has(self.visibleDevices) || {_DEVICES}.all(d, {_DEVICES}.exists_one(e, int(e) == int(d)))",
                "resources.gpu.visibleDevices must not name a device twice",
                ".visibleDevices",
            ),
        )
    )

    count: int = Field(
        1,
        ge=0,
        le=16,
        description="GPUs (or GPU partitions) per replica: amd.com/gpu, amd.com/<partition> under mixed naming, "
        "or the count of a DRA claim; 0 runs on CPU. With nodes > 1: per node.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="vllm: nodes one replica spans. Above 1 each replica is a LeaderWorkerSet group of this many "
        "pods (leaderworkerset.x-k8s.io/v1): tensor parallel over count GPUs within a node, pipeline parallel "
        "across nodes, the leader serving the API; autoscaling adds and removes whole groups.",
    )
    allocation: GpuAllocation | None = Field(
        None,
        description="devicePlugin asks for an extended resource; dra for a ResourceClaim of deviceClassName "
        "(resource.k8s.io/v1, Kubernetes 1.34+). Unset: the operator's default (chart value gpu.allocation).",
    )
    resource_naming: ResourceNaming | None = Field(
        None,
        description="The device plugin's resource naming strategy on the cluster: mixed turns partition into "
        "the resource amd.com/<partition>. Unset: the operator's default (chart value gpu.resourceNaming).",
    )
    device_class_name: DnsSubdomain = Field(
        DRA_DEVICE_CLASS,
        description="DeviceClass of the DRA claim (allocation dra).",
    )
    product_name: NodeLabelValue | None = Field(
        None,
        description="Product name, e.g. AMD_Instinct_MI300X_OAM: node label amd.com/gpu.product-name, or the "
        "DRA attribute productName.",
    )
    family: NodeLabelValue | None = Field(
        None,
        description="GPU family, e.g. AI: node label amd.com/gpu.family, or the DRA attribute family.",
    )
    vram: str | None = Field(
        None,
        pattern=r"^[0-9]+[GM]$",
        max_length=16,
        description="Memory per GPU or partition, e.g. 192G: node label amd.com/gpu.vram, or the DRA capacity "
        "memory rounded the same way.",
    )
    partition: str | None = Field(
        None,
        pattern=PARTITION_PATTERN,
        max_length=32,
        description="Compute and memory partition mode, e.g. cpx_nps4: the resource amd.com/<partition> under "
        "mixed naming, the node label amd.com/gpu.compute-memory-partition under single naming, or the DRA "
        "attribute partitionProfile.",
    )
    visible_devices: str | None = Field(
        None,
        pattern=r"^[0-9]+(,[0-9]+)*$",
        max_length=64,
        description="Order of the pod's GPUs for ROCR_VISIBLE_DEVICES, a permutation of 0..count-1 (the default); "
        "HIP_VISIBLE_DEVICES is always 0..count-1 of those.",
    )
    supplemental_groups: list[Annotated[int, Field(ge=1, le=4294967295)]] | None = Field(
        None,
        max_length=8,
        description="Pod supplemental groups that may open /dev/kfd and /dev/dri/renderD* (the host's video and "
        "render GIDs); never 0, and only those the platform allows (chart value policy.supplementalGroups). Unset: "
        "the operator's default (chart value gpu.supplementalGroups).",
    )


class ResourcesSpec(SpecModel):
    """What one replica gets: its AMD GPUs, CPU and memory (requests equal to limits: Guaranteed
    QoS), and its shared memory."""

    gpu: GpuSpec = Field(default_factory=GpuSpec)
    cpu: Quantity = Field(
        "4",
        description="CPU of the serving container, a Kubernetes quantity (4, 500m), requested and limited alike; "
        "the model server sizes its runtime's thread pools by it.",
    )
    memory: Quantity = Field(
        "16Gi",
        description="Memory of the serving container, a Kubernetes quantity (16Gi), requested and limited alike "
        "(past it the container is OOM-killed); the model-fetch init container never gets more than it.",
    )
    shm_size: Quantity = Field(
        "8Gi",
        description="Size of the memory-backed /dev/shm (ROCm's and PyTorch's inter-process buffers); counted "
        "against the pod's memory.",
    )


LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class SchedulingSpec(SpecModel):
    """Where and as whom the model server's pods run: node selection, priority and service account.
    The GPU placement of resources.gpu (node affinity, tolerations) is added by the operator."""

    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels a pod's node must have (the pod's nodeSelector), besides the GPU labels "
        "resources.gpu asks for.",
        json_schema_extra=cel(
            "self.all(k, size(k) <= 317 && k.matches('" + LABEL_KEY_PATTERN.replace("\\", "\\\\") + "'))",
            "scheduling.nodeSelector keys must be valid label keys",
        ),
    )
    priority_class_name: DnsSubdomain | None = Field(
        None,
        description="PriorityClass of the pods (scheduling order and preemption); the cluster's default when unset.",
    )
    service_account_name: DnsSubdomain | None = Field(
        None,
        description="ServiceAccount the pods run as; the namespace's default when unset. Its API token is mounted "
        "only with automountServiceAccountToken.",
    )
    automount_service_account_token: bool = Field(
        False,
        description="Mount the service account's API token in the model-server pods; off, since the server "
        "needs no Kubernetes API.",
    )

"""InferenceService → apps/v1 Deployment of the engine's pods on AMD GPUs.

The pod every engine shares is built here (model storage, GPUs, security, adapters, labels); the
engine adds its part (`ServingEngine.pod`: its serving container and sidecars, from the
`ServiceValues` and `SharedPod` values built here) and says how long the pod may take to stop.
"""

from __future__ import annotations

from ..engines.base import ServiceValues, SharedPod, TraceExport
from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT
from ..models import AutoscalingMode, InferenceServiceSpec
from .adapters import adapter_volumes, adapters_sidecar, lora_enabled, lora_wiring
from .canary import STABLE, TRACK_LABEL, labels_stable_pods
from .common import Owner, engine_of, engine_port, metrics_port, object_meta, selector_labels, standard_labels
from .compile_cache import compile_cache
from .gpu import GpuWiring, gpu_wiring
from .storage import MODEL_DIR, TERMINATION_LOG, model_storage
from .tracing import resource_env

RUN_AS_USER = 1000


def desired_replicas(spec: InferenceServiceSpec) -> int | None:
    """Replicas the Deployment should run; None when an HPA or KEDA owns the count. Zero asked
    for with scaleToZero is zero, whatever the floor while it serves (a P/D role's minReplicas)."""
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    if scaling.mode != AutoscalingMode.BUILTIN:
        return None
    if scaling.scale_to_zero is not None and spec.replicas == 0:
        return 0
    return min(max(spec.replicas, scaling.min_replicas), scaling.max_replicas)


def _env(spec: InferenceServiceSpec, gpus: GpuWiring) -> list[JsonObject]:
    env = dict(gpus.env)
    for var in spec.runtime.env:  # never one the operator sets: the schema refuses those
        env[var.name] = var.value
    return [{"name": k, "value": v} for k, v in env.items()]


def _resources(spec: InferenceServiceSpec, gpus: GpuWiring) -> JsonObject:
    res = spec.resources
    # requests == limits: Guaranteed QoS, so latency does not depend on the neighbours.
    amounts = {"cpu": res.cpu, "memory": res.memory, **gpus.resources}
    resources: JsonObject = {"requests": dict(amounts), "limits": dict(amounts)}
    if gpus.claims:
        resources["claims"] = list(gpus.claims)
    return resources


def _container_security() -> JsonObject:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_labels(owner: Owner) -> dict[str, str]:
    """The pods' labels; `track: stable` where a route's weights address the stable arm alone."""
    labels = standard_labels(owner)
    if labels_stable_pods(owner):
        labels[TRACK_LABEL] = STABLE
    return labels


def service_values(owner: Owner) -> ServiceValues:
    """The service as its engine reads it: the spec's fields and the operator's images, as values."""
    spec = owner.spec
    runtime, batching, tracing = spec.runtime, spec.runtime.batching, spec.runtime.tracing
    return ServiceValues(
        model_name=owner.model_name,
        model_format=spec.model.format.value,
        model_version=spec.model.version,
        image=owner.image,
        image_pull_policy=runtime.image_pull_policy,
        sidecar_image=owner.fetcher_image,
        port=runtime.port,
        metrics_port=runtime.metrics_port,
        grpc_port=runtime.grpc_port,
        execution_providers=tuple(p.value for p in runtime.execution_providers),
        max_batch_size=batching.max_batch_size,
        max_delay_ms=batching.max_delay_ms,
        max_queue=batching.max_queue,
        max_model_len=runtime.max_model_len,
        startup_timeout_seconds=runtime.startup_timeout_seconds,
        tracing=None if tracing is None else TraceExport(tracing.endpoint, tracing.sampling_ratio),
        args=tuple(runtime.args),
        cpu=spec.resources.cpu,
        gpus=spec.resources.gpu.count,
        behind_router=spec.routing.router is not None,
    )


def shared_pod(owner: Owner, gpus: GpuWiring | None = None, model_mount: JsonObject | None = None) -> SharedPod:
    """What the engine's part of the pod is made from: the same for every engine. `gpus` and
    `model_mount` when the caller has them already."""
    spec = owner.spec
    gpus = gpu_wiring(owner) if gpus is None else gpus
    if model_mount is None:
        model_mount = model_storage(owner, _env(spec, GpuWiring()), _container_security()).mount
    return SharedPod(
        env=_env(spec, gpus),
        resources=_resources(spec, gpus),
        mounts=[model_mount, {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
        security=_container_security(),
        model_dir=MODEL_DIR,
        termination_log=TERMINATION_LOG,
        compile_cache=compile_cache(owner, engine_of(owner).compile_cache),
        trace_env=resource_env(owner),
        engine_port=engine_port(spec),
        lora=lora_wiring(spec),
    )


def build_deployment(owner: Owner) -> JsonObject:
    spec = owner.spec
    gpus = gpu_wiring(owner)
    fetch_env = _env(spec, GpuWiring())  # the init container gets no GPU
    storage = model_storage(owner, fetch_env, _container_security())
    volumes = storage.volumes + [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    init_containers = storage.init_containers
    if lora_enabled(spec):
        volumes += adapter_volumes(owner)
        init_containers = [*init_containers, adapters_sidecar(owner, fetch_env, _container_security())]
    engine = engine_of(owner)
    part = engine.pod(service_values(owner), shared_pod(owner, gpus, storage.mount))
    container = part.container
    init_containers = [*init_containers, *part.sidecars]
    container["securityContext"] = _container_security()
    pod_security: JsonObject = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if gpus.supplemental_groups:
        pod_security["supplementalGroups"] = list(gpus.supplemental_groups)
    pod_spec: JsonObject = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security,
        "enableServiceLinks": False,
        "automountServiceAccountToken": spec.scheduling.automount_service_account_token,
        "terminationGracePeriodSeconds": engine.termination_grace_seconds,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if gpus.pod_claims:
        pod_spec["resourceClaims"] = list(gpus.pod_claims)
    if gpus.tolerations:
        pod_spec["tolerations"] = list(gpus.tolerations)
    if gpus.affinity:
        pod_spec["affinity"] = gpus.affinity
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.service_account_name:
        pod_spec["serviceAccountName"] = scheduling.service_account_name

    deployment_spec: JsonObject = {
        "selector": {"matchLabels": selector_labels(owner)},
        # Never take a serving replica down before its replacement is ready.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "revisionHistoryLimit": 5,
        "template": {
            "metadata": {
                "labels": pod_labels(owner),
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(metrics_port(owner)),
                    "prometheus.io/path": "/metrics",
                    **gpus.annotations,
                },
            },
            "spec": pod_spec,
        },
    }
    replicas = desired_replicas(spec)
    if replicas is not None:
        deployment_spec["replicas"] = replicas
    return {
        **DEPLOYMENT.header(),
        "metadata": object_meta(owner),
        "spec": deployment_spec,
    }

"""InferenceService → apps/v1 Deployment of model-server pods on AMD GPUs."""

from __future__ import annotations

import math

from ..models import GPU_RESOURCE, AutoscalingMode, InferenceServiceSpec
from .common import Owner, object_meta, selector_labels, standard_labels

CONTAINER = "model-server"
MODEL_DIR = "/mnt/models"
MODEL_VOLUME = "model-store"
# Host groups that own /dev/kfd and /dev/dri/renderD* on common ROCm hosts (video, render):
# the device plugin maps the devices in, these let a non-root process open them.
GPU_GROUPS = [44, 109]
RUN_AS_USER = 1000
GPU_TAINT_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# AMD GPU node labeller labels, keyed by the GpuSpec field that selects on them.
GPU_NODE_LABELS = {
    "product_name": "amd.com/gpu.product-name",
    "family": "amd.com/gpu.family",
    "vram": "amd.com/gpu.vram",
    "partition": "amd.com/compute-memory-partition",
}
PROBE_PERIOD_SECONDS = 10
# SIGTERM → the server keeps answering (unready) while endpoints catch up, then drains; both
# fit inside the grace period, so the kubelet never kills a pod with requests in flight.
SHUTDOWN_DELAY_SECONDS = 5
DRAIN_TIMEOUT_SECONDS = 45
TERMINATION_GRACE_SECONDS = 60


def desired_replicas(spec: InferenceServiceSpec) -> int | None:
    """Replicas the Deployment should run; None when an HPA or KEDA owns the count."""
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    if scaling.mode != AutoscalingMode.BUILTIN:
        return None
    return min(max(spec.replicas, scaling.min_replicas), scaling.max_replicas)


def visible_devices(spec: InferenceServiceSpec) -> str:
    gpu = spec.resources.gpu
    return gpu.visible_devices or ",".join(str(i) for i in range(gpu.count))


def server_args(owner: Owner) -> list[str]:
    """The model-server command line that realises the spec (flags of `model_server serve`)."""
    spec = owner.spec
    runtime, batching = spec.runtime, spec.runtime.batching
    args = [
        "serve",
        "--model",
        MODEL_DIR,
        "--model-name",
        owner.model_name,
        "--format",
        spec.model.format.value,
        "--port",
        str(runtime.port),
        "--metrics-port",
        str(runtime.metrics_port),
        "--providers",
        ",".join(p.value for p in runtime.execution_providers),
        "--max-batch-size",
        str(batching.max_batch_size),
        "--max-delay-ms",
        _number(batching.max_delay_ms),
        "--max-queue",
        str(batching.max_queue),
        "--shutdown-delay",
        str(SHUTDOWN_DELAY_SECONDS),
        "--drain-timeout",
        str(DRAIN_TIMEOUT_SECONDS),
    ]
    if spec.model.version:
        args += ["--model-version", spec.model.version]
    return args + list(runtime.args)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _env(spec: InferenceServiceSpec) -> list[dict]:
    env: dict[str, str] = {}
    if spec.resources.gpu.count:
        devices = visible_devices(spec)
        env["ROCR_VISIBLE_DEVICES"] = devices
        env["HIP_VISIBLE_DEVICES"] = devices
    for var in spec.runtime.env:  # the user's values win over ours
        env[var.name] = var.value
    return [{"name": k, "value": v} for k, v in env.items()]


def _resources(spec: InferenceServiceSpec) -> dict:
    res = spec.resources
    # requests == limits: Guaranteed QoS, so latency does not depend on the neighbours.
    amounts = {"cpu": res.cpu, "memory": res.memory}
    if res.gpu.count:
        amounts[GPU_RESOURCE] = str(res.gpu.count)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _http_probe(path: str, period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _model_storage(spec: InferenceServiceSpec, image: str) -> tuple[list[dict], list[dict]]:
    """Volumes and init containers that put the model at MODEL_DIR, by URI scheme."""
    uri = spec.model.uri
    scheme, rest = uri.split("://", 1)
    if scheme == "pvc":
        claim, _, sub_path = rest.partition("/")
        volume = {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return [volume], []
    volume = {"name": MODEL_VOLUME, "emptyDir": {}}
    mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR}
    init: dict[str, object]
    if scheme == "oci":
        # A "modelcar" image: the model lives under /models of the image named by the URI.
        init = {
            "name": "model-fetch",
            "image": rest,
            "command": ["sh", "-c", f"cp -R /models/. {MODEL_DIR}/"],
        }
    else:
        command = ["python", "-m", "model_server.storage", uri, MODEL_DIR]
        if spec.model.sha256:  # checked before the file is renamed into place
            command += ["--sha256", spec.model.sha256]
        init = {"name": "model-fetch", "image": image, "command": command}
    init |= {
        "volumeMounts": [mount],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
        "securityContext": _container_security(),
        "env": [e for e in _env(spec) if not e["name"].endswith("VISIBLE_DEVICES")],
    }
    return [volume], [init]


def _container_security() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _affinity(spec: InferenceServiceSpec) -> dict | None:
    gpu = spec.resources.gpu
    expressions = [
        {"key": label, "operator": "In", "values": [getattr(gpu, field)]}
        for field, label in GPU_NODE_LABELS.items()
        if getattr(gpu, field)
    ]
    if not expressions:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }


def build_deployment(owner: Owner) -> dict:
    spec = owner.spec
    runtime = spec.runtime
    gpus = spec.resources.gpu.count
    volumes, init_containers = _model_storage(spec, runtime.image)
    sub_path = spec.model.uri.split("://", 1)[1].partition("/")[2] if spec.model.scheme == "pvc" else ""
    model_mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
    if sub_path:
        model_mount["subPath"] = sub_path
    volumes += [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    container = {
        "name": CONTAINER,
        "image": runtime.image,
        "imagePullPolicy": runtime.image_pull_policy,
        "command": ["python", "-m", "model_server"],
        "args": server_args(owner),
        "ports": [
            {"name": "http", "containerPort": runtime.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": runtime.metrics_port, "protocol": "TCP"},
        ],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": [
            model_mount,
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "startupProbe": _http_probe(
            "/health/ready",
            PROBE_PERIOD_SECONDS,
            math.ceil(runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "livenessProbe": _http_probe("/health/live", 10, 3),
        "readinessProbe": _http_probe("/health/ready", 5, 2),
        "securityContext": _container_security(),
    }
    pod_security: dict = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if gpus:
        pod_security["supplementalGroups"] = GPU_GROUPS
    pod_spec: dict = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security,
        "enableServiceLinks": False,
        "automountServiceAccountToken": spec.scheduling.automount_service_account_token,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if gpus:
        pod_spec["tolerations"] = [GPU_TAINT_TOLERATION]
    if affinity := _affinity(spec):
        pod_spec["affinity"] = affinity
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.service_account_name:
        pod_spec["serviceAccountName"] = scheduling.service_account_name

    deployment_spec: dict = {
        "selector": {"matchLabels": selector_labels(owner)},
        # Never take a serving replica down before its replacement is ready.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "revisionHistoryLimit": 5,
        "template": {
            "metadata": {
                "labels": standard_labels(owner),
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(runtime.metrics_port),
                    "prometheus.io/path": "/metrics",
                },
            },
            "spec": pod_spec,
        },
    }
    replicas = desired_replicas(spec)
    if replicas is not None:
        deployment_spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner),
        "spec": deployment_spec,
    }

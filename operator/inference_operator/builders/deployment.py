"""InferenceService → apps/v1 Deployment of model-server (or vLLM) pods on AMD GPUs."""

from __future__ import annotations

import math

from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT
from ..models import AutoscalingMode, Engine, InferenceServiceSpec
from .adapters import adapter_volumes, adapters_sidecar, lora_enabled
from .canary import STABLE, TRACK_LABEL, labels_stable_pods
from .common import Owner, object_meta, selector_labels, standard_labels
from .compile_cache import MIGRAPHX, MIOPEN, CompileCache, compile_cache
from .gpu import GpuWiring, gpu_wiring
from .storage import MODEL_DIR, TERMINATION_LOG, model_storage
from .tracing import resource_env
from .vllm import VLLM_TERMINATION_GRACE_SECONDS, front_container, vllm_container

CONTAINER = "model-server"
# What the server compiles (compile_cache.py): on the cache claim, or in the pod's /tmp volume.
COMPILE_CACHE_DIR = "/var/cache/model-server"
COMPILE_CACHE_PREFIX = "model-server-cache"
POD_COMPILE_CACHE_DIR = "/tmp/model-server-cache"
RUN_AS_USER = 1000
PROBE_PERIOD_SECONDS = 10
# SIGTERM → the server keeps answering (unready) while endpoints catch up, then drains; both
# fit inside the grace period, so the kubelet never kills a pod with requests in flight. The
# grace period is no longer than that: the namespace controller waits out the longest grace
# period of a namespace's pods before it looks again, so every spare second of it is a second
# longer for every namespace deletion (60 s made it 47 s with pods that stop in 6).
SHUTDOWN_DELAY_SECONDS = 5
DRAIN_TIMEOUT_SECONDS = 20
# The process's own exit after the drain (runtimes released, uvicorn closed).
EXIT_MARGIN_SECONDS = 5
TERMINATION_GRACE_SECONDS = SHUTDOWN_DELAY_SECONDS + DRAIN_TIMEOUT_SECONDS + EXIT_MARGIN_SECONDS


def desired_replicas(spec: InferenceServiceSpec) -> int | None:
    """Replicas the Deployment should run; None when an HPA or KEDA owns the count."""
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    if scaling.mode != AutoscalingMode.BUILTIN:
        return None
    return min(max(spec.replicas, scaling.min_replicas), scaling.max_replicas)


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
        *(["--grpc-port", str(runtime.grpc_port)] if runtime.grpc_port is not None else []),
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
    if runtime.tracing is not None:
        args += [
            "--otlp-traces-endpoint",
            runtime.tracing.endpoint,
            "--trace-sample-ratio",
            _number(runtime.tracing.sampling_ratio),
        ]
    return args + list(runtime.args)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


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


def _http_probe(path: str, period: int, failures: int) -> JsonObject:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _container_security() -> JsonObject:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def model_server_compile_cache(owner: Owner) -> CompileCache:
    """ROCm's compile caches for the model server (MIGraphX programs, MIOpen), in its cache
    directory: see compile_cache.py. The server makes the directories at start."""
    return compile_cache(owner, COMPILE_CACHE_DIR, COMPILE_CACHE_PREFIX, POD_COMPILE_CACHE_DIR, MIGRAPHX | MIOPEN)


def _model_server_container(
    owner: Owner, env: list[JsonObject], resources: JsonObject, mounts: list[JsonObject]
) -> JsonObject:
    runtime = owner.spec.runtime
    cache = model_server_compile_cache(owner)
    return {
        "name": CONTAINER,
        "image": owner.image,
        "imagePullPolicy": runtime.image_pull_policy,
        "command": ["python", "-m", "model_server"],
        "args": server_args(owner),
        "ports": [
            {"name": "http", "containerPort": runtime.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": runtime.metrics_port, "protocol": "TCP"},
            *([{"name": "grpc", "containerPort": runtime.grpc_port, "protocol": "TCP"}] if runtime.grpc_port else []),
        ],
        "env": env + [e for e in cache.env if e["name"] not in {v["name"] for v in env}] + resource_env(owner),
        "resources": resources,
        "volumeMounts": mounts + cache.mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "startupProbe": _http_probe(
            "/health/ready",
            PROBE_PERIOD_SECONDS,
            math.ceil(runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "livenessProbe": _http_probe("/health/live", 10, 3),
        "readinessProbe": _http_probe("/health/ready", 5, 2),
    }


def metrics_port(owner: Owner) -> int:
    """The container port Prometheus scrapes: vLLM serves /metrics on its API port."""
    runtime = owner.spec.runtime
    return runtime.port if runtime.engine == Engine.VLLM else runtime.metrics_port


def pod_labels(owner: Owner) -> dict[str, str]:
    """The pods' labels; `track: stable` where a route's weights address the stable arm alone."""
    labels = standard_labels(owner)
    if labels_stable_pods(owner):
        labels[TRACK_LABEL] = STABLE
    return labels


def build_deployment(owner: Owner) -> JsonObject:
    spec = owner.spec
    runtime = spec.runtime
    gpus = gpu_wiring(owner)
    env = _env(spec, gpus)
    fetch_env = _env(spec, GpuWiring())  # the init container gets no GPU
    storage = model_storage(owner, fetch_env, _container_security())
    volumes = storage.volumes + [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    init_containers = storage.init_containers
    mounts = [
        storage.mount,
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if lora_enabled(spec):
        volumes += adapter_volumes(owner)
        init_containers = [*init_containers, adapters_sidecar(owner, fetch_env, _container_security())]
    if runtime.engine == Engine.VLLM:
        container = vllm_container(owner, MODEL_DIR, env, _resources(spec, gpus), mounts)
        init_containers = [*init_containers, front_container(owner, _container_security())]
    else:
        container = _model_server_container(owner, env, _resources(spec, gpus), mounts)
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
        "terminationGracePeriodSeconds": (
            VLLM_TERMINATION_GRACE_SECONDS if runtime.engine == Engine.VLLM else TERMINATION_GRACE_SECONDS
        ),
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

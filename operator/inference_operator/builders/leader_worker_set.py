"""resources.gpu.nodes > 1 → a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): one replica of
the model is a group of `nodes` pods, created, scaled, updated and restarted together.

Each pod is the single-node pod (`build_deployment`'s template: the same model fetch, GPUs,
security and volumes) with vLLM's multi-node flags added: tensor parallel over the node's
`resources.gpu.count` GPUs, pipeline parallel across the `nodes` pods, and vLLM's own
multiprocessing bootstrap between them (`--nnodes`, `--node-rank`, `--master-addr`), so no Ray
cluster is needed. The leader (index 0) serves the OpenAI API and is the Service's and the
InferencePool's only endpoint; the workers run `vllm serve --headless`, which serves nothing and
so has no HTTP probes. LWS gives every container `LWS_LEADER_ADDRESS` and `LWS_WORKER_INDEX`,
which the kubelet expands in the arguments. A failed pod restarts its whole group
(RecreateGroupOnPodRestart): a pipeline with a stage missing serves nothing. Rolling updates
surge a whole new group before an old one goes, as the Deployment does with pods.
"""

from __future__ import annotations

import copy

from ..jsontypes import JsonObject
from ..kinds import LEADER_WORKER_SET
from .common import MASTER_PORT, Owner, object_meta
from .deployment import build_deployment, desired_replicas
from .vllm import CONTAINER, FRONT, under_init

# vLLM's entry point for a headless node: the CLI (`vllm serve --headless`); the API server
# module the leader runs has no headless mode.
WORKER_COMMAND = under_init(["python3", "-m", "vllm.entrypoints.cli.main", "serve"])


def multi_node_args(owner: Owner, rank: str) -> list[str]:
    nodes = owner.spec.resources.gpu.nodes
    return [
        f"--pipeline-parallel-size={nodes}",
        "--distributed-executor-backend=mp",
        f"--nnodes={nodes}",
        f"--node-rank={rank}",
        "--master-addr=$(LWS_LEADER_ADDRESS)",
        f"--master-port={MASTER_PORT}",
    ]


def _vllm(template: JsonObject) -> JsonObject:
    container: JsonObject = next(c for c in template["spec"]["containers"] if c["name"] == CONTAINER)
    return container


def leader_template(owner: Owner, template: JsonObject) -> JsonObject:
    leader = copy.deepcopy(template)
    vllm = _vllm(leader)
    vllm["args"] = [*vllm["args"], *multi_node_args(owner, "0")]
    vllm["ports"] = [*vllm["ports"], {"name": "dist", "containerPort": MASTER_PORT, "protocol": "TCP"}]
    return leader


def worker_template(owner: Owner, template: JsonObject) -> JsonObject:
    worker = copy.deepcopy(template)
    vllm = _vllm(worker)
    vllm["command"] = list(WORKER_COMMAND)
    vllm["args"] = [*vllm["args"], *multi_node_args(owner, "$(LWS_WORKER_INDEX)"), "--headless"]
    vllm["ports"] = []  # serves nothing: the leader answers for the group
    for probe in ("startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
        vllm.pop(probe, None)
    worker["spec"]["initContainers"] = [c for c in worker["spec"].get("initContainers", []) if c["name"] != FRONT]
    # Prometheus scrapes the leader, whose metrics cover the group.
    worker["metadata"]["annotations"] = {
        k: v for k, v in worker["metadata"].get("annotations", {}).items() if not k.startswith("prometheus.io/")
    }
    return worker


def build_leader_worker_set(owner: Owner) -> JsonObject:
    deployment = build_deployment(owner)
    template = deployment["spec"]["template"]
    spec: JsonObject = {
        "leaderWorkerTemplate": {
            "size": owner.spec.resources.gpu.nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader_template(owner, template),
            "workerTemplate": worker_template(owner, template),
        },
        # Never take a serving group down before its replacement is ready.
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
        },
        "startupPolicy": "LeaderCreated",
    }
    replicas = desired_replicas(owner.spec)
    if replicas is not None:
        spec["replicas"] = replicas
    return {**LEADER_WORKER_SET.header(), "metadata": object_meta(owner), "spec": spec}

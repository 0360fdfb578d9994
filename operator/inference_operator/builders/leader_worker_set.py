"""resources.gpu.nodes > 1 → a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): one replica of
the model is a group of `nodes` pods, created, scaled, updated and restarted together.

Each pod is the single-node pod (`build_deployment`'s template: the same model fetch, GPUs,
security and volumes) with the engine's multi-node arguments added (`multi_node_args`: for vLLM,
tensor parallel over the node's `resources.gpu.count` GPUs, pipeline parallel across the `nodes`
pods, and vLLM's own multiprocessing bootstrap between them, so no Ray cluster is needed). The
leader (index 0) serves the API and is the Service's and the InferencePool's only endpoint; the
workers run the engine's worker command (`vllm serve --headless`), which serves nothing and
so has no HTTP probes. LWS gives every container `LWS_LEADER_ADDRESS` and `LWS_WORKER_INDEX`,
which the kubelet expands in the arguments. A failed pod restarts its whole group
(RecreateGroupOnPodRestart): a pipeline with a stage missing serves nothing. Rolling updates
surge a whole new group before an old one goes, as the Deployment does with pods.
"""

from __future__ import annotations

import copy

from ..jsontypes import JsonObject
from ..kinds import LEADER_WORKER_SET
from .common import MASTER_PORT, Owner, engine_of, object_meta
from .deployment import build_deployment, desired_replicas

# LWS gives every container the leader's address, which the kubelet expands in the arguments.
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"


def multi_node_args(owner: Owner, rank: str) -> list[str]:
    return engine_of(owner).multi_node_args(owner.spec.resources.gpu.nodes, rank, LEADER_ADDRESS, MASTER_PORT)


def _serving(owner: Owner, template: JsonObject) -> JsonObject:
    name = engine_of(owner).container
    container: JsonObject = next(c for c in template["spec"]["containers"] if c["name"] == name)
    return container


def leader_template(owner: Owner, template: JsonObject) -> JsonObject:
    leader = copy.deepcopy(template)
    serving = _serving(owner, leader)
    serving["args"] = [*serving["args"], *multi_node_args(owner, "0")]
    serving["ports"] = [*serving["ports"], {"name": "dist", "containerPort": MASTER_PORT, "protocol": "TCP"}]
    return leader


def worker_template(owner: Owner, template: JsonObject) -> JsonObject:
    group = engine_of(owner).group
    assert group is not None, "the engine's pod runs on one node"
    worker = copy.deepcopy(template)
    serving = _serving(owner, worker)
    serving["command"] = list(group.worker_command)
    serving["args"] = [*serving["args"], *multi_node_args(owner, "$(LWS_WORKER_INDEX)"), *group.worker_args]
    serving["ports"] = []  # serves nothing: the leader answers for the group
    for probe in ("startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
        serving.pop(probe, None)
    worker["spec"]["initContainers"] = [
        c for c in worker["spec"].get("initContainers", []) if c["name"] not in group.leader_only_sidecars
    ]
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

"""resources.gpu.nodes > 1: a LeaderWorkerSet instead of a Deployment, the leader as the only
endpoint, scaling by groups, rollout read by groups, and the CRD's refusals."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from inference_operator import status as st
from inference_operator.builders.common import LWS_WORKER_INDEX_LABEL
from inference_operator.builders.leader_worker_set import MASTER_PORT
from inference_operator.engines.vllm import COMMAND, WORKER_COMMAND
from inference_operator.validation import validate_custom_resource
from tests.llm.test_lora_builders import objects, resource
from tests.llm.test_vllm_builders import vllm_spec
from testsupport.crd import addon_errors


def multi_node_spec(nodes: int = 2, **extra: object) -> dict:
    spec = vllm_spec()
    spec["resources"]["gpu"]["nodes"] = nodes
    return {**spec, **extra}


def pod_template(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}


def test_a_multi_node_replica_is_a_leader_worker_set_group() -> None:
    objs = objects(multi_node_spec(nodes=4))
    assert list(objs) == ["LeaderWorkerSet", "Service"]  # no Deployment
    lws = objs["LeaderWorkerSet"]
    assert addon_errors(lws) == []
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 0, "maxSurge": 1}
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        kubernetes_validate.validate(pod_template(template), "1.33", strict=True)
        (vllm,) = template["spec"]["containers"]
        assert vllm["resources"]["limits"]["amd.com/gpu"] == "4"  # each node's own GPUs
        assert {"--tensor-parallel-size=4", "--pipeline-parallel-size=4", "--nnodes=4"} <= set(vllm["args"])
        assert {"--distributed-executor-backend=mp", "--master-addr=$(LWS_LEADER_ADDRESS)"} <= set(vllm["args"])
        assert f"--master-port={MASTER_PORT}" in vllm["args"]
        assert vllm["volumeMounts"][0]["mountPath"] == "/mnt/models"  # every node loads its own stages
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    assert leader["command"] == COMMAND and "--node-rank=0" in leader["args"] and "readinessProbe" in leader
    assert worker["command"] == WORKER_COMMAND
    assert worker["args"][-1] == "--headless" and "--node-rank=$(LWS_WORKER_INDEX)" in worker["args"]
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(worker) and worker["ports"] == []
    assert "prometheus.io/scrape" not in group["workerTemplate"]["metadata"].get("annotations", {})
    # Only leaders serve: the Service selects them alone.
    assert objs["Service"]["spec"]["selector"][LWS_WORKER_INDEX_LABEL] == "0"


def test_single_node_services_are_unchanged() -> None:
    objs = objects(vllm_spec())
    assert "LeaderWorkerSet" not in objs and LWS_WORKER_INDEX_LABEL not in objs["Service"]["spec"]["selector"]
    (vllm,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith(("--nnodes", "--pipeline-parallel-size")) for a in vllm["args"])


@pytest.mark.parametrize("mode", ["hpa", "keda"])
def test_an_hpa_or_keda_scales_the_groups(mode: str) -> None:
    scaling = {"mode": mode, "minReplicas": 1, "maxReplicas": 3, "metric": "ttftP95Ms", "target": 500}
    objs = objects(multi_node_spec(autoscaling=scaling))
    scaler = objs["HorizontalPodAutoscaler" if mode == "hpa" else "ScaledObject"]
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "llm",
    }
    assert "replicas" not in objs["LeaderWorkerSet"]["spec"]  # the scaler owns the count


def test_the_inference_pool_selects_leaders_only() -> None:
    objs = objects(multi_node_spec(routing={"inferencePool": True, "endpointPicker": {"name": "mine"}}))
    assert objs["InferencePool"]["spec"]["selector"]["matchLabels"][LWS_WORKER_INDEX_LABEL] == "0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["runtime"].update(engine="modelServer"), "nodes above 1 needs runtime.engine vllm"),
        (lambda s: s.update(adapters=[{"name": "a", "uri": "hf://o/a"}]), "does not take a canary rollout or adapters"),
        (
            lambda s: s.update(rollout={"strategy": "canary", "canary": {"analysis": {"maxLatencyMs": 9}}}),
            "does not take a canary rollout or adapters",
        ),
        (lambda s: s["runtime"].update(args=["--pipeline-parallel-size=2"]), "what a multi-node replica sets"),
        (lambda s: s["runtime"].update(args=["--node_rank=1"]), "what a multi-node replica sets"),
        (lambda s: s["runtime"].update(args=["--headl"]), "what a multi-node replica sets"),
        (lambda s: s["resources"]["gpu"].update(nodes=65), "nodes"),
    ],
)
def test_the_crd_refuses_what_a_multi_node_replica_cannot_take(change, message: str) -> None:
    spec = multi_node_spec()
    assert validate_custom_resource(resource(copy.deepcopy(spec))) == []
    change(spec)
    errors = validate_custom_resource(resource(spec))
    assert any(message in error for error in errors), errors


def test_single_node_services_may_still_set_pipeline_parallelism() -> None:
    spec = vllm_spec(args=["--pipeline-parallel-size=2"])
    assert validate_custom_resource(resource(spec)) == []


def lws(generation: int = 2, observed: int = 2, desired: int = 2, **status: object) -> dict:
    return {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {"observedGeneration": observed, **status},
    }


@pytest.mark.parametrize(
    ("obj", "done", "message"),
    [
        (lws(observed=1), False, "waiting for the LeaderWorkerSet controller"),
        (lws(replicas=2, updatedReplicas=1, readyReplicas=2), False, "1 out of 2 new groups have been updated"),
        (lws(replicas=3, updatedReplicas=2, readyReplicas=2), False, "1 old groups are pending termination"),
        (
            lws(updatedReplicas=2, readyReplicas=2, conditions=[{"type": "UpdateInProgress", "status": "True"}]),
            False,
            "2 out of 2 new groups",
        ),
        (lws(updatedReplicas=2, readyReplicas=1, replicas=2), False, "1 of 2 groups are ready"),
        (lws(updatedReplicas=2, readyReplicas=2, replicas=2), True, "successfully rolled out"),
    ],
)
def test_the_rollout_is_read_by_groups(obj: dict, done: bool, message: str) -> None:
    state = st.deployment_rollout(obj)
    assert state.done == done and message in state.message, state

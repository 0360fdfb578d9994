"""Why a service's pods do not serve, read from plain pod objects (status_pods is pure)."""

from __future__ import annotations

import pytest

from inference_operator import status as st
from inference_operator import status_pods
from inference_operator.reasons import Reason
from inference_operator.status_pods import (
    Roles,
    pod_problem_of,
    pods_problem,
    redact,
)

ROLES = Roles(fetch="model-fetch", servers=("model-server", "vllm"))


def pod(
    name: str = "svc-1",
    init: list[dict] | None = None,
    containers: list[dict] | None = None,
    conditions: list[dict] | None = None,
    created: str = "2026-12-04T10:00:00Z",
    phase: str = "Pending",
    **meta: object,
) -> dict:
    return {
        "metadata": {"name": name, "creationTimestamp": created, **meta},
        "spec": {
            "initContainers": [{"name": "model-fetch", "resources": {"limits": {"memory": "1Gi"}}}],
            "containers": [{"name": "model-server", "resources": {"limits": {"memory": "2Gi"}}}],
        },
        "status": {
            "phase": phase,
            "conditions": conditions or [],
            "initContainerStatuses": init or [],
            "containerStatuses": containers or [],
        },
    }


def crashed(name: str, restarts: int = 3, **terminated: object) -> dict:
    return {
        "name": name,
        "ready": False,
        "restartCount": restarts,
        "state": {
            "waiting": {"reason": "CrashLoopBackOff", "message": f"back-off 40s restarting failed container={name}"}
        },
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", **terminated}},
    }


FETCHED = {"name": "model-fetch", "ready": True, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}


def test_a_failed_fetch_says_the_fetchers_own_words() -> None:
    message = "fetch failed (exit 1, source): https://models.example/m.onnx: HTTP 404"
    problem = pod_problem_of(pod(init=[crashed("model-fetch", message=message)]), ROLES)
    assert problem == st.Problem(Reason.MODEL_FETCH_FAILED, f"container model-fetch: {message} (restarted 3 times)")


def test_a_failed_fetch_without_words_points_at_its_logs() -> None:
    problem = pod_problem_of(pod(init=[crashed("model-fetch", restarts=1)]), ROLES)
    assert problem == st.Problem(
        Reason.MODEL_FETCH_FAILED,
        "container model-fetch: the fetch exited with code 1; see kubectl logs -c model-fetch (restarted 1 time)",
    )


def test_a_fetch_that_just_failed_is_reported_before_the_kubelet_restarts_it() -> None:
    status = {"name": "model-fetch", "restartCount": 0, "state": {"terminated": {"exitCode": 6, "message": "deadline"}}}
    assert pod_problem_of(pod(init=[status]), ROLES) == st.Problem(
        Reason.MODEL_FETCH_FAILED, "container model-fetch: deadline"
    )


def test_a_server_that_exits_with_its_reason_failed_to_load_the_model() -> None:
    message = "version 1 failed to load: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Protobuf parsing failed."
    problem = pod_problem_of(pod(init=[FETCHED], containers=[crashed("model-server", message=message)]), ROLES)
    assert problem == st.Problem(Reason.MODEL_LOAD_FAILED, f"container model-server: {message} (restarted 3 times)")


def test_a_restarted_server_not_yet_ready_is_still_failing() -> None:
    restarted = {
        "name": "model-server",
        "ready": False,
        "restartCount": 2,
        "state": {"running": {"startedAt": "2026-12-04T10:01:00Z"}},
        "lastState": {"terminated": {"exitCode": 3, "message": "no model"}},
    }
    problem = pod_problem_of(pod(init=[FETCHED], containers=[restarted]), ROLES)
    assert problem is not None and problem.reason == Reason.MODEL_LOAD_FAILED
    # Once it is ready, the old crash is history.
    assert pod_problem_of(pod(init=[FETCHED], containers=[{**restarted, "ready": True}]), ROLES) is None


def test_a_crash_without_a_reason_is_a_crash_loop() -> None:
    problem = pod_problem_of(pod(init=[FETCHED], containers=[crashed("vllm", restarts=4)]), ROLES)
    assert problem == st.Problem(
        Reason.CRASH_LOOP_BACK_OFF,
        "container vllm exited with code 1 (restarted 4 times); see kubectl logs -c vllm --previous",
    )
    sidecar = crashed("adapters", message="boom")
    assert pod_problem_of(pod(init=[FETCHED, sidecar]), ROLES).reason == Reason.CRASH_LOOP_BACK_OFF  # type: ignore[union-attr]


def test_out_of_memory_names_the_limit() -> None:
    killed = crashed("model-server", restarts=1)
    killed["lastState"]["terminated"] = {"exitCode": 137, "reason": "OOMKilled"}
    problem = pod_problem_of(pod(init=[FETCHED], containers=[killed]), ROLES)
    assert problem == st.Problem(
        Reason.OOM_KILLED, "container model-server ran out of its memory limit of 2Gi and was killed (restarted 1 time)"
    )


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled_is_one_reason(reason: str) -> None:
    waiting = {
        "name": "model-server",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": 'Back-off pulling image "registry.example/server:1"'}},
    }
    problem = pod_problem_of(pod(init=[FETCHED], containers=[waiting]), ROLES)
    assert problem == st.Problem(
        Reason.IMAGE_PULL_BACK_OFF,
        f'container model-server: {reason}: Back-off pulling image "registry.example/server:1"',
    )


def test_a_container_that_cannot_be_created_says_why() -> None:
    waiting = {
        "name": "model-fetch",
        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}},
    }
    problem = pod_problem_of(pod(init=[waiting]), ROLES)
    assert problem == st.Problem(
        Reason.CREATE_CONTAINER_CONFIG_ERROR, 'container model-fetch: CreateContainerConfigError: secret "hf" not found'
    )


def test_unschedulable_carries_the_schedulers_message() -> None:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available.",
    }
    problem = pod_problem_of(pod(conditions=[scheduled]), ROLES)
    assert problem == st.Problem(Reason.UNSCHEDULABLE, scheduled["message"])


def test_starting_and_loading_pods_are_no_problem() -> None:
    running = {"name": "model-fetch", "ready": False, "restartCount": 0, "state": {"running": {}}}
    loading = {"name": "model-server", "ready": False, "restartCount": 0, "state": {"running": {}}}
    initialising = {"name": "model-server", "state": {"waiting": {"reason": "PodInitializing"}}}
    assert pod_problem_of(pod(init=[running], containers=[initialising]), ROLES) is None
    assert pod_problem_of(pod(init=[FETCHED], containers=[loading]), ROLES) is None
    assert pod_problem_of(pod(), ROLES) is None


def test_the_newest_failing_pod_is_named_and_the_others_counted() -> None:
    old = pod("svc-old", init=[crashed("model-fetch", message="old")], created="2026-12-04T09:00:00Z")
    new = pod("svc-new", init=[crashed("model-fetch", message="new")], created="2026-12-04T11:00:00Z")
    gone = pod("svc-gone", init=[crashed("model-fetch")], created="2026-12-04T12:00:00Z", deletionTimestamp="x")
    evicted = pod("svc-evicted", init=[crashed("model-fetch")], created="2026-12-04T12:00:00Z", phase="Failed")
    fine = pod("svc-fine", init=[FETCHED], created="2026-12-04T13:00:00Z")
    problem = pods_problem([old, new, gone, evicted, fine], ROLES)
    assert problem == st.Problem(
        Reason.MODEL_FETCH_FAILED, "pod svc-new: container model-fetch: new (restarted 3 times) (and 1 more pod)"
    )
    assert pods_problem([fine, gone], ROLES) is None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://user:pw@host.example/a/b.onnx?X-Amz-Signature=f00d&x=1#frag: HTTP 403",
         "https://host.example/a/b.onnx: HTTP 403"),
        ("s3://bucket/key?versionId=abc failed", "s3://bucket/key failed"),
        ("Authorization: Bearer eyJhbGciOi.payload.sig rejected", "Authorization: Bearer *** rejected"),
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 refused", "HF_TOKEN=*** refused"),
        ("token hf_abcdefghijklmnopqrstuvwxyz0123 refused", "token *** refused"),
        ("key AKIAABCDEFGHIJKLMNOP denied", "key *** denied"),
        ('{"password": "hunter2", "user": "me"}', '{"password": "***", "user": "me"}'),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key=***"),
        ("blob QWxhZGRpbjpvcGVuIHNlc2FtZQ0KQWxhZGRpbjpvcGVu end", "blob *** end"),
        ("sha256 is " + "ab" * 32 + ", expected x", "sha256 is " + "ab" * 32 + ", expected x"),
        ('image "localhost/rocm-inference/no-such-server:1" is not present',
         'image "localhost/rocm-inference/no-such-server:1" is not present'),
        ("two\nlines\x1b[31m\tand tabs", "two lines [31m and tabs"),
    ],
)  # fmt: skip
def test_redact_keeps_what_helps_and_drops_what_could_be_a_secret(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redact_bounds_the_length() -> None:
    assert redact("x " * 1000, limit=50) == ("x " * 24)[:47] + "..."
    assert len(redact("y" * 10, limit=50)) == 10


# A corpus for `redact`: each secret must not survive, in a message shaped as a container or the
# kubelet would write it.
LEAKS = {
    "bare 40-hex key": "fetch failed: 403 for key 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "key: hex": "key: 5f4dcc3b5aa765d61d8327deb882cf99 rejected",
    "password in words": "login failed: password is hunter2",
    "token in words": "the token was Zq8xV2mN4pL7rT1s",
    "password assignment": "db_password=s3cr3t-Value ok",
    "yaml secret": "secret: opensesame123",
    "api key": 'api_key = "AbC123xYz789"',
    "AWS access key": "AccessDenied for AKIAIOSFODNN7EXAMPLE",
    "AWS secret key": "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "GitHub token": "clone failed with 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",
    "GitLab token": "glpat-xZ8vXq9TkdJmA1bC2dE3 expired",
    "Slack token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "Stripe key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "JWT": "invalid token eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "private key": "-----BEGIN RSA PRIVATE KEY----- MIIEowIBAAKCAQEA",
    "Hugging Face token": "401: hf_abcdefghijklmnopqrstuvwxyz0123",
    "bearer": "Authorization: Bearer 0a1B2c3D4e5F6g7H8i9J",
    "URL password": "https://user:pa55w0rd@registry.example/x",
    "URL signature": "GET s3://b/k?X-Amz-Signature=0a1b2c3d4e5f",
    "random base64": "blob Zm9vYmFyYmF6cXV4K3Rlc3Q9PT1hYmNkZWZnaGlqa2xtbm9w end",
    "random url-safe token": "token rejected: 3rB7kQ9xZ2mW5vN8pL4tY6hJ1cF0dS",
}
SECRETS = {
    "bare 40-hex key": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "key: hex": "5f4dcc3b5aa765d61d8327deb882cf99",
    "password in words": "hunter2",
    "token in words": "Zq8xV2mN4pL7rT1s",
    "password assignment": "s3cr3t-Value",
    "yaml secret": "opensesame123",
    "api key": "AbC123xYz789",
    "AWS access key": "AKIAIOSFODNN7EXAMPLE",
    "AWS secret key": "wJalrXUtnFEMI",
    "GitHub token": "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",
    "GitLab token": "glpat-xZ8vXq9TkdJmA1bC2dE3",
    "Slack token": "AbCdEfGhIjKlMnOpQrStUvWx",
    "Stripe key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "JWT": "dozjgNryP4J3jVmNHl0w5N",
    "private key": "BEGIN RSA PRIVATE KEY",
    "Hugging Face token": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "bearer": "0a1B2c3D4e5F6g7H8i9J",
    "URL password": "pa55w0rd",
    "URL signature": "0a1b2c3d4e5f",
    "random base64": "Zm9vYmFyYmF6cXV4K3Rlc3Q9PT1hYmNkZWZnaGlqa2xtbm9w",
    "random url-safe token": "3rB7kQ9xZ2mW5vN8pL4tY6hJ1cF0dS",
}
# Messages with no secret: shown as they are, every word of them.
PLAIN = [
    'Back-off pulling image "ghcr.io/rocm-inference/model-server:0.2.0"',
    'Failed to pull image "registry.internal:5000/ml/vllm-rocm:v0.32.1": rpc error: code = NotFound',
    "image ghcr.io/rocm-inference/model-server@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "model mistralai/Mistral-7B-Instruct-v0.3 not found on the Hub",
    "loading /models/meta-llama/Llama-3.1-70B-Instruct/model-00001-of-00030.safetensors",
    "cannot open /var/lib/kubelet/pods/3f2b1c7e-4a5d-4e6f-9a8b-1234567890ab/volumes/kubernetes.io~empty-dir/cache",
    "/home/user/.cache/huggingface/hub/models--Qwen--Qwen2-0.5B-Instruct/snapshots/main is empty",
    "0/4 nodes are available: 4 Insufficient amd.com/gpu. preemption: 0/4 nodes are available",
    "container ran out of its memory limit of 64Gi and was killed",
    "the model needs 137438953472 bytes, 68719476736 are free",
    "couldn't find key HF_TOKEN in Secret ml/hf-token",
    'secret "hf-token" not found',
    "No MIGraphXExecutionProvider/ROCMExecutionProvider in this onnxruntime build",
    "dial tcp 203.0.113.7:443: i/o timeout",
    "OOMKilled: rocm-inference-operator-controller-manager-7d9f8b6c5d-x2x4q",
    "sha256 is " + "ab" * 32 + ", expected x",
    "password required but none given",
]


@pytest.mark.parametrize("name", LEAKS)
def test_redact_masks_the_corpus_of_secrets(name: str) -> None:
    shown = redact(LEAKS[name])
    assert SECRETS[name] not in shown
    assert shown != LEAKS[name]


@pytest.mark.parametrize("text", PLAIN)
def test_redact_keeps_ordinary_messages_readable(text: str) -> None:
    assert redact(text) == text


def test_redact_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detectors' verify() would call their vendors: redact never does."""
    import socket

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("redact opened a socket")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    assert all(SECRETS[name] not in redact(text) for name, text in LEAKS.items())


# --- Lost nodes ---------------------------------------------------------------------------------


def _bound(name: str, node: str, pod_ready: str, containers_ready: bool = True) -> dict:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": pod_ready}],
            "containerStatuses": [{"name": "server", "ready": containers_ready, "state": {"running": {}}}],
        },
    }


def _node(ready: str, message: str = "") -> dict:
    return {"status": {"conditions": [{"type": "Ready", "status": ready, "message": message}]}}


def test_pods_the_node_controller_marked_not_ready_point_at_their_node() -> None:
    lost = _bound("a-1", "n2", "False")
    assert status_pods.marked_not_ready(lost)
    # Not ready because its container is not (starting, failing): the kubelet says why, not the node.
    assert not status_pods.marked_not_ready(_bound("a-2", "n1", "False", containers_ready=False))
    assert not status_pods.marked_not_ready(_bound("a-3", "n1", "True"))
    assert status_pods.suspect_nodes([lost, _bound("a-3", "n1", "True")]) == ["n2"]


def test_a_lost_node_is_named_with_the_replicas_on_it() -> None:
    pods = [_bound("a-1", "n1", "True"), _bound("a-2", "n2", "False"), _bound("a-3", "n2", "False")]
    problem = status_pods.nodes_problem(pods, {"n2": _node("Unknown", "Kubelet stopped posting node status.")})
    assert problem is not None and problem.reason == "NodeNotReady"
    assert problem.message == (
        "node n2 is not ready, Ready=Unknown (Kubelet stopped posting node status.): 2 of 3 replicas on it"
    )
    # Back (or gone: the pod garbage collector's to clean), nothing to say.
    assert status_pods.nodes_problem(pods, {"n2": _node("True")}) is None
    assert status_pods.nodes_problem(pods, {"n2": None}) is None


def test_a_node_the_operator_may_not_read_leaves_the_pods_problem_to_say() -> None:
    """A single-namespace install reads no Nodes: a 403 is no status write failing."""
    from kubernetes.client.exceptions import ApiException

    from inference_operator.handlers import shared

    class Forbidden:
        def get(self, ref: object) -> None:
            raise ApiException(status=403)

    assert shared.read_node(Forbidden(), "n2") is None  # type: ignore[arg-type]

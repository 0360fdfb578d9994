"""status.adapters from the replicas' answers (pure): which pods are asked, what is read."""

from __future__ import annotations

from inference_operator.adapter_status import MAX_REPLICAS_LISTED, REASON_LENGTH, replica_states, summarize, targets
from inference_operator.models import parse_spec
from model_server.adapters import digest  # the sidecar's own: the operator must match it

SPEC = parse_spec(
    {
        "model": {"uri": "pvc://models/llama"},
        "runtime": {"engine": "vllm"},
        "adapters": [
            {"name": "sql", "uri": "hf://org/sql"},
            {"name": "chat", "uri": "hf://org/chat"},
        ],
    }
)


def pod(name: str, ip: str | None = "10.244.0.5", phase: str = "Running", **extra: object) -> dict:
    meta: dict = {"name": name, **extra.pop("meta", {})}  # type: ignore[dict-item]
    return {"metadata": meta, "spec": extra, "status": {"phase": phase, "podIP": ip, "hostIP": "10.0.0.1"}}


def test_only_running_pods_with_an_ip_of_their_own_are_asked() -> None:
    pods = [
        pod("b", "10.244.0.6"),
        pod("a", "fd00::5"),
        pod("node", "10.0.0.1"),  # the node's address
        pod("host", "10.244.0.9", hostNetwork=True),
        pod("starting", None, phase="Pending"),
        pod("leaving", meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        pod("done", phase="Succeeded"),
    ]
    assert [(t.pod, t.url) for t in targets(pods, 9090, "/adapters")] == [
        ("a", "http://[fd00::5]:9090/adapters"),
        ("b", "http://10.244.0.6:9090/adapters"),
    ]


def test_a_replica_reports_only_the_wanted_adapters_in_known_states() -> None:
    wanted = {"sql": "hf://org/sql", "chat": "hf://org/chat"}
    answer = {
        "adapters": [
            {"name": "sql", "digest": digest("hf://org/sql@old"), "state": "Ready"},  # the list before the change
            {"name": "chat", "digest": digest("hf://org/chat"), "state": "Pwned"},
            {"name": "other", "digest": digest("hf://x/y"), "state": "Ready"},
            "junk",
        ]
    }
    assert replica_states(answer, wanted) == {"sql": ("Pending", ""), "chat": ("Pending", "")}
    assert replica_states(None, wanted) == {"sql": ("Pending", ""), "chat": ("Pending", "")}
    assert replica_states({"adapters": "x"}, wanted)["sql"] == ("Pending", "")
    long = {
        "adapters": [{"name": "sql", "digest": digest("hf://org/sql"), "state": "Failed", "reason": "a\nb " * 1000}]
    }
    state, reason = replica_states(long, wanted)["sql"]
    assert state == "Failed" and len(reason) == REASON_LENGTH and "\n" not in reason


def ready(*names: str) -> dict:
    uris = {"sql": "hf://org/sql", "chat": "hf://org/chat"}
    return {"adapters": [{"name": n, "digest": digest(uris[n]), "state": "Ready"} for n in names]}


def test_summary_verdicts() -> None:
    entries, ok, reason, message = summarize(SPEC, {"p1": ready("sql", "chat"), "p2": ready("sql", "chat")})
    assert ok and reason == "Loaded" and message == "2 adapter(s) loaded on 2 replica(s)"
    assert [(e["name"], e["state"], e["readyReplicas"], e["replicas"]) for e in entries] == [
        ("sql", "Ready", 2, 2),
        ("chat", "Ready", 2, 2),
    ]
    _, ok, reason, message = summarize(SPEC, {"p1": ready("sql", "chat"), "p2": None})
    assert not ok and reason == "Loading" and message == "loading sql, chat"  # an unanswered replica counts
    assert summarize(SPEC, {})[1:3] == (False, "NoReplicas")
    failed = {
        "adapters": [{"name": "chat", "digest": digest("hf://org/chat"), "state": "Failed", "reason": "rank 64 > 16"}]
    }
    entries, ok, reason, message = summarize(SPEC, {"p1": ready("sql", "chat"), "p2": failed})
    assert not ok and reason == "AdapterFailed" and message == "chat on p2: rank 64 > 16"
    chat = entries[1]
    assert chat["state"] == "Failed" and chat["pods"][1] == {"pod": "p2", "state": "Failed", "reason": "rank 64 > 16"}


def test_status_lists_a_bounded_number_of_replicas() -> None:
    entries, *_ = summarize(SPEC, {f"p{i:03}": ready("sql") for i in range(100)})
    assert entries[0]["replicas"] == 100 and entries[0]["readyReplicas"] == 100
    assert len(entries[0]["pods"]) == MAX_REPLICAS_LISTED

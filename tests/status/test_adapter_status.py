"""status.adapters from the replicas' answers (pure): which pods are asked, what is read; and
adapter_watch asking replicas whose sidecar answers slowly, deeply or at length."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from adapters_sidecar.desired import digest  # the sidecar's own: the operator must match it
from inference_operator import adapter_watch
from inference_operator.adapter_status import (
    MAX_REPLICAS_LISTED,
    REASON_LENGTH,
    parse_answer,
    replica_states,
    summarize,
    targets,
)
from inference_operator.builders.common import Owner
from inference_operator.models import parse_spec
from tests.http_stub import QuietHandler, serving

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


# --- adapter_watch: asking the replicas, whatever they answer --------------------------------


class Replicas:
    """Every replica's sidecar (all on one loopback port here), answering `body` (bytes, or a
    callable that writes the answer itself); counts the requests in flight at once."""

    def __init__(self, body: bytes | Callable[[QuietHandler], None], hold: float = 0.0) -> None:
        self.body, self.hold = body, hold
        self.in_flight = self.most = self.asked = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def serving(self) -> Iterator[int]:
        replicas = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                with replicas.lock:
                    replicas.in_flight += 1
                    replicas.asked += 1
                    replicas.most = max(replicas.most, replicas.in_flight)
                try:
                    time.sleep(replicas.hold)
                    if callable(replicas.body):
                        replicas.body(self)
                    else:
                        self.reply(replicas.body)
                finally:
                    with replicas.lock:
                        replicas.in_flight -= 1

        with serving(Handler) as server:
            yield server.server_address[1]


class Pods:
    """KubeApi's list_objects with `count` running pods on 127.0.0.1."""

    def __init__(self, count: int) -> None:
        self.count = count

    def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict]:
        return [
            {"metadata": {"name": f"p{i:03}"}, "spec": {}, "status": {"phase": "Running", "podIP": "127.0.0.1"}}
            for i in range(self.count)
        ]


def ask_all(port: int, pods: int) -> dict:
    owner = Owner(
        "llm", "ml", "u-1", SPEC.model_copy(update={"runtime": SPEC.runtime.model_copy(update={"metrics_port": port})})
    )

    async def run() -> dict:
        async with adapter_watch.client() as http:
            # The daemon's own deadline is far longer: an answer must come from adapter_watch's.
            return await asyncio.wait_for(adapter_watch.answers(Pods(pods), http, owner), 30)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_a_trickled_answer_is_cut_at_one_deadline_for_the_whole_exchange() -> None:
    """A 2 s timeout per read let a sidecar that sends a byte every 0.5 s hold the daemon forever."""

    def trickle(handler: QuietHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(200):  # 100 s unless the operator hangs up
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.5)

    with Replicas(trickle).serving() as port:
        assert ask_all(port, 1) == {"p000": None}


@pytest.mark.parametrize(
    "body", [b"[" * 100_000, b'{"adapters": ' * 50_000, b'{"a": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}']
)
def test_a_deeply_nested_answer_is_unreadable_not_an_error(body: bytes) -> None:
    """json.loads recursed once per level: 100,000 "[" raised RecursionError in the daemon."""
    with Replicas(body).serving() as port:
        assert ask_all(port, 1) == {"p000": None}


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    answer = {
        "adapters": [{"name": "sql", "digest": digest("hf://org/sql"), "state": "Failed", "reason": "[[[{{{" * 50}]
    }
    assert parse_answer(json.dumps(answer).encode()) == answer


def test_replicas_are_asked_a_few_at_a_time_and_only_the_wanted_fields_kept() -> None:
    answer = ready("sql", "chat")
    answer["adapters"][0]["junk"] = "x" * 100_000
    answer["adapters"].append({"name": "other", "digest": "0" * 12, "state": "Ready", "reason": "y" * 100_000})
    replicas = Replicas(json.dumps(answer).encode(), hold=0.2)
    with replicas.serving() as port:
        found = ask_all(port, 20)
    assert replicas.asked == 20 and 1 <= replicas.most <= adapter_watch.CONCURRENT_ASKS, replicas.most
    assert len(json.dumps(found)) < 20 * 400  # each replica's answer reduced to the two wanted adapters
    assert summarize(SPEC, found)[1:3] == (True, "Loaded")

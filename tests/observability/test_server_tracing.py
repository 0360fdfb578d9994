"""The model server's traces, as a collector receives them (OTLP/HTTP protobuf, decoded here):
a server span per inference request continuing the caller's traceparent, its stages as
children, batched requests in traces of their own, and serving untouched by a collector that
is down or stuck."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from model_server import tracing
from model_server.api import routes
from model_server.runner import log_handler
from tests.server.helpers import HeldRuntime, make_settings, running_server, until
from testsupport.onnx_models import affine_model
from testsupport.otlp import ReceivedSpan, otlp_receiver
from testsupport.processes import free_port, running, serve_command

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
V2_SPAN = "POST /v2/models/{name}/infer"
STAGES = ("decode", "queue_wait", "batch_formation", "runtime", "encode")
SPAN_KIND_SERVER = 2


@pytest.fixture
def affine_repo(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    weight, bias = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    affine_model(tmp_path / "repo" / "1" / "model.onnx", weight, bias)
    return tmp_path / "repo"


def v2_body(rows: int = 1) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": [0.5] * (4 * rows)}]}


def traceparent(trace_id: str = TRACE_ID, parent: str = PARENT_ID, sampled: bool = True) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{parent}-{'01' if sampled else '00'}"}


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id}


def one_trace_complete(spans: list[ReceivedSpan]) -> bool:
    names = {s.name for s in spans}
    return V2_SPAN in names and all(stage in names for stage in STAGES)


async def test_a_callers_traceparent_is_the_parent_of_the_request_span_and_its_stages(affine_repo, monkeypatch):
    # What the operator sets in the pod (builders/tracing.py), the pod's name expanded.
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=svc-7d9f-x2,k8s.namespace.name=ml,inference.service=svc"
    )
    with otlp_receiver() as receiver:
        settings = make_settings(affine_repo, otlp_traces_endpoint=receiver.url)
        with running_server(settings) as running:
            async with httpx.AsyncClient(base_url=running.url) as client:
                reply = await client.post("/v2/models/tiny/infer", json=v2_body(2), headers=traceparent())
            assert reply.status_code == 200, reply.text
            spans = receiver.wait_for(one_trace_complete)
    (request,) = [s for s in spans if s.name == V2_SPAN]
    assert (request.trace_id, request.parent_id, request.kind) == (TRACE_ID, PARENT_ID, SPAN_KIND_SERVER)
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["http.route"] == "/v2/models/{name}/infer"
    assert request.attributes["inference.model"] == "tiny"
    assert request.resource["service.name"] == "model-server"
    assert (request.resource["k8s.pod.name"], request.resource["inference.service"]) == ("svc-7d9f-x2", "svc")
    stages = children(spans, request)
    assert set(stages) == set(STAGES)
    for stage in stages.values():  # each stage within the request, in the order served
        assert request.start_ns <= stage.start_ns <= stage.end_ns <= request.end_ns
    order = [stages[name] for name in STAGES]
    for earlier, later in zip(order, order[1:], strict=False):
        assert earlier.end_ns <= later.start_ns, (earlier.name, later.name)
    assert stages["runtime"].attributes["inference.batch.rows"] == 2
    assert stages["runtime"].attributes["inference.batch.requests"] == 1


async def test_requests_batched_together_each_keep_their_own_trace_and_name_the_shared_batch(affine_repo):
    held = HeldRuntime()  # the first request holds the runtime while three queue behind it
    with otlp_receiver() as receiver:
        settings = make_settings(affine_repo, max_batch_size=8, max_delay_ms=10_000, otlp_traces_endpoint=receiver.url)
        with running_server(settings, backend_factory=held) as running:
            trace_ids = [f"{i:032x}" for i in range(1, 5)]
            async with httpx.AsyncClient(base_url=running.url) as client:
                first = asyncio.ensure_future(
                    client.post("/v2/models/tiny/infer", json=v2_body(), headers=traceparent(trace_ids[0]))
                )
                await until(lambda: held.held == 1)
                rest = asyncio.gather(
                    *(
                        client.post("/v2/models/tiny/infer", json=v2_body(), headers=traceparent(t))
                        for t in trace_ids[1:]
                    )
                )
                await until(lambda: running.metric("model_server_queue_depth", {"model": "tiny"}) == 3)
                held.release()
                replies = [await first, *await rest]
            assert [r.status_code for r in replies] == [200] * 4
            spans = receiver.wait_for(lambda got: sum(s.name == "runtime" for s in got) == 4)
    requests = {s.trace_id: s for s in spans if s.name == V2_SPAN}
    assert set(requests) == set(trace_ids)
    runtimes = {}
    for trace_id, request in requests.items():
        stages = children(spans, request)
        assert set(STAGES) <= set(stages), trace_id
        runtimes[trace_id] = stages["runtime"]
    alone, *batched = (runtimes[t] for t in trace_ids)
    assert alone.attributes["inference.batch.requests"] == 1
    assert len({r.attributes["inference.batch.id"] for r in batched}) == 1  # one batch ...
    assert alone.attributes["inference.batch.id"] != batched[0].attributes["inference.batch.id"]
    for runtime in batched:  # ... seen from three traces, each with its own spans
        assert runtime.attributes["inference.batch.requests"] == 3 and runtime.attributes["inference.batch.rows"] == 3
    assert len({r.span_id for r in batched}) == 3


async def test_sampling_ratio_zero_records_new_traces_never_and_a_sampled_callers_always(affine_repo):
    with otlp_receiver() as receiver:
        settings = make_settings(affine_repo, otlp_traces_endpoint=receiver.url, trace_sample_ratio=0.0)
        with running_server(settings) as running:
            async with httpx.AsyncClient(base_url=running.url) as client:
                for _ in range(5):
                    assert (await client.post("/v2/models/tiny/infer", json=v2_body())).status_code == 200
                unsampled = traceparent(f"{7:032x}", sampled=False)
                assert (await client.post("/infer", json={"data": [1, 2, 3, 4]}, headers=unsampled)).status_code == 200
                reply = await client.post("/infer", json={"data": [1, 2, 3, 4]}, headers=traceparent())
                assert reply.status_code == 200
            spans = receiver.wait_for(lambda got: any(s.name == "POST /infer" for s in got))
            running.state.tracing.processor.force_flush()
    assert {s.trace_id for s in receiver.spans} == {TRACE_ID}
    assert {s.name for s in receiver.spans} == {"POST /infer", *STAGES}
    assert spans


async def test_an_error_answer_is_on_the_span_and_marks_5xx_only(affine_repo):
    with otlp_receiver() as receiver:
        settings = make_settings(affine_repo, otlp_traces_endpoint=receiver.url)
        with running_server(settings) as running:
            async with httpx.AsyncClient(base_url=running.url) as client:
                bad = await client.post("/v2/models/tiny/infer", content=b"{not json", headers=traceparent())
            assert bad.status_code == 400
            spans = receiver.wait_for(lambda got: any(s.name == V2_SPAN for s in got))
    (request,) = [s for s in spans if s.name == V2_SPAN]
    assert request.attributes["http.response.status_code"] == 400
    assert request.status_code == 0  # unset: a client's error is not the server's


@pytest.mark.parametrize("mode", ["hang", "refuse"])
async def test_a_stuck_or_absent_collector_costs_traces_not_requests(affine_repo, mode, caplog):
    with otlp_receiver(mode) as receiver:
        settings = make_settings(affine_repo, otlp_traces_endpoint=receiver.url)
        with running_server(settings) as running:
            tracer = running.state.tracing
            most_queued, backlogged = 0, 0
            async with httpx.AsyncClient(base_url=running.url) as client:
                for _ in range(30):  # 600 requests, 6 spans each: beyond the export queue
                    replies = await asyncio.gather(
                        *(client.post("/v2/models/tiny/infer", json=v2_body()) for _ in range(20))
                    )
                    assert [r.status_code for r in replies] == [200] * 20
                    most_queued = max(most_queued, tracer.queued())
                    backlogged += tracer.backlogged()
    assert most_queued <= tracing.MAX_QUEUED_SPANS
    if mode == "hang":  # the queue filled up; from then on requests were served untraced
        assert most_queued >= tracing.MAX_QUEUED_SPANS - tracing.SPANS_PER_REQUEST and backlogged
    assert not [r for r in caplog.records if "Queue full" in r.getMessage()]  # no span dropped one by one
    assert receiver.exports == 0


async def test_tracing_off_binds_the_routes_without_it(affine_repo):
    with running_server(make_settings(affine_repo)) as running:
        assert running.state.tracing is None
        endpoints = [route.endpoint for route in running.app.fast_path.routes]
        assert endpoints and all(e.func is routes.serve for e in endpoints)
        async with httpx.AsyncClient(base_url=running.url) as client:
            reply = await client.post("/v2/models/tiny/infer", json=v2_body(), headers=traceparent())
        assert reply.status_code == 200
        assert "traceparent" not in reply.headers


OFF_SCRIPT = """
import asyncio, sys
import httpx
from tests.server.helpers import make_settings, running_server

async def main():
    with running_server(make_settings(sys.argv[1])) as running:
        async with httpx.AsyncClient(base_url=running.url) as client:
            for _ in range(3):
                assert (await client.post("/infer", json={"data": [1, 2, 3, 4]})).status_code == 200

asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
"""


@pytest.mark.slow
def test_with_tracing_off_the_sdk_and_exporter_are_never_imported(affine_repo):
    out = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT, str(affine_repo)], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_json_log_lines_carry_the_active_spans_ids():
    records: list[str] = []
    handler = log_handler("json", trace_ids=True)
    handler.emit = lambda record: records.append(handler.format(record))  # type: ignore[method-assign]
    logger = logging.getLogger("test.tracing.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with otlp_receiver() as receiver:
            tracer = tracing.Tracing(receiver.url, 1.0, model="tiny")
            headers = traceparent()
            with tracer.request("/infer", headers, "tiny") as trace:
                assert trace is not None
                logger.warning("inside %s", "a request")
                span_id = format(trace.span.get_span_context().span_id, "016x")
            logger.warning("outside")
            tracer.shutdown()
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in records)
    assert inside["message"] == "inside a request" and inside["level"] == "WARNING"
    assert inside["logger"] == "test.tracing.json" and "time" in inside
    assert (inside["trace_id"], inside["span_id"]) == (TRACE_ID, span_id)
    assert "trace_id" not in outside and outside["message"] == "outside"


def test_text_logs_stay_the_default():
    handler = log_handler()
    record = logging.LogRecord("model_server", logging.INFO, __file__, 1, "loaded %s", ("v1",), None)
    line = handler.format(record)
    assert line.endswith(" INFO model_server: loaded v1") and not line.startswith("{")


@pytest.mark.slow
def test_serve_with_log_format_json_writes_nothing_but_json_lines(affine_repo, tmp_path):
    """Every line the process writes, uvicorn's own included, is one JSON object."""
    port = free_port()
    log = tmp_path / "server.log"
    command = serve_command(affine_repo, port, "--model-name", "tiny", "--no-watch", "--log-format", "json")
    env = {**os.environ, "MODEL_SERVER_ACCESS_LOG": "true"}
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        reply = httpx.post(f"http://127.0.0.1:{port}/v2/models/tiny/infer", json=v2_body(), timeout=10)
        assert reply.status_code == 200
    assert process.returncode == 0
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    loggers = {r["logger"] for r in records}
    assert {"uvicorn.error", "uvicorn.access"} <= loggers, loggers
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any("/v2/models/tiny/infer" in r["message"] for r in records if r["logger"] == "uvicorn.access")

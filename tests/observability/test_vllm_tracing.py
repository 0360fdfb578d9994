"""vLLM's own OTLP export as the operator wires it (runtime.tracing): the container the operator
renders, run by the CPU build of vLLM 0.32, sends its `llm_request` spans over OTLP/HTTP
protobuf to the receiver in this process, as children of the caller's traceparent."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest

from inference_operator.builders import Owner, build_deployment
from inference_operator.builders.common import Images
from inference_operator.models import parse_spec
from tests.llm.conftest import running_vllm, tiny_llama  # noqa: F401  (tiny_llama is a fixture)
from testsupport.crd import apply_defaults, crd_schema
from testsupport.otlp import otlp_receiver
from testsupport.processes import free_port

MOUNT = "/mnt/models"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def rendered_vllm_container(endpoint: str) -> dict:
    spec = {
        "model": {"uri": "pvc://models/tiny-llama", "name": "tiny"},
        "runtime": {"engine": "vllm", "maxModelLen": 256, "tracing": {"endpoint": endpoint, "samplingRatio": 0.0}},
        "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "4Gi"},
    }
    parsed = parse_spec(apply_defaults(crd_schema()["properties"]["spec"], copy.deepcopy(spec)))
    deployment = build_deployment(Owner("tiny-llm", "ml", "u-1", parsed, images=Images()))
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_sends_its_request_spans_under_the_callers_trace(tmp_path: Path, tiny_llama: Path) -> None:  # noqa: F811
    with otlp_receiver() as receiver:
        container = rendered_vllm_container(receiver.url)
        port = free_port()
        with running_vllm(container, tiny_llama, MOUNT, port, tmp_path) as _vllm:
            base = f"http://127.0.0.1:{port}"
            body = {"model": "tiny", "prompt": "the operator", "max_tokens": 4, "ignore_eos": True}
            # Sampling ratio 0: a request without a traceparent starts no trace ...
            assert httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code == 200
            # ... one whose caller sampled its trace continues it.
            traceparent = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
            reply = httpx.post(f"{base}/v1/completions", json=body, headers=traceparent, timeout=60)
            assert reply.status_code == 200
            spans = receiver.wait_for(lambda got: any(s.name == "llm_request" for s in got), timeout=60)
    (request,) = [s for s in spans if s.name == "llm_request"]
    assert (request.trace_id, request.parent_id) == (TRACE_ID, PARENT_ID)
    assert request.attributes["gen_ai.usage.completion_tokens"] == 4
    assert request.end_ns > request.start_ns

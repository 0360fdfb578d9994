"""Both HTTP APIs against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper

from model_server.gpu import GpuSample
from testsupport.onnx_models import affine_model, int_model, save_model

from .helpers import HeldRuntime, binary_request, make_settings, running_server, until

RNG = np.random.default_rng(7)
W1, B1 = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
W2, B2 = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)


def ref(x, version=2):
    w, b = (W1, B1) if version == 1 else (W2, B2)
    return np.asarray(x, np.float32) @ w + b


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Versions 1 and 2 of an affine model (different weights), 2 = latest."""
    repo = tmp_path_factory.mktemp("api") / "repo"
    affine_model(repo / "1" / "model.onnx", W1, B1)
    affine_model(repo / "2" / "model.onnx", W2, B2)
    with running_server(make_settings(repo, max_body_bytes=64 * 1024)) as running:
        yield running


@pytest.fixture(scope="module")
def int_server(tmp_path_factory):
    path = int_model(tmp_path_factory.mktemp("ints") / "ints.onnx")
    with running_server(make_settings(path, model_name="ints")) as running:
        yield running


async def test_simple_api_single_row_and_rows_match_numpy(server):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    async with httpx.AsyncClient(base_url=server.url) as client:
        one = await client.post("/infer", json={"data": x[0].tolist()})
        many = await client.post("/infer", json={"data": x.tolist(), "model_version": "1"})
        as_int = await client.post("/infer", json={"data": x.tolist(), "model_version": 1})
    assert one.status_code == 200, one.text
    body = one.json()
    assert set(body) == {"result", "latency_ms", "model_version"}
    assert body["model_version"] == "2" and body["latency_ms"] > 0
    np.testing.assert_allclose(body["result"], ref(x[0]), rtol=1e-5, atol=1e-5)
    assert many.json()["model_version"] == "1"
    np.testing.assert_allclose(many.json()["result"], ref(x, 1), rtol=1e-5, atol=1e-5)
    assert as_int.status_code == 200 and as_int.json()["result"] == many.json()["result"]


async def test_v2_server_and_model_metadata(server):
    async with httpx.AsyncClient(base_url=server.url) as client:
        meta = (await client.get("/v2")).json()
        live = await client.get("/v2/health/live")
        ready = await client.get("/v2/health/ready")
        model = (await client.get("/v2/models/tiny")).json()
        version = await client.get("/v2/models/tiny/versions/1")
        model_ready = await client.get("/v2/models/tiny/versions/1/ready")
        missing = await client.get("/v2/models/other")
        missing_version = await client.get("/v2/models/tiny/versions/9/ready")
    assert meta["name"] == "model-server" and "binary_tensor_data" in meta["extensions"]
    assert live.status_code == ready.status_code == 200
    assert model == {
        "name": "tiny",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
    }
    assert version.status_code == 200 and model_ready.json() == {"name": "tiny", "ready": True}
    assert missing.status_code == 404 and "unknown model 'other'" in missing.json()["error"]
    assert missing_version.status_code == 404 and "no version '9'" in missing_version.json()["error"]


async def test_v2_infer_flat_and_nested_with_id(server):
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    flat = {
        "id": "req-1",
        "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
    }
    nested = {
        "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}],
        "outputs": [{"name": "y"}],
    }
    async with httpx.AsyncClient(base_url=server.url) as client:
        r1 = await client.post("/v2/models/tiny/infer", json=flat)
        r2 = await client.post("/v2/models/tiny/versions/1/infer", json=nested)
    assert r1.status_code == 200, r1.text
    body = r1.json()
    assert body["id"] == "req-1" and body["model_name"] == "tiny" and body["model_version"] == "2"
    (out,) = body["outputs"]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [2, 3]
    np.testing.assert_allclose(np.reshape(out["data"], (2, 3)), ref(x), rtol=1e-5, atol=1e-5)
    assert r2.json()["model_version"] == "1"
    np.testing.assert_allclose(np.reshape(r2.json()["outputs"][0]["data"], (2, 3)), ref(x, 1), rtol=1e-5, atol=1e-5)


async def test_v2_binary_tensor_extension(server):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    content, headers = binary_request([3, 4], x.tobytes(), outputs=[{"name": "y", "parameters": {"binary_data": True}}])
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/v2/models/tiny/infer", content=content, headers=headers)
    assert r.status_code == 200, r.text
    length = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:length])
    (out,) = meta["outputs"]
    assert out["parameters"]["binary_data_size"] == 3 * 3 * 4 and "data" not in out
    y = np.frombuffer(r.content[length:], dtype="<f4").reshape(out["shape"])
    np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-5)


async def test_non_finite_outputs_are_null_in_json_and_exact_in_binary(server):
    """JSON has no NaN or Infinity: an output the model made non-finite is `null` in a JSON
    answer (valid JSON, as strict as the requests), and exact in the binary extension."""
    x = np.zeros((3, 4), np.float32)
    x[0, 0], x[1, 0] = np.inf, np.nan
    with np.errstate(invalid="ignore"):
        expected = ref(x)
    assert not np.isfinite(expected[:2]).any() and np.isfinite(expected[2]).all()
    answers = {}
    async with httpx.AsyncClient(base_url=server.url) as client:
        for binary in (False, True):
            content, headers = binary_request([3, 4], x.tobytes(), parameters={"binary_data_output": binary})
            answers[binary] = await client.post("/v2/models/tiny/infer", content=content, headers=headers)
    as_json = answers[False]
    assert as_json.status_code == 200, as_json.text
    data = json.loads(as_json.content, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))["outputs"][0][
        "data"
    ]
    assert data[:6] == [None] * 6
    np.testing.assert_allclose(data[6:], expected[2], rtol=1e-5, atol=1e-5)
    as_binary = answers[True]
    length = int(as_binary.headers["Inference-Header-Content-Length"])
    y = np.frombuffer(as_binary.content[length:], dtype="<f4").reshape(3, 3)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(y[np.isinf(y)], expected[np.isinf(expected)])


async def test_v2_typed_tensors(int_server):
    a, b = [[1, 9], [4, -3]], [[2, 3], [4, -5]]
    req = {
        "inputs": [
            {"name": "a", "shape": [2, 2], "datatype": "INT64", "data": a},
            {"name": "b", "shape": [2, 2], "datatype": "INT64", "data": sum(b, [])},
        ]
    }
    async with httpx.AsyncClient(base_url=int_server.url) as client:
        r = await client.post("/v2/models/ints/infer", json=req)
        only_gt = await client.post("/v2/models/ints/infer", json={**req, "outputs": [{"name": "gt"}]})
        simple = await client.post("/infer", json={"data": [1, 2]})
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["sum"]["datatype"] == "INT64"
    assert outputs["sum"]["data"] == (np.array(a) + np.array(b)).ravel().tolist()
    assert outputs["gt"]["datatype"] == "BOOL"
    assert outputs["gt"]["data"] == (np.array(a) > np.array(b)).ravel().tolist()
    assert [o["name"] for o in only_gt.json()["outputs"]] == ["gt"]
    assert simple.status_code == 400 and "model has 2 inputs" in simple.json()["error"]


X_OK = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/infer", {"data": [1, 2, 3]}, 400, "3 values per row, model input 'x' expects 4"),
        ("/infer", {"data": [1, "two", 3, 4]}, 400, "element 1 ('two') is not a number"),
        ("/infer", {"data": []}, 400, "non-empty"),
        ("/infer", {"rows": [1, 2, 3, 4]}, 422, "data: Field required"),
        ("/infer", {"data": [1, 2, 3, 4], "model_version": "7"}, 404, "no version '7'"),
        ("/infer", {"data": [1, 2, 3, 4], "model_version": True}, 422, "model_version"),
        ("/infer", {"data": [1, 2, 3, 4], "model_version": 2.0}, 422, "model_version"),
        ("/infer", b"{not json", 400, "not valid JSON"),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{**X_OK, "datatype": "FP64"}]},
            400,
            "'x' has datatype FP64, model expects FP32",
        ),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{**X_OK, "shape": [2, 2]}]},
            400,
            "'x' has shape [2, 2], model expects [-1, 4]",
        ),
        ("/v2/models/tiny/infer", {"inputs": [{**X_OK, "shape": [1, 5]}]}, 400, "needs 5 values, data has 4"),
        ("/v2/models/tiny/infer", {"inputs": [{**X_OK, "data": [1, 2, None, 4]}]}, 400, "element 2 (None)"),
        # numpy alone would read true as 1.0 among numbers; the fast path must not either.
        ("/v2/models/tiny/infer", {"inputs": [{**X_OK, "data": [1.5, 2, True, 4]}]}, 400, "element 2 (True)"),
        ("/infer", {"data": [1, 0.5, False, 4]}, 400, "element 2 (False) is not a number"),
        ("/v2/models/tiny/infer", {"inputs": [{**X_OK, "name": "z"}]}, 400, "unknown input(s) ['z']"),
        (
            "/v2/models/tiny/infer",
            {"inputs": [X_OK], "outputs": [{"name": "nope"}]},
            400,
            "unknown output(s) ['nope']",
        ),
        ("/v2/models/tiny/infer", {"inputs": []}, 422, "inputs"),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]},
            422,
            "shape: Field required",
        ),
        ("/v2/models/nope/infer", {"inputs": [X_OK]}, 404, "unknown model 'nope'"),
        ("/infer", {"data": [0.5] * 20_000}, 413, "exceeds the limit"),
    ],
)
async def test_bad_input_is_a_client_error_with_a_message(server, path, body, status, fragment):
    async with httpx.AsyncClient(base_url=server.url) as client:
        if isinstance(body, bytes):
            r = await client.post(path, content=body)
        else:
            r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]


async def test_chunked_body_over_the_limit_is_413(server):
    async def chunks():
        for _ in range(100):
            yield b" " * 1024

    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/infer", content=chunks())
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]


async def test_metrics_follow_the_contract(server):
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/infer", json={"data": [1, 2, 3, 4], "model_version": "1"})
        await client.post("/infer", json={"data": [1, 2]})
        text = (await client.get("/metrics")).text
    for name in [
        'model_server_request_duration_seconds_bucket{le="0.001",model="tiny",version="1"}',
        'model_server_request_duration_seconds_bucket{le="10.0",model="tiny",version="1"}',
        'model_server_queue_wait_seconds_count{model="tiny",version="1"}',
        'model_server_compute_seconds_count{model="tiny",version="1"}',
        'model_server_batch_size_bucket{le="128.0",model="tiny",version="1"}',
        'model_server_requests_total{code="200",model="tiny",version="1"}',
        'model_server_requests_total{code="400",model="tiny",version="2"}',
        'model_server_inflight_requests{model="tiny"}',
        'model_server_queue_depth{model="tiny"}',
    ]:
        assert name in text, name
    assert "model_server_gpu_" not in text  # no amdsmi here: absent, not zero
    assert server.metric("model_server_inflight_requests", {"model": "tiny"}) == 0


def test_gpu_gauges_exported_when_a_reader_exists(affine_repo):
    samples = [GpuSample("0", 37.0, 2.5e9), GpuSample("1", None, 1.0e9)]
    with running_server(make_settings(affine_repo), gpu_reader=lambda: samples) as running:
        text = httpx.get(f"{running.url}/metrics").text
    assert 'model_server_gpu_utilization_percent{gpu="0"} 37.0' in text
    assert 'model_server_gpu_memory_used_bytes{gpu="1"} 1e+09' in text
    assert 'model_server_gpu_utilization_percent{gpu="1"}' not in text  # unknown stays unknown


async def test_concurrent_requests_are_batched_and_each_gets_its_rows(affine_repo, affine_params):
    weight, bias = affine_params
    settings = make_settings(affine_repo, max_batch_size=8, max_delay_ms=10_000)
    xs = RNG.standard_normal((8, 4)).astype(np.float32)
    held = HeldRuntime()  # the first request keeps the runtime busy while the others arrive
    with running_server(settings, backend_factory=held) as running:
        depth = {"model": "tiny"}
        async with httpx.AsyncClient(base_url=running.url) as client:
            first = asyncio.ensure_future(client.post("/infer", json={"data": xs[0].tolist()}))
            await until(lambda: held.held == 1)
            rest = asyncio.gather(*(client.post("/infer", json={"data": row.tolist()}) for row in xs[1:]))
            await until(lambda: running.metric("model_server_queue_depth", depth) == 7)
            held.release()
            replies = [await first, *await rest]
        labels = {"model": "tiny", "version": "1"}
        count = running.metric("model_server_batch_size_count", labels)
        total = running.metric("model_server_batch_size_sum", labels)
    for row, reply in zip(xs, replies, strict=True):
        assert reply.status_code == 200
        np.testing.assert_allclose(reply.json()["result"], row @ weight + bias, rtol=1e-5, atol=1e-5)
    assert total == 8 and count == 2  # the first alone (idle runtime), the other 7 together behind it
    assert running.metric("model_server_batch_size_bucket", {**labels, "le": "1.0"}) == 1


async def test_overload_overflow_answers_429_with_retry_after(affine_repo):
    settings = make_settings(affine_repo, max_batch_size=64, max_delay_ms=10_000, max_queue=4)
    held = HeldRuntime()  # the first request holds the runtime; 4 queue behind it, the rest overflow
    labels = {"model": "tiny", "version": "1", "code": "429"}
    with running_server(settings, backend_factory=held) as running:
        async with httpx.AsyncClient(base_url=running.url) as client:
            first = asyncio.ensure_future(client.post("/infer", json={"data": [0, 0, 0, 0]}))
            await until(lambda: held.held == 1)
            rest = asyncio.gather(*(client.post("/infer", json={"data": [i, 0, 0, 0]}) for i in range(1, 10)))
            await until(lambda: running.metric("model_server_requests_total", labels) == 5)
            held.release()
            replies = [await first, *await rest]
        rejected = running.metric("model_server_requests_total", labels)
    codes = sorted(r.status_code for r in replies)
    assert codes == [200] * 5 + [429] * 5
    for r in replies:
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1 and "queue is full" in r.json()["error"]
    assert rejected == 5


async def test_model_fault_broken_file_keeps_server_live_but_not_ready(tmp_path):
    (tmp_path / "repo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "1" / "model.onnx").write_bytes(b"\x00garbage")
    with running_server(make_settings(tmp_path / "repo"), wait_ready=False) as running:
        running.wait_scanned()
        async with httpx.AsyncClient(base_url=running.url) as client:
            live = await client.get("/health/live")
            ready = await client.get("/health/ready")
            v2_ready = await client.get("/v2/health/ready")
            infer = await client.post("/infer", json={"data": [1, 2, 3, 4]})
    assert live.status_code == 200
    assert ready.status_code == 503
    assert "version 1 failed to load" in ready.json()["reason"]
    assert "1" in ready.json()["failed"]
    assert v2_ready.status_code == 400 and v2_ready.json()["ready"] is False
    assert infer.status_code == 503 and "failed to load" in infer.json()["error"]
    # Nothing internal on the public port: no path of the model directory, no runtime error text.
    for response in (ready, v2_ready, infer):
        assert str(tmp_path) not in response.text and "garbage" not in response.text, response.text


async def test_model_fault_missing_model_explains_the_expected_layout(tmp_path):
    with running_server(make_settings(tmp_path / "absent"), wait_ready=False) as running:
        running.wait_scanned()
        ready = httpx.get(f"{running.url}/health/ready")
    assert ready.status_code == 503
    assert "no model found" in ready.json()["reason"] and "<version>/model.onnx" in ready.json()["reason"]
    assert str(tmp_path) not in ready.text


async def test_fixed_batch_model_runs_unbatched(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
    )
    path = save_model(graph, tmp_path / "fixed.onnx")
    with running_server(make_settings(path, model_name="fixed", max_delay_ms=50)) as running:
        async with httpx.AsyncClient(base_url=running.url) as client:
            replies = await asyncio.gather(
                *(
                    client.post(
                        "/v2/models/fixed/infer",
                        json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [i, i, i]}]},
                    )
                    for i in range(4)
                )
            )
        batches = running.metric("model_server_batch_size_count", {"model": "fixed", "version": "1"})
    assert [r.json()["outputs"][0]["data"] for r in replies] == [[0.0], [3.0], [6.0], [9.0]]
    assert batches == 4  # a model without a dynamic batch dimension is never stacked


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


async def test_openapi_documents_the_request_bodies(server):
    async with httpx.AsyncClient(base_url=server.url) as client:
        spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    body = spec["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/InferenceRequest"
    assert "inputs" in schemas["InferenceRequest"]["properties"]
    assert "data" in schemas["SimpleRequest"]["properties"]
    for ref in _refs(spec):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


@pytest.mark.filterwarnings("ignore:`torch\\.jit:DeprecationWarning")
async def test_torchscript_model_over_both_apis(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    linear = torch.nn.Linear(4, 3)
    version = tmp_path / "repo" / "1"
    version.mkdir(parents=True)
    torch.jit.trace(linear, torch.zeros(1, 4)).save(str(version / "model.pt"))
    (version / "signature.json").write_text(
        json.dumps(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
            }
        )
    )
    weight, bias = linear.weight.detach().numpy().T, linear.bias.detach().numpy()
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    settings = make_settings(tmp_path / "repo", format="torchscript", max_delay_ms=20)
    with running_server(settings) as running:
        async with httpx.AsyncClient(base_url=running.url) as client:
            meta = (await client.get("/v2/models/tiny")).json()
            simple, v2 = await asyncio.gather(
                client.post("/infer", json={"data": x[0].tolist()}),
                client.post(
                    "/v2/models/tiny/infer",
                    json={"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}]},
                ),
            )
    assert meta["platform"] == "pytorch_torchscript" and meta["outputs"][0]["name"] == "y"
    np.testing.assert_allclose(simple.json()["result"], x[0] @ weight + bias, rtol=1e-5, atol=1e-5)
    out = v2.json()["outputs"][0]
    assert out["name"] == "y" and out["shape"] == [2, 3]
    np.testing.assert_allclose(np.reshape(out["data"], (2, 3)), x @ weight + bias, rtol=1e-5, atol=1e-5)


async def test_the_error_counts_alerts_divide_by_start_at_zero_with_the_version(server):
    """A 500 series that appears at its first 500 has no earlier sample: rate() over a burst
    within one scrape interval sees nothing, and the error-rate alert never fires for it."""
    async with httpx.AsyncClient(base_url=server.url) as client:
        await until(lambda: server.metric("model_server_queue_depth", {"model": "tiny"}) is not None)
        text = (await client.get("/metrics")).text
    for code in ("200", "500", "503"):
        assert f'model_server_requests_total{{code="{code}",model="tiny",version="1"}}' in text, code
    assert server.metric("model_server_requests_total", {"code": "500", "model": "tiny", "version": "1"}) == 0

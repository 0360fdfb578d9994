"""Hostile input to the model server: huge shapes, values out of range, NaN literals,
wrong content types and unexpected failures all get a 4xx (or a 500 that tells nothing)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper

from model_server.backends.onnx import OnnxBackend
from testsupport.onnx_models import affine_model, save_model

from .helpers import binary_request, make_settings, running_server

X_OK = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
SECRET = "/var/secret/path-of-the-runtime"


class Exploding(OnnxBackend):
    """Raises an unexpected error (with internal detail) when x[0, 0] == 666."""

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if inputs["x"].size and inputs["x"].flat[0] == 666:
            raise RuntimeError(f"kernel failed reading {SECRET}")
        return super().infer(inputs)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = affine_model(
        tmp_path_factory.mktemp("hostile") / "repo" / "1" / "model.onnx",
        np.ones((4, 3), np.float32),
        np.zeros(3, np.float32),
    )
    settings = make_settings(path.parent.parent, max_delay_ms=0)
    factory = lambda p, s, v, i: Exploding(p, providers=s.providers, intra_op_threads=1)  # noqa: E731
    with running_server(settings, backend_factory=factory) as running:
        yield running


@pytest.mark.parametrize(
    "shape", [[0, 2**63], [2**64, 0], [0, 2**62, 4], [2**40, 2**40, 0], [0, 2**31, 2**31, 4], [2**70, 4]]
)
def test_huge_shape_dimensions_are_a_400_naming_the_shape(server, shape):
    with httpx.Client(base_url=server.url) as client:
        as_json = client.post("/v2/models/tiny/infer", json={"inputs": [{**X_OK, "shape": shape, "data": []}]})
        content, headers = binary_request(shape, b"")
        as_binary = client.post("/v2/models/tiny/infer", content=content, headers=headers)
    for r in (as_json, as_binary):
        assert r.status_code == 400, r.text
        assert "shape" in r.json()["error"] and "internal" not in r.json()["error"]


def test_unexpected_failure_is_a_500_that_leaks_nothing(server, caplog):
    with caplog.at_level(logging.ERROR, logger="model_server"):
        with httpx.Client(base_url=server.url) as client:
            r = client.post("/v2/models/tiny/infer", json={"inputs": [{**X_OK, "data": [666, 0, 0, 0]}]})
            ok = client.post("/v2/models/tiny/infer", json={"inputs": [X_OK]})
    assert r.status_code == 500
    error = r.json()["error"]
    assert SECRET not in r.text and "RuntimeError" not in r.text
    request_id = r.headers["x-request-id"]
    assert request_id in error
    # ... and the log line the id points to has the detail.
    assert any(
        request_id in rec.getMessage() and SECRET in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([1e39, 0, 0, 0], "exceed the range of FP32"),
        ([-3.5e38, 0, 0, 0], "exceed the range of FP32"),
        ([[1, 2, 3, 4], [0, 1e300, 0, 0]], "exceed the range of FP32"),
    ],
)
def test_simple_api_refuses_values_out_of_the_input_range(server, data, fragment):
    r = httpx.post(f"{server.url}/infer", json={"data": data})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]


def test_simple_api_refuses_integers_out_of_an_integer_input_range(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["b"])],
        "ident",
        [helper.make_tensor_value_info("a", TensorProto.INT8, ["N", 2])],
        [helper.make_tensor_value_info("b", TensorProto.INT8, ["N", 2])],
    )
    path = save_model(graph, tmp_path / "int8.onnx")
    with running_server(make_settings(path, model_name="i8")) as running:
        big = httpx.post(f"{running.url}/infer", json={"data": [300, 1]})
        fine = httpx.post(f"{running.url}/infer", json={"data": [-128, 127]})
    assert big.status_code == 400 and "[-128, 127]" in big.json()["error"], big.text
    assert fine.status_code == 200 and fine.json()["result"] == [-128, 127]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "nan", "inf"])
@pytest.mark.parametrize("path", ["/infer", "/v2/models/tiny/infer"])
def test_nan_and_infinity_literals_are_not_json(server, literal, path):
    if path == "/infer":
        body = f'{{"data": [{literal}, 0, 0, 0]}}'
    else:
        body = f'{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [{literal}, 0, 0, 0]}}]}}'
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "not valid JSON" in r.json()["error"]


@pytest.mark.parametrize("path", ["/infer", "/v2/models/tiny/infer"])
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "image/png", "multipart/form-data; boundary=x"]
)
def test_non_json_content_types_are_415(server, path, content_type):
    body = {"data": [1, 2, 3, 4]} if path == "/infer" else {"inputs": [X_OK]}
    r = httpx.post(server.url + path, content=json.dumps(body), headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["error"]


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_content_types_and_none_are_accepted(server, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    simple = httpx.post(f"{server.url}/infer", content=json.dumps({"data": [1, 2, 3, 4]}), headers=headers)
    v2 = httpx.post(f"{server.url}/v2/models/tiny/infer", content=json.dumps({"inputs": [X_OK]}), headers=headers)
    assert simple.status_code == 200 and simple.json()["result"] == [10.0, 10.0, 10.0], simple.text
    assert v2.status_code == 200, v2.text


def test_binary_extension_may_be_sent_as_octet_stream(server):
    content, headers = binary_request([1, 4], np.arange(4, dtype="<f4").tobytes())
    headers["content-type"] = "application/octet-stream"
    r = httpx.post(f"{server.url}/v2/models/tiny/infer", content=content, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [6.0, 6.0, 6.0]


async def test_a_model_that_failed_to_load_is_a_503_without_the_runtime_error(tmp_path, caplog):
    (tmp_path / "repo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "1" / "model.onnx").write_bytes(b"\x00garbage")
    with running_server(make_settings(tmp_path / "repo"), wait_ready=False) as running:
        running.wait_scanned()
        async with httpx.AsyncClient(base_url=running.url, timeout=10) as client:
            latest = await client.post("/infer", json={"data": [1, 2, 3, 4]})
            pinned = await client.post("/v2/models/tiny/versions/1/infer", json={"inputs": [X_OK]})
            ready = await client.get("/health/ready")
    assert ready.status_code == 503 and "version 1 failed to load" in ready.json()["reason"]
    # The diagnosis is in the log, where operators look; the public port names nothing internal.
    assert any("ONNX" in r.getMessage() for r in caplog.records if "failed to load" in r.getMessage())
    for r in (latest, pinned):
        assert r.status_code == 503
        assert "version 1 failed to load" in r.json()["error"]
    for r in (latest, pinned, ready):
        assert "ONNX" not in r.text and str(tmp_path) not in r.text


@pytest.mark.parametrize("binary", [True, False])
def test_an_output_requested_twice_is_a_400_before_any_work(server, binary):
    """One output asked for 10,000 times turned a 0.6 MB request into a 961 MB answer."""
    outputs = [{"name": "y", "parameters": {"binary_data": binary}}] * 10_000
    with httpx.Client(base_url=server.url) as client:
        response = client.post("/v2/models/tiny/infer", json={"inputs": [X_OK], "outputs": outputs})
    assert response.status_code == 400, response.text[:200]
    assert "['y'] requested more than once" in response.json()["error"]
    assert len(response.content) < 1000


def test_a_response_over_the_memory_budget_is_refused_and_binary_still_served(tmp_path):
    path = affine_model(tmp_path / "repo" / "1" / "model.onnx", np.ones((4, 64), np.float32), np.zeros(64, np.float32))
    settings = make_settings(path.parent.parent, max_delay_ms=0, parse_memory_bytes=2 << 20, max_body_bytes=1 << 20)
    rows = 2_000  # 128,000 output numbers: up to 3 MB as JSON, 512 kB binary
    blob = np.ones((rows, 4), np.float32).tobytes()
    content, headers = binary_request([rows, 4], blob)
    with running_server(settings) as running, httpx.Client(base_url=running.url) as client:
        as_json = client.post("/v2/models/tiny/infer", content=content, headers=headers)
        assert as_json.status_code == 400, as_json.text[:200]
        assert "binary" in as_json.json()["error"] and "MiB" in as_json.json()["error"]
        header = json.loads(content[: int(headers["Inference-Header-Content-Length"])])
        header["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
        head = json.dumps(header).encode()
        as_binary = client.post(
            "/v2/models/tiny/infer",
            content=head + blob,
            headers={**headers, "Inference-Header-Content-Length": str(len(head))},
        )
        assert as_binary.status_code == 200
        size = json.loads(as_binary.content[: int(as_binary.headers["Inference-Header-Content-Length"])])
        assert size["outputs"][0]["parameters"]["binary_data_size"] == rows * 64 * 4


@pytest.mark.parametrize("shape", [[True, 4], ["1", 4], [1.0, 4], [None, 4]])
def test_a_shape_of_anything_but_integers_is_a_400(server, shape):
    with httpx.Client(base_url=server.url) as client:
        response = client.post("/v2/models/tiny/infer", json={"inputs": [{**X_OK, "shape": shape}]})
    assert response.status_code in (400, 422), response.text
    assert "shape" in response.text


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_binary_output_flags_take_json_booleans_only(server, value):
    """ "binary_data_output": "false" used to return binary."""
    with httpx.Client(base_url=server.url) as client:
        top = client.post("/v2/models/tiny/infer", json={"inputs": [X_OK], "parameters": {"binary_data_output": value}})
        per_output = client.post(
            "/v2/models/tiny/infer",
            json={"inputs": [X_OK], "outputs": [{"name": "y", "parameters": {"binary_data": value}}]},
        )
    for response, name in ((top, "binary_data_output"), (per_output, "binary_data")):
        assert response.status_code == 400, response.text
        assert f"parameter {name} must be true or false" in response.json()["error"]


@pytest.mark.parametrize("path", ["/v2/models/tiny/infer", "/infer"])
def test_deeply_nested_data_is_a_400_not_a_500(server, path):
    deep = "[" * 978 + '"a"' + "]" * 978
    if path == "/infer":
        body = '{"data": ' + deep + "}"
    else:
        body = '{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ' + deep + "}]}"
    with httpx.Client(base_url=server.url) as client:
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text[:300]


def bytes_body(count: int, element: bytes = b"ab") -> tuple[bytes, dict[str, str]]:
    blob = (len(element).to_bytes(4, "little") + element) * count
    return binary_request([count], blob, datatype="BYTES")


def test_binary_bytes_elements_are_counted_before_decoding():
    """One 63 MiB binary BYTES tensor of 2-byte elements peaked at 844 MiB: one Python object
    per element. The estimate now counts them, so a body too costly for the budget is a 413
    before any is made, and a request over the element limit is a 413 too."""
    from model_server.bodies import estimate_parse_bytes
    from model_server.errors import PayloadTooLarge, status_of
    from model_server.protocol_v2 import estimate_request_bytes
    from model_server.tensors import BYTES_ELEMENT_BYTES, MAX_BYTES_ELEMENTS, decode_binary_tensor

    content, headers = bytes_body(100_000)
    estimate = estimate_request_bytes(content, headers["Inference-Header-Content-Length"])
    assert estimate >= 100_000 * BYTES_ELEMENT_BYTES > estimate_parse_bytes(content) / 2
    with pytest.raises(Exception, match="over the limit") as refused:
        decode_binary_tensor("x", "BYTES", [MAX_BYTES_ELEMENTS + 1], b"")
    assert isinstance(refused.value, PayloadTooLarge) and status_of(refused.value) == 413


def test_a_bytes_body_whose_elements_exceed_the_budget_is_a_413_without_decoding(tmp_path):
    from model_server.tensors import MAX_BYTES_ELEMENTS

    path = affine_model(tmp_path / "repo" / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    settings = make_settings(path.parent.parent, parse_memory_bytes=32 << 20, max_body_bytes=8 << 20)
    with running_server(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        content, headers = bytes_body(1_000_000)  # 6 MB of body, ~100 MB once decoded
        response = client.post("/v2/models/tiny/infer", content=content, headers=headers)
        assert response.status_code == 413, response.text[:300]
        content, headers = bytes_body(MAX_BYTES_ELEMENTS + 1, b"")
        response = client.post("/v2/models/tiny/infer", content=content, headers=headers)
        assert response.status_code == 413, response.text[:300]

"""Property test: whatever a client sends, the answer is never a 5xx."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testsupport.onnx_models import affine_model

from .helpers import make_settings, running_server

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=16,
)
DATATYPES = st.sampled_from(["FP32", "FP64", "FP16", "INT64", "INT8", "UINT8", "BOOL", "BYTES", "FP8", ""])
TENSOR = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y", ""]),
        "shape": st.lists(st.integers(-2, 6), max_size=3) | JSON,
        "datatype": DATATYPES,
        "data": st.lists(st.floats(-10, 10), max_size=12) | JSON,
    },
    optional={"parameters": st.dictionaries(st.sampled_from(["binary_data_size", "x"]), JSON, max_size=2)},
)
SIMPLE = st.fixed_dictionaries(
    {"data": st.lists(st.floats(-10, 10), min_size=0, max_size=8) | JSON},
    optional={"model_version": st.none() | st.integers(-1, 3) | st.text(max_size=3)},
)
V2 = st.fixed_dictionaries(
    {"inputs": st.lists(TENSOR, max_size=2) | JSON},
    optional={
        "outputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["y", "z"])}), max_size=2),
        "parameters": st.dictionaries(st.sampled_from(["binary_data_output"]), JSON, max_size=1),
        "id": JSON,
    },
)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = affine_model(
        tmp_path_factory.mktemp("fuzz") / "repo" / "1" / "model.onnx",
        np.ones((4, 3), np.float32),
        np.zeros(3, np.float32),
    )
    with running_server(make_settings(path.parent.parent, max_delay_ms=0)) as running:
        with httpx.Client(base_url=running.url, timeout=10) as http:
            yield http


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=SIMPLE | JSON, raw=st.booleans())
def test_simple_api_never_answers_5xx(client, body, raw):
    content = json.dumps(body).encode() if not raw else json.dumps(body)[:-1].encode()
    r = client.post("/infer", content=content, headers={"content-type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=V2 | JSON, header=st.none() | st.integers(-5, 400).map(str) | st.just("abc"))
def test_v2_infer_never_answers_5xx(client, body, header):
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if header is not None:
        headers["Inference-Header-Content-Length"] = header
        content += b"\x00" * 16
    r = client.post("/v2/models/tiny/infer", content=content, headers=headers)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]

"""The inference POSTs answered in front of FastAPI: which requests take that path,
and that every answer (success or error) is the one the framework path gives."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from model_server.fastpath import FastRoute, InferenceFastPath
from testsupport.onnx_models import affine_model

from .helpers import make_settings, running_server


class Downstream:
    def __init__(self) -> None:
        self.paths: list[tuple[str, str]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.paths.append((scope.get("method", scope["type"]), scope.get("path", "")))


async def test_only_posts_to_the_inference_paths_take_the_fast_path():
    called: list[tuple[str, dict]] = []

    def endpoint(label):
        async def run(request, params):
            called.append((label, params))
            from starlette.responses import Response

            return Response(b"ok")

        return run

    downstream = Downstream()
    fast = InferenceFastPath(
        downstream,
        routes=[
            FastRoute("/infer", endpoint("simple")),
            FastRoute("/v2/models/{name}/infer", endpoint("model")),
            FastRoute("/v2/models/{name}/versions/{version}/infer", endpoint("version")),
        ],
        max_body_bytes=1000,
    )
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    def scope(method: str, path: str) -> dict:
        return {"type": "http", "method": method, "path": path, "headers": [], "root_path": ""}

    for method, path in [
        ("POST", "/infer"),
        ("POST", "/v2/models/m.1/infer"),
        ("POST", "/v2/models/m/versions/3/infer"),
        ("GET", "/v2/models/m/infer"),  # 405 is the framework's answer
        ("POST", "/infer/"),  # redirect_slashes is the framework's
        ("POST", "/v2/models/a/b/infer"),
        ("POST", "/v2/models//infer"),
        ("POST", "/v2/models/m/inferx"),
        ("POST", "/docs"),
    ]:
        await fast(scope(method, path), receive, send)
    await fast({"type": "lifespan"}, receive, send)
    assert called == [("simple", {}), ("model", {"name": "m.1"}), ("version", {"name": "m", "version": "3"})]
    assert downstream.paths == [
        ("GET", "/v2/models/m/infer"),
        ("POST", "/infer/"),
        ("POST", "/v2/models/a/b/infer"),
        ("POST", "/v2/models//infer"),
        ("POST", "/v2/models/m/inferx"),
        ("POST", "/docs"),
        ("lifespan", ""),
    ]

    too_big = scope("POST", "/infer") | {"headers": [(b"content-length", b"1001")]}
    sent.clear()
    await fast(too_big, receive, send)
    assert len(called) == 3 and sent[0]["status"] == 413


V2 = "/v2/models/tiny/infer"
CASES = [
    ("POST", "/infer", {"json": {"data": [1, 2, 3, 4]}}),
    ("POST", "/infer", {"json": {"data": [[1, 2, 3, 4], [5, 6, 7, 8]], "model_version": "1"}}),
    ("POST", V2, {"json": {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}}),
    (
        "POST",
        "/v2/models/tiny/versions/1/infer",
        {"json": {"id": "a", "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}},
    ),
    (
        "POST",
        "/v2/models/tiny/versions/7/infer",
        {"json": {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}},
    ),
    ("POST", "/v2/models/other/infer", {"json": {"inputs": []}}),
    ("POST", V2, {"json": {"inputs": []}}),
    ("POST", V2, {"content": b"{not json"}),
    (
        "POST",
        V2,
        {"content": b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [NaN, 1, 2, 3]}]}'},
    ),
    ("POST", V2, {"json": {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}}),
    (
        "POST",
        V2,
        {
            "json": {
                "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                "outputs": [{"name": "nope"}],
            }
        },
    ),
    ("POST", "/infer", {"content": b"data=1", "headers": {"content-type": "application/x-www-form-urlencoded"}}),
    ("POST", "/infer", {"content": b'{"data": [' + b"1," * 600 + b"1]}"}),  # over max-body-bytes
    ("POST", "/infer", {"chunks": [b'{"data": [', b"1," * 600, b"1]}"]}),  # chunked, over the limit
    ("POST", "/infer", {"json": {"data": []}}),
    ("GET", V2, {}),
    ("POST", "/infer/", {"json": {"data": [1, 2, 3, 4]}}),
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    rng = np.random.default_rng(3)
    repo = tmp_path_factory.mktemp("fastpath") / "repo"
    affine_model(repo / "1" / "model.onnx", rng.standard_normal((4, 3)), rng.standard_normal(3))
    settings = make_settings(repo, max_body_bytes=1024)
    with running_server(settings) as fast, running_server(settings) as framework:
        framework.app.fast_path = None
        yield fast, framework


@pytest.mark.parametrize(("method", "path", "kwargs"), CASES, ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(CASES)])
def test_fast_path_answers_exactly_as_the_framework(servers, method, path, kwargs):
    replies = []
    for running in servers:
        sent = dict(kwargs)
        if "chunks" in sent:
            sent["content"] = iter(sent.pop("chunks"))
        replies.append(httpx.request(method, running.url + path, follow_redirects=False, **sent))
    fast, framework = replies
    assert fast.status_code == framework.status_code
    for header in ("content-type", "retry-after", "connection", "allow"):
        assert fast.headers.get(header) == framework.headers.get(header), header
    assert httpx.URL(fast.headers.get("location", "")).path == httpx.URL(framework.headers.get("location", "")).path
    if fast.headers.get("content-type") == "application/json":
        a, b = json.loads(fast.content), json.loads(framework.content)
        if isinstance(a, dict):
            a.pop("latency_ms", None)
            b.pop("latency_ms", None)
        assert a == b
    else:
        assert fast.content == framework.content


def test_both_paths_count_requests_in_the_same_metrics(servers):
    fast, _ = servers
    labels = {"model": "tiny", "version": "1", "code": "200"}
    before = fast.metric("model_server_requests_total", labels) or 0
    assert httpx.post(fast.url + "/infer", json={"data": [1, 2, 3, 4]}).status_code == 200
    assert fast.metric("model_server_requests_total", labels) == before + 1

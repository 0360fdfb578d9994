"""The data plane without HTTP: a body in, an answer or a typed error out; the inference routes
in one table served by both front ends; every typed error with its HTTP answer in one module."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry

from model_server import errors
from model_server.api.errors import error_response
from model_server.api.routes import INFERENCE_ROUTES
from model_server.app import create_app
from model_server.bodies import BodyDecoder, RequestBody
from model_server.dataplane import DataPlane
from model_server.errors import status_of
from model_server.metrics import RequestTracker
from model_server.protocol_v2 import split_body
from testsupport.onnx_models import affine_model

from .helpers import make_settings


def body(*chunks: bytes) -> RequestBody:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def read() -> bytes:
        return b"".join(chunks)

    return RequestBody(sum(map(len, chunks)), read, stream)


class NotLoaded:
    """A repository whose model has not loaded yet."""

    def resolve(self, version: str | None) -> object:
        raise errors.ModelNotReady("model 'tiny' is loading")


@pytest.fixture
def dataplane(tmp_path: Path) -> DataPlane:
    settings = make_settings(tmp_path)
    return DataPlane(settings, NotLoaded(), BodyDecoder(parse_bytes=1 << 20, max_body_bytes=1 << 16))  # type: ignore[arg-type]


V2_BODY = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'


@pytest.mark.parametrize(
    ("model", "media_type", "chunks", "error"),
    [
        ("other", None, [V2_BODY], errors.ModelNotFound),
        ("tiny", "text/plain", [V2_BODY], errors.UnsupportedMediaType),
        ("tiny", None, [b"{not json"], errors.InvalidInput),
        ("tiny", None, [b'{"inputs": []}'], errors.UnprocessableInput),
        ("tiny", "application/json", [V2_BODY[:20], V2_BODY[20:]], errors.ModelNotReady),  # parsed, then resolved
    ],
)
async def test_the_core_answers_with_typed_errors_and_no_http(
    dataplane: DataPlane, model: str, media_type: str | None, chunks: list[bytes], error: type[Exception]
) -> None:
    tracker = RequestTracker()
    with pytest.raises(error) as raised:
        await dataplane.infer(model, None, body(*chunks), media_type, None, tracker)
    assert not hasattr(raised.value, "status") and not hasattr(raised.value, "headers")
    assert tracker.code == 200  # the HTTP layer, not the core, records the status


@pytest.mark.parametrize(
    ("header_length", "fragment"),
    [
        ("1_0", "is not an integer"),
        ("+5", "is not an integer"),
        ("-5", "is not an integer"),
        ("\u0665", "is not an integer"),  # an Arabic-Indic five: int() reads it as 5
        ("", "is not an integer"),
        ("0", "does not fit a body of 4 bytes"),
        ("5", "does not fit a body of 4 bytes"),
    ],
)
def test_the_binary_header_length_is_ascii_digits_within_the_body(header_length: str, fragment: str) -> None:
    with pytest.raises(errors.InvalidInput, match=fragment):
        split_body(memoryview(b"{}ab"), header_length)
    header, tail = split_body(memoryview(b"{}ab"), "2")
    assert (bytes(header), bytes(tail)) == (b"{}", b"ab")


def test_every_typed_error_has_its_http_answer_in_one_table() -> None:
    typed = [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.ServerError) and cls is not errors.ServerError
    ]
    assert len(typed) >= 12
    for cls in typed:
        assert 400 <= status_of(cls.__new__(cls)) < 500 or status_of(cls.__new__(cls)) == 503, cls
    assert (status_of(errors.QueueFull("full", 3)), status_of(errors.Busy()), status_of(errors.ShuttingDown())) == (
        429,
        503,
        503,
    )
    assert error_response(errors.QueueFull("full", 3)).headers["retry-after"] == "3"
    draining = error_response(errors.ShuttingDown())
    assert (draining.headers["retry-after"], draining.headers["connection"]) == ("1", "close")


def test_each_inference_route_is_registered_once_and_served_by_both_fronts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    affine_model(tmp_path / "1" / "model.onnx", rng.standard_normal((4, 3)), rng.standard_normal(3))
    app = create_app(make_settings(tmp_path), registry=CollectorRegistry(), gpu_reader=None)
    posts = [r for r in app.routes if isinstance(r, APIRoute) and "POST" in r.methods]
    table = [route.path for route in INFERENCE_ROUTES]
    assert sorted(r.path for r in posts) == sorted(table)  # every POST the framework has is in the table
    assert len(set(table)) == len(table)
    assert app.fast_path is not None
    assert [route.path for route in app.fast_path.routes] == table

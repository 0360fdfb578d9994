"""The seed's API, kept for existing clients:
`POST /infer {"data": [...], "model_version": "latest"}`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from ..errors import InvalidInput
from ..tensors import shape_simple_rows, simple_array
from .common import (
    INFER_ERRORS,
    AppState,
    State,
    check_content_type,
    documented_body,
    json_response,
    parse_body,
    submit,
)

router = APIRouter(tags=["simple"])


class SimpleRequest(BaseModel):
    # minItems documents what decode_simple_rows enforces (with a 400 naming the problem).
    data: list[Any] = Field(
        json_schema_extra={"minItems": 1}, description="One row as a flat list of numbers, or a list of rows."
    )
    model_version: str | int | None = "latest"


class SimpleResponse(BaseModel):
    result: list[Any]
    latency_ms: float
    model_version: str


def decode_simple(body: bytes | bytearray) -> tuple[SimpleRequest, np.ndarray]:
    """The request and its `data` as FP64 (the model's dtype is applied later);
    the JSON lists are dropped as soon as the array exists."""
    request = parse_body(SimpleRequest, body)
    data = simple_array(request.data)
    request.data = []
    return request, data


@router.post(
    "/infer",
    response_model=SimpleResponse,
    responses=INFER_ERRORS,
    openapi_extra=documented_body(SimpleRequest),
)
async def infer(request: Request, state: State) -> Response:
    """Rows in, first output's rows out (a flat row in gives one row out)."""
    return await run_infer(state, request)


async def run_infer(state: AppState, request: Request) -> Response:
    """The handler, also answered in front of the framework (fastpath.py)."""
    started = time.perf_counter()
    with state.metrics.track(state.settings.name) as tracker:
        check_content_type(request.headers.get("content-type"))
        body, data = await state.bodies.decode(request, decode_simple)
        version = None if body.model_version is None else str(body.model_version)
        served = state.repository.resolve(version)
        tracker.version = served.version
        if len(served.inputs) != 1:
            raise InvalidInput(
                f"model has {len(served.inputs)} inputs; /infer feeds exactly one, use "
                f"/v2/models/{state.settings.name}/infer"
            )
        spec = served.inputs[0]
        rows = shape_simple_rows(data, spec)
        outputs = await submit(served, {spec.name: rows})
        first = next(iter(outputs.values()))
        single = data.ndim == 1 and rows.shape[0] == 1 and first.ndim >= 2
        result = first[0] if single else first
        return json_response(
            {
                "result": result,
                "latency_ms": (time.perf_counter() - started) * 1000.0,
                "model_version": served.version,
            }
        )

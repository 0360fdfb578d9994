"""The seed's API as data, kept for existing clients: `{"data": [...], "model_version":
"latest"}` in, `{"result": [...], "latency_ms": ..., "model_version": ...}` out."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, Field, StrictInt, StrictStr

from .jsoncodec import parse_body
from .tensors import simple_array


class SimpleRequest(BaseModel):
    # minItems documents what decode_simple_rows enforces (with a 400 naming the problem).
    data: list[Any] = Field(
        json_schema_extra={"minItems": 1}, description="One row as a flat list of numbers, or a list of rows."
    )
    # JSON strings and integers only: `true` must not select version 1, nor 1.0 pass for it.
    model_version: StrictStr | StrictInt | None = "latest"


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

"""The Open Inference Protocol (KServe v2) as data: its request and response bodies, decoded
to arrays and encoded from them, with JSON tensors (flat row-major or nested `data`) and the
binary tensor data extension (a JSON header of `header_length` bytes, then raw tensors). No
transport: the HTTP routes pass the body and the header length in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, Field, StrictInt, field_validator

from .bodies import estimate_parse_bytes
from .errors import InvalidInput
from .jsoncodec import dumps, parse_body
from .tensors import (
    BYTES_ELEMENT_BYTES,
    MAX_BYTES_ELEMENTS,
    decode_binary_tensor,
    decode_json_tensor,
    encode_binary_tensor,
    encode_json_tensor,
    encoded_size,
    v2_datatype,
)

EXTENSIONS = ["binary_tensor_data"]


class TensorInput(BaseModel):
    name: str
    shape: list[StrictInt]  # JSON integers only: true or "1" is no dimension
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None

    @field_validator("shape", mode="before")
    @classmethod
    def _wide_integers(cls, value: Any) -> Any:
        """The JSON parser gives integers beyond 64 bits as floats: turn the integral
        ones back into ints, so the shape check refuses them by name (400)."""
        if isinstance(value, list):
            return [int(d) if isinstance(d, float) and d.is_integer() and abs(d) >= 2**63 else d for d in value]
        return value


class RequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[TensorInput] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = None


def json_type(value: object) -> str:
    return {str: "a string", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), "null" if value is None else "a value"
    )


def _flag(params: dict[str, Any] | None, name: str) -> bool:
    """A boolean parameter: absent is false, anything but a JSON boolean is a 400 (the string
    "false" must not mean true)."""
    value = (params or {}).get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter {name} must be true or false, got {json_type(value)}")
    return value


def _binary_requested(params: dict[str, Any] | None) -> bool:
    return _flag(params, "binary_data")


@dataclass(slots=True)  # not frozen: made once per request, and frozen fields cost a setattr each
class Answer:
    """An encoded response: its bytes, their media type and, for the binary extension, the
    length of the JSON header in front of the raw tensors."""

    body: bytes
    media_type: str = "application/json"
    header_length: int | None = None


def decode_request(
    body: bytes | bytearray, header_length: str | None
) -> tuple[InferenceRequest, dict[str, np.ndarray]]:
    """A whole request body -> the request (without its JSON tensor data) and its arrays."""
    header, binary = split_body(memoryview(body), header_length)
    req = parse_body(InferenceRequest, header)
    return req, decode_inputs(req, binary)


def estimate_request_bytes(body: bytes | bytearray, header_length: str | None) -> int:
    """What decoding a request takes: the JSON estimate of its header, and for a binary tail a
    copy of it plus, per BYTES element the header announces, one Python object (one byte per
    element used to cost a hundred times its size)."""
    if header_length is None:
        return estimate_parse_bytes(body)
    try:
        header, tail = split_body(memoryview(body), header_length)
        document = orjson.loads(header)
    except (InvalidInput, orjson.JSONDecodeError):
        return estimate_parse_bytes(body)  # decoding refuses it before any work
    cost = estimate_parse_bytes(header) + 2 * len(tail)
    inputs = document.get("inputs") if isinstance(document, dict) else None
    for tensor in inputs if isinstance(inputs, list) else []:
        if isinstance(tensor, dict) and tensor.get("datatype") == "BYTES" and isinstance(tensor.get("shape"), list):
            dims = tensor["shape"]
            if all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in dims):
                cost += min(math.prod(dims), MAX_BYTES_ELEMENTS + 1) * BYTES_ELEMENT_BYTES
    return cost


def split_body(body: memoryview, header_length: str | None) -> tuple[memoryview, memoryview]:
    """JSON header and binary tail of a binary-extension request."""
    if header_length is None:
        return body, body[:0]
    # ASCII digits only: int() would also read "1_0" as 10, "+5" as 5 and other scripts' digits.
    if not (header_length.isascii() and header_length.isdigit()):
        raise InvalidInput(f"Inference-Header-Content-Length '{header_length}' is not an integer")
    length = int(header_length)
    if not 0 < length <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length {length} does not fit a body of {len(body)} bytes")
    return body[:length], body[length:]


def decode_inputs(req: InferenceRequest, binary: bytes | memoryview) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    view = memoryview(binary)
    for tensor in req.inputs:
        if tensor.name in arrays:
            raise InvalidInput(f"input '{tensor.name}' is given twice")
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InvalidInput(
                    f"input '{tensor.name}': binary_data_size {size!r} does not fit the "
                    f"{len(binary)} bytes of binary data"
                )
            arrays[tensor.name] = decode_binary_tensor(
                tensor.name, tensor.datatype, tensor.shape, view[offset : offset + size]
            )
            offset += size
        else:
            arrays[tensor.name] = decode_json_tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data)
            tensor.data = None  # the JSON lists take several times the array's memory
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data belong to no input")
    return arrays


def encode_response(
    req: InferenceRequest, model: str, version: str, outputs: dict[str, np.ndarray], limit: int
) -> Answer:
    """The response to `req`, refused (400) when it would take more than `limit` bytes."""
    selected = _selected_outputs(req, outputs)
    size = sum(encoded_size(outputs[n], as_binary) for n, as_binary in selected)
    if size > limit:  # the same memory budget as request bodies
        raise InvalidInput(
            f"the response would take about {size >> 20} MiB, over this server's {limit >> 20} MiB: "
            "ask for binary outputs (binary_data) or send fewer rows"
        )
    tensors = []
    blobs = []
    for out_name, as_binary in selected:
        arr = outputs[out_name]
        if as_binary:
            blob = encode_binary_tensor(arr)
            encoded: dict[str, Any] = {
                "name": out_name,
                "datatype": v2_datatype(arr.dtype),
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
            blobs.append(blob)
        else:
            encoded = encode_json_tensor(out_name, arr)
        tensors.append(encoded)
    payload: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": tensors}
    if req.id is not None:
        payload["id"] = req.id
    if not blobs:
        return Answer(dumps(payload))
    header = dumps(payload)
    return Answer(header + b"".join(blobs), "application/octet-stream", len(header))


def _selected_outputs(req: InferenceRequest, outputs: dict[str, np.ndarray]) -> list[tuple[str, bool]]:
    """(name, as binary) of each output to send, in order."""
    binary_default = _binary_requested(req.parameters) or _flag(req.parameters, "binary_data_output")
    if req.outputs:
        selected = [(o.name, _binary_requested(o.parameters) or binary_default) for o in req.outputs]
    else:
        selected = [(n, binary_default) for n in outputs]
    for out_name, _ in selected:
        if out_name not in outputs:
            raise InvalidInput(f"unknown output '{out_name}'; model outputs are {list(outputs)}")
    return selected

"""Open Inference Protocol (KServe v2) REST endpoints, so KServe and Triton
clients work unchanged. Supports JSON tensors (flat row-major or nested `data`)
and the binary tensor data extension (`Inference-Header-Content-Length`)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictInt, field_validator
from starlette.responses import Response

from .. import __version__
from ..bodies import estimate_parse_bytes
from ..discovery import version_key
from ..errors import InvalidInput, ModelNotFound, ServerError
from ..repository import ServedVersion
from ..tensors import (
    BYTES_ELEMENT_BYTES,
    MAX_BYTES_ELEMENTS,
    decode_binary_tensor,
    decode_json_tensor,
    encode_binary_tensor,
    encode_json_tensor,
    encoded_size,
    v2_datatype,
)
from .common import (
    INFER_ERRORS,
    AppState,
    State,
    check_content_type,
    documented_body,
    dumps,
    error_responses,
    json_response,
    parse_body,
    submit,
)

router = APIRouter(prefix="/v2", tags=["v2"])

HEADER_LENGTH = "inference-header-content-length"
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


# --------------------------------------------------------------------------- server


@router.get("")
async def server_metadata() -> Response:
    return json_response({"name": "model-server", "version": __version__, "extensions": EXTENSIONS})


@router.get("/health/live")
async def server_live() -> Response:
    return json_response({"live": True})


@router.get("/health/ready", responses=error_responses(400))
async def server_ready(state: State) -> Response:
    """Per the protocol, a 4xx status means "not ready"."""
    ok, reason = state.readiness()
    body: dict[str, Any] = {"ready": ok}
    if reason:
        body["reason"] = reason
    return json_response(body, status=200 if ok else 400)


# --------------------------------------------------------------------------- model


def _check_name(state: State, name: str) -> None:
    if name != state.settings.name:
        raise ModelNotFound(f"unknown model '{name}'; this server serves '{state.settings.name}'")


def _metadata(state: State, served: ServedVersion) -> dict[str, Any]:
    return {
        "name": state.settings.name,
        "versions": sorted(state.repository.served, key=version_key),
        "platform": served.backend.platform,
        "inputs": [s.metadata() for s in served.inputs],
        "outputs": [s.metadata() for s in served.outputs],
    }


@router.get("/models/{name}", responses=error_responses(404, 503))
async def model_metadata(name: str, state: State) -> Response:
    _check_name(state, name)
    return json_response(_metadata(state, state.repository.resolve(None)))


@router.get("/models/{name}/versions/{version}", responses=error_responses(404, 503))
async def version_metadata(name: str, version: str, state: State) -> Response:
    _check_name(state, name)
    return json_response(_metadata(state, state.repository.resolve(version)))


def _model_ready(state: State, name: str, version: str | None) -> Response:
    _check_name(state, name)
    try:
        state.repository.resolve(version)
    except ModelNotFound:
        raise
    except ServerError as exc:
        return json_response({"name": name, "ready": False, "reason": str(exc)}, status=400)
    if state.draining:
        return json_response({"name": name, "ready": False, "reason": "shutting down"}, status=400)
    return json_response({"name": name, "ready": True})


@router.get("/models/{name}/ready", responses=error_responses(400, 404))
async def model_ready(name: str, state: State) -> Response:
    return _model_ready(state, name, None)


@router.get("/models/{name}/versions/{version}/ready", responses=error_responses(400, 404))
async def version_ready(name: str, version: str, state: State) -> Response:
    return _model_ready(state, name, version)


# --------------------------------------------------------------------------- infer


_INFER_DOC = documented_body(InferenceRequest)


@router.post("/models/{name}/infer", responses=INFER_ERRORS, openapi_extra=_INFER_DOC)
async def model_infer(name: str, request: Request, state: State) -> Response:
    return await run_infer(state, request, name, None)


@router.post("/models/{name}/versions/{version}/infer", responses=INFER_ERRORS, openapi_extra=_INFER_DOC)
async def version_infer(name: str, version: str, request: Request, state: State) -> Response:
    return await run_infer(state, request, name, version)


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
    element used to cost a hundred: a 63 MiB body of 2-byte elements peaked at 844 MiB)."""
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
    try:
        length = int(header_length)
    except ValueError:
        raise InvalidInput(f"Inference-Header-Content-Length '{header_length}' is not an integer") from None
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


async def run_infer(state: AppState, request: Request, name: str, version: str | None = None) -> Response:
    """The handler of both infer routes, also answered in front of the framework (fastpath.py)."""
    with state.metrics.track(state.settings.name) as tracker:
        _check_name(state, name)
        check_content_type(request.headers.get("content-type"), binary=True)
        header_length = request.headers.get(HEADER_LENGTH)
        req, arrays = await state.bodies.decode(
            request,
            lambda body: decode_request(body, header_length),
            lambda body: estimate_request_bytes(body, header_length),
        )
        served = state.repository.resolve(version)
        tracker.version = served.version
        wanted = req.outputs
        known = [s.name for s in served.outputs]
        if wanted:
            repeated = sorted(n for n, count in Counter(o.name for o in wanted).items() if count > 1)
            if repeated:  # each would be encoded again: a small request for a huge answer
                raise InvalidInput(f"output(s) {repeated} requested more than once")
        if wanted and known:
            unknown = [o.name for o in wanted if o.name not in known]
            if unknown:
                raise InvalidInput(f"unknown output(s) {unknown}; model outputs are {known}")
        outputs = await submit(served, arrays)
        return _response(state, req, served, outputs)


def _response(state: State, req: InferenceRequest, served: ServedVersion, outputs: dict[str, np.ndarray]) -> Response:
    binary_default = _binary_requested(req.parameters) or _flag(req.parameters, "binary_data_output")
    if req.outputs:
        selected = [(o.name, _binary_requested(o.parameters) or binary_default) for o in req.outputs]
    else:
        selected = [(n, binary_default) for n in outputs]
    for out_name, _ in selected:
        if out_name not in outputs:
            raise InvalidInput(f"unknown output '{out_name}'; model outputs are {list(outputs)}")
    size = sum(encoded_size(outputs[n], as_binary) for n, as_binary in selected)
    limit = state.settings.parse_memory_bytes
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
    payload: dict[str, Any] = {
        "model_name": state.settings.name,
        "model_version": served.version,
        "outputs": tensors,
    }
    if req.id is not None:
        payload["id"] = req.id
    if not blobs:
        return json_response(payload)
    header = dumps(payload)
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )

"""The Open Inference Protocol's gRPC messages as data: a `ModelInferRequest` decoded to arrays
(its `raw_input_contents`, or each tensor's typed `contents`) and arrays encoded into a
`ModelInferResponse` (always `raw_output_contents`, as Triton answers). No transport: what is
wrong with a request is raised as `InvalidInput` with a message that names the tensor, as the
REST protocol's decoding does (protocol_v2.py).

The message classes are generated from grpc_predict_v2.proto (testsupport/grpc_codegen.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import grpc_predict_v2_pb2 as pb
from .errors import InvalidInput
from .tensors import (
    V2_DATATYPES,
    check_bytes_elements,
    check_shape,
    decode_binary_tensor,
    encode_binary_tensor,
    encoded_size,
    v2_datatype,
)

#: Each datatype's field of `InferTensorContents` (FP16 has none: it travels raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
#: What typed values are read as before their range is checked against the datatype's.
WIDE_DTYPES: dict[str, np.dtype] = {
    **{name: np.dtype(np.int64) for name in ("INT8", "INT16", "INT32", "UINT8", "UINT16", "UINT32")},
    "FP32": np.dtype(np.float32),
}


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """What inference needs from a `ModelInferRequest`: its arrays by input name and the
    outputs it asks for (empty: all of the model's)."""

    model: str
    version: str | None
    id: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]


def decode_infer_request(request: pb.ModelInferRequest) -> DecodedRequest:
    """The request's arrays, each checked against its declared datatype and shape."""
    if not request.inputs:
        raise InvalidInput("the request has no inputs")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per input, in order"
        )
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        if tensor.name in arrays:
            raise InvalidInput(f"input '{tensor.name}' is given twice")
        shape = check_shape(tensor.name, list(tensor.shape))
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{tensor.name}': contents and raw_input_contents are both given")
            arrays[tensor.name] = decode_binary_tensor(tensor.name, tensor.datatype, shape, raw[index])
        else:
            arrays[tensor.name] = decode_contents(tensor.name, tensor.datatype, shape, tensor.contents)
    return DecodedRequest(
        model=request.model_name,
        version=request.model_version or None,
        id=request.id,
        inputs=arrays,
        outputs=tuple(output.name for output in request.outputs),
    )


def decode_contents(name: str, datatype: str, shape: tuple[int, ...], contents: pb.InferTensorContents) -> np.ndarray:
    """A tensor sent as typed `contents` -> an array of `shape`; values outside the datatype's
    range (an INT8 of 300 in `int_contents`) are refused, not wrapped."""
    if datatype not in V2_DATATYPES:
        raise InvalidInput(f"input '{name}': unsupported datatype '{datatype}'; supported: {', '.join(V2_DATATYPES)}")
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} has no typed contents; send it in raw_input_contents")
    stray = sorted(f.name for f, _ in contents.ListFields() if f.name != field)
    if stray:
        raise InvalidInput(f"input '{name}' is {datatype}: its values belong in {field}, not {', '.join(stray)}")
    values: Sequence[Any] = getattr(contents, field)
    count = math.prod(shape)
    if datatype == "BYTES":
        check_bytes_elements(name, len(values))
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} values, contents has {len(values)}")
    dtype = V2_DATATYPES[datatype]
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    # Element by element into the array: a list of the values would take 32 bytes per float.
    wide: np.ndarray = np.fromiter(values, dtype=WIDE_DTYPES.get(datatype, dtype), count=count)
    if dtype.kind in "iu" and wide.size:
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidInput(f"input '{name}' is {datatype}: its values must lie in [{info.min}, {info.max}]")
    typed: np.ndarray = wide.astype(dtype, copy=False).reshape(shape)
    return typed


def encode_infer_response(
    decoded: DecodedRequest, model: str, version: str, outputs: dict[str, np.ndarray], limit: int
) -> pb.ModelInferResponse:
    """The answer to `decoded`, its tensors in `raw_output_contents`; refused when it would take
    more than `limit` bytes (the message limit, so the client is told why, not cut off)."""
    names = list(decoded.outputs) or list(outputs)
    size = sum(encoded_size(outputs[name], True) for name in names)
    if size > limit:
        raise InvalidInput(
            f"the response would take {size} bytes, over this server's {limit}-byte message limit: send fewer rows"
        )
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=decoded.id)
    for name in names:
        array = outputs[name]
        response.outputs.add(name=name, datatype=v2_datatype(array.dtype), shape=array.shape)
        response.raw_output_contents.append(encode_binary_tensor(array))
    return response

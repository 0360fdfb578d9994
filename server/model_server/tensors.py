"""Tensor metadata and the conversions between wire formats and numpy.

Everything here is pure: it turns request data into validated arrays (raising
`InvalidInput` with a message that names the offending tensor) and arrays back
into Open Inference Protocol tensors.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidInput, PayloadTooLarge

#: Open Inference Protocol datatypes and their numpy dtypes.
V2_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

_NUMPY_TO_V2 = {dtype: name for name, dtype in V2_DATATYPES.items()}

#: ONNX Runtime type strings -> v2 datatypes.
ORT_TO_V2 = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}

_INT_KINDS = "iu"
_MAX_ERRORS_SHOWN = 1


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, v2 datatype and shape of a model input or output.

    `shape` uses -1 for dynamic dimensions and is None when the runtime does not
    know the rank (e.g. TorchScript without a signature file).
    """

    name: str
    datatype: str
    shape: tuple[int, ...] | None

    @property
    def dtype(self) -> np.dtype:
        try:
            return V2_DATATYPES[self.datatype]
        except KeyError:
            raise InvalidInput(
                f"tensor '{self.name}' has datatype {self.datatype}, which this server cannot exchange over JSON"
            ) from None

    @property
    def has_batch_dim(self) -> bool:
        return self.shape is not None and len(self.shape) >= 1 and self.shape[0] == -1

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.shape) if self.shape is not None else [-1],
        }


def v2_datatype(dtype: np.dtype) -> str:
    """The v2 datatype of a numpy dtype (str_/bytes_ map to BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "USO":
        return "BYTES"
    try:
        return _NUMPY_TO_V2[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no v2 datatype") from None


def normalize_dim(dim: object) -> int:
    """Runtime dims (int, None, symbolic str or SymInt) -> int, with -1 for dynamic."""
    if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 0:
        return int(dim)
    return -1


def is_batchable(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Requests can be stacked only if every tensor has a dynamic leading dimension."""
    if not inputs:
        return False
    return all(s.has_batch_dim for s in inputs) and all(s.shape is None or s.has_batch_dim for s in outputs)


# --------------------------------------------------------------------------- decoding


#: Deeper nesting than any tensor's rank: refused before it can exhaust the interpreter's stack.
MAX_NESTING = 64


def _flatten(data: Any) -> Iterator[Any]:
    """The leaves of nested lists, in order; iterative, so a hostile depth is a 400, not a
    RecursionError (500)."""
    stack: list[Iterator[Any]] = [iter((data,))]
    while stack:
        for item in stack[-1]:
            if isinstance(item, (list, tuple)):
                if len(stack) > MAX_NESTING:
                    raise InvalidInput(f"data is nested more than {MAX_NESTING} lists deep")
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def _valid_element(value: Any, datatype: str) -> bool:
    if datatype == "BOOL":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if datatype in ("FP16", "FP32", "FP64"):
        return isinstance(value, (int, float))
    if datatype == "BYTES":
        return isinstance(value, str)
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _first_bad_element(label: str, data: Any, datatype: str, noun: str) -> InvalidInput:
    for index, value in enumerate(_flatten(data)):
        if not _valid_element(value, datatype):
            return InvalidInput(f"{label}: element {index} ({value!r}) is not {noun}")
    return InvalidInput(f"{label}: data is not a well-formed {datatype} array")


#: Elements per numpy conversion of a large JSON list: each call holds the GIL for
#: tens of milliseconds at most, so the event loop keeps its turn while a big body
#: is decoded in a worker thread.
CONVERT_CHUNK = 1 << 18


def as_array(data: Any) -> np.ndarray:
    """`np.asarray(data)`, converting a long list a slice of rows at a time into
    one preallocated array (no second copy to join the slices)."""
    if isinstance(data, np.ndarray):
        return data
    if not isinstance(data, list) or len(data) < 2:
        return np.asarray(data)
    row = data[0]
    per_row = 1
    while isinstance(row, list) and row:
        per_row *= len(row)
        row = row[0]
    step = max(1, CONVERT_CHUNK // per_row)
    if step >= len(data):
        return np.asarray(data)
    try:
        first = np.asarray(data[:step])
        if first.dtype.kind not in "biuf":
            return np.asarray(data)
        out = np.empty((len(data), *first.shape[1:]), dtype=first.dtype)
        out[:step] = first
        for start in range(step, len(data), step):
            part = np.asarray(data[start : start + step])
            if part.dtype != out.dtype or part.shape[1:] != out.shape[1:]:
                return np.asarray(data)  # mixed types or ragged: the whole list decides
            out[start : start + step] = part
        return out
    except (ValueError, TypeError):
        return np.asarray(data)


def _to_numeric(name: str, data: Any, datatype: str, label: str | None = None) -> np.ndarray:
    """Nested JSON lists -> array of `datatype`, rejecting strings, bools-as-numbers,
    ragged lists, non-integers for integer types and out-of-range values."""
    dtype = V2_DATATYPES[datatype]
    noun = f"a valid {datatype} value"
    if label is None:
        label = f"input '{name}'"
    else:
        noun = "a number"
    try:
        raw = as_array(data)
    except (ValueError, TypeError):
        raise InvalidInput(f"{label}: data is ragged (nested lists of different lengths)") from None
    kind = raw.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _first_bad_element(label, data, datatype, noun)
        return raw
    if kind not in "iuf":
        raise _not_numbers(label, data, datatype, noun)
    if _hides_bools(data, raw):
        raise _first_bad_element(label, data, datatype, noun)
    if dtype.kind in _INT_KINDS:
        return _integers(label, data, raw, datatype, noun)
    if dtype.kind == "f" and dtype != raw.dtype and raw.size and not _floats_in_range(raw, dtype):
        raise InvalidInput(f"{label}: values exceed the range of {datatype}")
    return raw.astype(dtype, copy=False)


def _hides_bools(data: Any, raw: np.ndarray) -> bool:
    """Whether JSON `true`/`false` sits among the numbers of `data`: numpy reads `[1.5, true]` as
    `[1.5, 1.0]` and `[2, false]` as `[2, 0]`. Only an element equal to 0 or 1 can be one, so data
    without any is not walked; the walk types the elements in C, building nothing per row."""
    if isinstance(data, np.ndarray) or not ((raw == 0) | (raw == 1)).any():
        return False
    if not isinstance(data, list):
        return isinstance(data, bool)
    elements: Iterable[Any] = data
    for _ in range(raw.ndim - 1):
        elements = itertools.chain.from_iterable(elements)
    return bool in frozenset(map(type, elements))


def _not_numbers(label: str, data: Any, datatype: str, noun: str) -> InvalidInput:
    """Why non-numeric JSON values are refused: integers beyond any numpy type, else the
    first element that is not `noun`."""
    dtype = V2_DATATYPES[datatype]
    if dtype.kind in _INT_KINDS and all(isinstance(v, int) and not isinstance(v, bool) for v in _flatten(data)):
        info = np.iinfo(dtype)
        return InvalidInput(f"{label}: values must lie in [{info.min}, {info.max}] for {datatype}")
    return _first_bad_element(label, data, datatype, noun)


def _integers(label: str, data: Any, raw: np.ndarray, datatype: str, noun: str) -> np.ndarray:
    """`raw` (numbers) as the integer `datatype`: whole numbers within its range only."""
    dtype = V2_DATATYPES[datatype]
    kind = raw.dtype.kind
    if kind == "f" and not (np.all(np.isfinite(raw)) and np.all(raw == np.round(raw))):
        raise _first_bad_element(label, data, datatype, noun)
    info = np.iinfo(dtype)
    if raw.size and (raw.min() < info.min or raw.max() > info.max):
        raise InvalidInput(f"{label}: values must lie in [{info.min}, {info.max}] for {datatype}")
    if kind == "f":
        # numpy turns ints beyond int64 into float64 and loses digits: convert
        # the JSON integers themselves, exactly.
        try:
            return np.array(data, dtype=dtype)
        except OverflowError:
            raise InvalidInput(f"{label}: values must lie in [{info.min}, {info.max}] for {datatype}") from None
    return raw.astype(dtype, copy=False)


def _ints_in_range(raw: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every (integral) value fits the integer `dtype` once cast. Floats
    compare against max + 1: the float nearest to 2**64 - 1 is 2**64 itself."""
    info = np.iinfo(dtype)
    low, high = raw.min(), raw.max()
    if raw.dtype.kind == "f":
        return bool(low >= info.min and high < float(info.max) + 1)
    return bool(low >= info.min and high <= info.max)


def _floats_in_range(raw: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every finite value stays finite in the float `dtype` (no 1e39 -> inf).
    Infinite inputs cannot come from JSON, which has no literal for them."""
    limit = float(np.finfo(dtype).max)
    with np.errstate(invalid="ignore"):
        low, high = np.nanmin(raw), np.nanmax(raw)
    if np.isinf(low) or np.isinf(high):  # only the finite values count
        finite = raw[np.isfinite(raw)]
        if not finite.size:
            return True
        low, high = finite.min(), finite.max()
    return bool(-limit <= low and high <= limit)


#: Bound on the product of a shape's non-zero dimensions: what numpy can address
#: at 8 bytes per element. An empty tensor may name any such shape, a larger one is
#: refused before numpy is asked (it would raise "Maximum allowed dimension exceeded").
MAX_ELEMENTS = np.iinfo(np.intp).max // 8


def check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """Non-negative integer dimensions whose non-zero product numpy can address."""
    if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape {list(shape)} must be non-negative integers")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} is too large: its non-zero dimensions "
            f"multiply to more than {MAX_ELEMENTS} elements"
        )
    return tuple(shape)


def decode_json_tensor(name: str, datatype: str, shape: Sequence[int], data: Any) -> np.ndarray:
    """A v2 JSON tensor (flat row-major or nested `data`) -> numpy array of `shape`."""
    shape = check_shape(name, shape)
    if datatype not in V2_DATATYPES:
        raise InvalidInput(f"input '{name}': unsupported datatype '{datatype}'; supported: {', '.join(V2_DATATYPES)}")
    if data is None:
        raise InvalidInput(f"input '{name}' has no 'data'")
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = list(_flatten(data))
        bad = next((i for i, v in enumerate(flat) if not isinstance(v, str)), None)
        if bad is not None:
            raise InvalidInput(f"input '{name}': element {bad} ({flat[bad]!r}) is not a valid BYTES value")
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
    else:
        arr = _to_numeric(name, data, datatype)
    expected = math.prod(shape)
    if arr.size != expected:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {expected} values, data has {arr.size}")
    return arr.reshape(shape)


#: What one BYTES element costs once decoded besides its text: a bytes object (33 bytes), its
#: slot in the list and in the object array, and the allocator's rounding.
BYTES_ELEMENT_BYTES = 96
#: BYTES elements one request may carry: each is a Python object, made one at a time (about a
#: second of CPU per million).
MAX_BYTES_ELEMENTS = 1 << 20


def check_bytes_elements(name: str, count: int) -> None:
    if count > MAX_BYTES_ELEMENTS:
        raise PayloadTooLarge(
            f"input '{name}': {count} BYTES elements, over the limit of {MAX_BYTES_ELEMENTS} per request; "
            "send fewer, longer elements"
        )


def decode_binary_tensor(name: str, datatype: str, shape: Sequence[int], buf: bytes | memoryview) -> np.ndarray:
    """A tensor sent with the binary-data extension -> numpy array (copy, writable)."""
    shape = check_shape(name, shape)
    if datatype not in V2_DATATYPES:
        raise InvalidInput(f"input '{name}': unsupported datatype '{datatype}'")
    count = math.prod(shape)
    if datatype == "BYTES":
        check_bytes_elements(name, count)
        items: list[bytes] = []
        offset = 0
        while offset < len(buf):
            if len(items) == count:  # more elements than the shape holds: stop making objects
                raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} values, data has more")
            if offset + 4 > len(buf):
                raise InvalidInput(f"input '{name}': truncated BYTES element header")
            (length,) = struct.unpack_from("<I", buf, offset)
            offset += 4
            if offset + length > len(buf):
                raise InvalidInput(f"input '{name}': truncated BYTES element")
            items.append(bytes(buf[offset : offset + length]))
            offset += length
        if len(items) != count:
            raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} values, data has {len(items)}")
        arr = np.empty(count, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    dtype = V2_DATATYPES[datatype]
    if len(buf) != count * dtype.itemsize:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, got {len(buf)}"
        )
    return np.frombuffer(buf, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def decode_simple_rows(data: Any, spec: TensorSpec) -> np.ndarray:
    """The simple API's `data` -> a batch for `spec`.

    A flat list is ONE row (reshaped to the input shape without its batch
    dimension); a list of flat lists, or fully nested rows, is several rows.
    """
    return shape_simple_rows(simple_array(data), spec)


def simple_array(data: Any) -> np.ndarray:
    """The simple API's `data` as FP64, before the model is known."""
    if not isinstance(data, list) or not data:
        raise InvalidInput("'data' must be a non-empty list of numbers (or a list of rows)")
    return _to_numeric("data", data, "FP64", label="'data'")


def shape_simple_rows(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`simple_array`'s result -> a batch for `spec` (see `decode_simple_rows`)."""
    if spec.datatype not in ("FP16", "FP32", "FP64") and spec.dtype.kind not in _INT_KINDS + "b":
        raise InvalidInput(f"model input '{spec.name}' has datatype {spec.datatype}; use the v2 API")
    if spec.shape is None:
        return _cast_simple(arr[None, :] if arr.ndim == 1 else arr, spec)
    row_shape = spec.shape[1:] if len(spec.shape) >= 1 else ()
    if not row_shape and arr.ndim == 1:
        return _cast_simple(arr, spec)  # scalar rows: a flat list is a list of rows
    rows = arr[None, :] if arr.ndim == 1 else arr
    if rows.ndim == 1 + len(row_shape) and all(
        d == -1 or d == n for d, n in zip(row_shape, rows.shape[1:], strict=True)
    ):
        return _cast_simple(rows, spec)
    if rows.ndim != 2:
        raise InvalidInput(
            f"'data' rows have shape {list(rows.shape[1:])}, model input '{spec.name}' "
            f"expects rows of shape {list(row_shape)}"
        )
    target = _flat_row_shape(rows.shape[1], row_shape, spec.name)
    return _cast_simple(rows.reshape((rows.shape[0], *target)), spec)


def _flat_row_shape(per_row: int, row_shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    """The row shape that `per_row` flat values take for a model row of `row_shape` (at most
    one dynamic dimension, -1, is worked out from the count)."""
    dynamic = [i for i, d in enumerate(row_shape) if d == -1]
    known = math.prod(d for d in row_shape if d != -1)
    if not dynamic:
        if per_row != known:
            raise InvalidInput(
                f"'data' has {per_row} values per row, model input '{name}' expects "
                f"{known} (row shape {list(row_shape)})"
            )
        return row_shape
    if len(dynamic) == 1 and known > 0 and per_row % known == 0:
        return tuple(per_row // known if d == -1 else d for d in row_shape)
    raise InvalidInput(
        f"'data' has {per_row} values per row, which cannot be reshaped to model input "
        f"'{name}' row shape {list(row_shape)}; send nested rows or use the v2 API"
    )


def _cast_simple(rows: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Rows (decoded as FP64) -> the input's dtype, refusing what would not survive
    the cast: non-integers for integer inputs and values outside the dtype's range."""
    dtype = spec.dtype
    if dtype.kind in _INT_KINDS:
        if not np.all(rows == np.round(rows)):
            raise InvalidInput(f"model input '{spec.name}' is {spec.datatype}; 'data' has non-integers")
        if rows.size and not _ints_in_range(rows, dtype):
            info = np.iinfo(dtype)
            raise InvalidInput(
                f"model input '{spec.name}' is {spec.datatype}: 'data' values must lie in [{info.min}, {info.max}]"
            )
    elif dtype.kind == "f" and dtype != rows.dtype and rows.size and not _floats_in_range(rows, dtype):
        raise InvalidInput(f"model input '{spec.name}': 'data' values exceed the range of {spec.datatype}")
    return np.ascontiguousarray(rows.astype(dtype, copy=False))


# --------------------------------------------------------------------------- validation


def validate_inputs(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], *, batchable: bool) -> int:
    """Check names, dtypes and shapes against the model; return the row count."""
    _check_names(arrays, specs)
    rows: int | None = None
    for spec in specs:
        arr = arrays[spec.name]
        _check_against(arr, spec)
        if batchable:
            if arr.ndim == 0:
                raise InvalidInput(f"input '{spec.name}' needs a batch dimension")
            if rows is None:
                rows = arr.shape[0]
            elif arr.shape[0] != rows:
                raise InvalidInput(
                    f"inputs disagree on batch size: '{spec.name}' has {arr.shape[0]} rows, others have {rows}"
                )
    if batchable and rows == 0:
        raise InvalidInput("batch dimension is 0: send at least one row")
    return rows if (batchable and rows is not None) else 1


def _check_names(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> None:
    """Every input the model has, and no other."""
    expected = {s.name for s in specs}
    missing = [s.name for s in specs if s.name not in arrays]
    unknown = sorted(set(arrays) - expected)
    if missing or unknown:
        problems = [
            f"missing input(s) {missing}" if missing else "",
            f"unknown input(s) {unknown}" if unknown else "",
        ]
        raise InvalidInput(f"{', '.join(p for p in problems if p)}; model inputs are {sorted(expected)}")


def _check_against(arr: np.ndarray, spec: TensorSpec) -> None:
    """`arr` has the datatype and (where known) the shape of the model input `spec`."""
    if arr.dtype != spec.dtype and not (spec.datatype == "BYTES" and arr.dtype.kind in "OSU"):
        raise InvalidInput(f"input '{spec.name}' has datatype {v2_datatype(arr.dtype)}, model expects {spec.datatype}")
    if spec.shape is None:
        return
    if arr.ndim != len(spec.shape) or any(d not in (-1, n) for d, n in zip(spec.shape, arr.shape, strict=True)):
        raise InvalidInput(
            f"input '{spec.name}' has shape {list(arr.shape)}, model expects {list(spec.shape)} (-1 = any size)"
        )


# --------------------------------------------------------------------------- encoding


def encode_json_tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    """numpy -> v2 JSON tensor; `data` stays an array for orjson to serialize fast."""
    datatype = v2_datatype(arr.dtype)
    if datatype == "BYTES":
        data: Any = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1).tolist()]
    else:
        data = np.ascontiguousarray(arr).reshape(-1)
    return {"name": name, "datatype": datatype, "shape": list(arr.shape), "data": data}


# The longest JSON text of one number orjson writes (a float64 such as -1.2345678901234567e-308,).
JSON_NUMBER_BYTES = 24


def encoded_size(arr: np.ndarray, binary: bool) -> int:
    """An upper bound on the bytes `arr` takes in a response, binary or JSON, before encoding it."""
    if v2_datatype(arr.dtype) == "BYTES":
        texts = sum(len(v) if isinstance(v, bytes | str) else len(str(v)) for v in arr.reshape(-1).tolist())
        # binary: a 4-byte length each; JSON: quotes, a comma and at most 6 bytes per escaped byte
        return 4 * arr.size + texts if binary else 3 * arr.size + 6 * texts
    return arr.nbytes if binary else JSON_NUMBER_BYTES * arr.size


def encode_binary_tensor(arr: np.ndarray) -> bytes:
    """numpy -> bytes for the binary-data extension (little-endian, row-major)."""
    if v2_datatype(arr.dtype) == "BYTES":
        parts = []
        for v in arr.reshape(-1).tolist():
            b = v if isinstance(v, bytes) else str(v).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()

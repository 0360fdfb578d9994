"""Pure tensor conversions: wire formats <-> numpy, and input validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from model_server.errors import InvalidInput
from model_server.tensors import (
    V2_DATATYPES,
    TensorSpec,
    decode_binary_tensor,
    decode_json_tensor,
    decode_simple_rows,
    encode_binary_tensor,
    encode_json_tensor,
    is_batchable,
    normalize_dim,
    validate_inputs,
)

NUMERIC = [d for d in V2_DATATYPES if d != "BYTES"]


@settings(max_examples=60, deadline=None)
@given(
    datatype=st.sampled_from(NUMERIC),
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
    data=st.data(),
)
def test_json_and_binary_round_trip(datatype, shape, data):
    dtype = V2_DATATYPES[datatype]
    elements = (
        st.floats(-1000, 1000, width=16 if dtype == np.float16 else 32, allow_nan=False) if dtype.kind == "f" else None
    )
    arr = data.draw(hnp.arrays(dtype, shape, elements=elements))
    encoded = encode_json_tensor("t", arr)
    assert encoded["datatype"] == datatype and encoded["shape"] == list(arr.shape)
    json_data = np.asarray(encoded["data"]).tolist()
    decoded = decode_json_tensor("t", datatype, encoded["shape"], json_data)
    np.testing.assert_array_equal(decoded, arr)
    assert decoded.dtype == dtype
    blob = encode_binary_tensor(arr)
    np.testing.assert_array_equal(decode_binary_tensor("t", datatype, list(arr.shape), blob), arr)


def test_nested_data_equals_flat_data():
    flat = decode_json_tensor("x", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])
    nested = decode_json_tensor("x", "FP32", [2, 3], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(flat, nested)
    assert flat[1, 0] == 4.0


def test_bytes_round_trip_in_binary_and_json():
    arr = np.array(["a", "héllo", ""], dtype=object)
    blob = encode_binary_tensor(arr)
    back = decode_binary_tensor("s", "BYTES", [3], blob)
    assert [b.decode() for b in back] == ["a", "héllo", ""]
    assert decode_json_tensor("s", "BYTES", [3], ["a", "b", "c"]).tolist() == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "fragment"),
    [
        ("FP32", [2], [1.0, "2"], "element 1 ('2') is not a valid FP32"),
        ("FP32", [2], [True, False], "element 0 (True)"),
        # Among numbers, numpy reads a JSON bool as 1 or 0: it is refused all the same.
        ("FP32", [2], [1.5, True], "element 1 (True) is not a valid FP32"),
        ("FP64", [2, 2], [[2.0, 3.0], [0.5, False]], "element 3 (False)"),
        ("INT64", [2], [7, True], "element 1 (True) is not a valid INT64"),
        ("UINT8", [1, 2], [[0, False]], "element 1 (False)"),
        ("INT32", [1, 2, 1], [[[1], [True]]], "element 1 (True)"),
        ("FP32", [3], [1.0, 2.0], "needs 3 values, data has 2"),
        ("FP32", [2, 2], [[1, 2], [3]], "ragged"),
        ("INT64", [2], [1, 2.5], "element 1 (2.5) is not a valid INT64"),
        ("UINT8", [2], [1, 300], "[0, 255]"),
        ("BOOL", [2], [1, 0], "element 0 (1) is not a valid BOOL"),
        ("FP16", [1], [1e6], "exceed the range of FP16"),
        ("FP8", [1], [1.0], "unsupported datatype 'FP8'"),
        ("FP32", [-1], [1.0], "non-negative"),
        ("FP32", [1], None, "has no 'data'"),
        ("BYTES", [2], ["a", 3], "element 1 (3)"),
    ],
)
def test_json_decode_rejects_with_message(datatype, shape, data, fragment):
    with pytest.raises(InvalidInput) as info:
        decode_json_tensor("x", datatype, shape, data)
    assert fragment in str(info.value)
    assert str(info.value).startswith("input 'x'")


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [1.0, 0.0, 1, 0]),
        ("INT64", [[1, 1], [0, 1]]),
        ("UINT8", [[0, 1], [1, 0]]),
        ("FP16", [0.0, 1.0, 2.5, 1]),
    ],
)
def test_ones_and_zeros_are_numbers_not_bools(datatype, data):
    # The bool check looks closer at elements equal to 0 or 1; real numbers among them pass.
    shape = [4] if not isinstance(data[0], list) else [2, 2]
    assert decode_json_tensor("x", datatype, shape, data).ravel().tolist() == np.ravel(data).tolist()


JSON_SCALARS = st.one_of(st.booleans(), st.integers(-2, 2), st.sampled_from([0.0, 1.0, -0.0, 0.5, 2.0]))


@given(st.lists(JSON_SCALARS, min_size=1, max_size=6), st.sampled_from(["FP32", "FP64", "INT64", "INT8"]))
def test_a_numeric_tensor_takes_numbers_only(values, datatype):
    """Whatever mix of bools, ints and floats (0 and 1 among them) a JSON list holds: it decodes
    iff no element is a bool (and, for an integer type, every float is whole), to those values."""
    numbers = all(not isinstance(v, bool) for v in values)
    whole = datatype.startswith("FP") or all(float(v).is_integer() for v in values)
    if numbers and whole:
        assert decode_json_tensor("x", datatype, [len(values)], values).tolist() == values
    else:
        with pytest.raises(InvalidInput, match=r"element \d+ \((True|False|-?\d+\.\d+)\) is not a valid"):
            decode_json_tensor("x", datatype, [len(values)], values)


def test_binary_decode_checks_size():
    with pytest.raises(InvalidInput, match="needs 16 bytes, got 12"):
        decode_binary_tensor("x", "FP32", [4], b"\0" * 12)


def test_simple_rows_reshape_flat_row_to_model_row_shape():
    spec = TensorSpec("img", "FP32", (-1, 2, 3))
    rows = decode_simple_rows([1, 2, 3, 4, 5, 6], spec)
    assert rows.shape == (1, 2, 3) and rows.dtype == np.float32
    assert rows[0, 1, 2] == 6
    many = decode_simple_rows([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], spec)
    assert many.shape == (2, 2, 3) and many[1, 0, 0] == 6


def test_simple_rows_fill_one_dynamic_dim_and_scalar_rows():
    assert decode_simple_rows([1, 2, 3, 4, 5, 6], TensorSpec("x", "FP32", (-1, -1, 2))).shape == (1, 3, 2)
    assert decode_simple_rows([1, 2, 3], TensorSpec("x", "FP32", (-1,))).shape == (3,)
    ints = decode_simple_rows([1, 2], TensorSpec("ids", "INT64", (-1, 2)))
    assert ints.dtype == np.int64 and ints.tolist() == [[1, 2]]


@pytest.mark.parametrize(
    ("data", "spec", "fragment"),
    [
        ([1, 2, 3], TensorSpec("x", "FP32", (-1, 4)), "3 values per row, model input 'x' expects 4"),
        ([], TensorSpec("x", "FP32", (-1, 4)), "non-empty"),
        ([1, "a"], TensorSpec("x", "FP32", (-1, 2)), "element 1 ('a') is not a number"),
        ([1.5, 2], TensorSpec("ids", "INT64", (-1, 2)), "non-integers"),
        ([1, 2, 3], TensorSpec("x", "FP32", (-1, -1, 2)), "cannot be reshaped"),
        ([[1, 2], [3]], TensorSpec("x", "FP32", (-1, 2)), "ragged"),
    ],
)
def test_simple_rows_reject_with_message(data, spec, fragment):
    with pytest.raises(InvalidInput) as info:
        decode_simple_rows(data, spec)
    assert fragment in str(info.value)


SPECS = [TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "INT64", (-1,))]


def test_validate_inputs_returns_rows():
    arrays = {"a": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.int64)}
    assert validate_inputs(arrays, SPECS, batchable=True) == 3


@pytest.mark.parametrize(
    ("arrays", "fragment"),
    [
        ({"a": np.zeros((1, 2), np.float32)}, "missing input(s) ['b']"),
        (
            {"a": np.zeros((1, 2), np.float32), "b": np.zeros(1, np.int64), "c": np.zeros(1)},
            "unknown input(s) ['c']",
        ),
        (
            {"a": np.zeros((1, 2), np.float64), "b": np.zeros(1, np.int64)},
            "'a' has datatype FP64, model expects FP32",
        ),
        (
            {"a": np.zeros((1, 3), np.float32), "b": np.zeros(1, np.int64)},
            "'a' has shape [1, 3], model expects [-1, 2]",
        ),
        ({"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.int64)}, "disagree on batch size"),
        ({"a": np.zeros((0, 2), np.float32), "b": np.zeros(0, np.int64)}, "batch dimension is 0"),
    ],
)
def test_validate_inputs_rejects(arrays, fragment):
    with pytest.raises(InvalidInput) as info:
        validate_inputs(arrays, SPECS, batchable=True)
    assert fragment in str(info.value)


def test_batchable_needs_dynamic_leading_dims():
    assert is_batchable(SPECS, [TensorSpec("y", "FP32", (-1, 3))])
    assert not is_batchable([TensorSpec("x", "FP32", (1, 4))], [])
    assert not is_batchable(SPECS, [TensorSpec("y", "FP32", (3,))])
    assert [normalize_dim(d) for d in (3, None, "N", -1)] == [3, -1, -1, -1]


def test_integers_beyond_int64_keep_every_digit():
    big = 2**63 + 1
    assert decode_json_tensor("t", "UINT64", [2], [big, 0]).tolist() == [big, 0]
    assert decode_json_tensor("t", "UINT64", [1], [2**64 - 1]).tolist() == [2**64 - 1]
    for bad in ([2**64], [1e20], [-1]):
        with pytest.raises(InvalidInput, match="must lie in"):
            decode_json_tensor("t", "UINT64", [1], bad)


def test_bytes_data_nested_deeper_than_the_stack_is_invalid_input_not_a_recursion_error():
    from model_server.errors import InvalidInput
    from model_server.tensors import decode_json_tensor

    deep: object = "a"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nested more than"):
        decode_json_tensor("x", "BYTES", [1], deep)

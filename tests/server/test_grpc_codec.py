"""The gRPC protocol as data: the committed message classes are what the .proto makes and what
Triton's client speaks; typed contents decode to the arrays they hold or are refused by name;
the call table ends the call waiting longest for its message at the limit, never a probe; the
message budget reserves the largest message for each call until its own has come."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import service_pb2 as triton_pb

from bounded_http.grpc_calls import CallTable, MessageBudget, Refused
from model_server import grpc_predict_v2_pb2 as pb
from model_server.dataplane import check_requested_outputs
from model_server.errors import InvalidInput, PayloadTooLarge
from model_server.grpc_codec import (
    CONTENTS_FIELD,
    decode_contents,
    decode_infer_request,
    encode_infer_response,
)
from model_server.grpc_server import Answers
from model_server.tensors import MAX_BYTES_ELEMENTS
from testsupport.grpc_codegen import OUTPUTS, generate


def test_the_committed_message_classes_are_what_the_proto_makes_now():
    module = generate()[OUTPUTS[0]]
    namespace: dict[str, object] = {"__name__": "regenerated"}
    exec(compile(module, "regenerated", "exec"), namespace)
    assert namespace["DESCRIPTOR"].serialized_pb == pb.DESCRIPTOR.serialized_pb  # type: ignore[attr-defined]


def _fields(message: Descriptor) -> dict[int, tuple[str, int, bool]]:
    return {f.number: (f.name, f.type, f.is_repeated) for f in message.fields}


def test_every_message_has_the_field_numbers_and_types_of_tritons_own():
    """Triton's grpc_service.proto is a superset of the protocol: each field here must be the
    same field there, or its client and this server misread each other. Both sets of classes
    load in one process (the server's are in a descriptor pool of their own)."""
    checked = 0
    pending: list[Descriptor] = list(pb.DESCRIPTOR.message_types_by_name.values())
    while pending:
        ours = pending.pop()
        theirs = triton_pb.DESCRIPTOR.pool.FindMessageTypeByName(ours.full_name)
        assert _fields(ours).items() <= _fields(theirs).items(), ours.full_name
        pending.extend(ours.nested_types)
        checked += 1
    assert checked >= 20
    ours_service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs_service = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in ours_service.methods:
        match = theirs_service.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            match.input_type.full_name,
            match.output_type.full_name,
        )
    assert FieldDescriptor.TYPE_BYTES == _fields(pb.ModelInferRequest.DESCRIPTOR)[7][1]


VALUES = {
    "BOOL": [True, False, True, True],
    "INT8": [-128, 0, 5, 127],
    "INT16": [-300, 0, 5, 32767],
    "INT32": [-(2**31), 0, 5, 2**31 - 1],
    "INT64": [-(2**63), 0, 5, 2**63 - 1],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 1, 200, 65535],
    "UINT32": [0, 1, 200, 2**32 - 1],
    "UINT64": [0, 1, 200, 2**64 - 1],
    "FP32": [0.5, -1.25, 3.0, 2.0**100],
    "FP64": [0.5, -1.25, 3.0, 1e300],
    "BYTES": [b"a", b"", b"\xff\x00", b"text"],
}


@pytest.mark.parametrize("datatype", sorted(VALUES))
def test_typed_contents_decode_to_the_values_they_hold(datatype):
    contents = pb.InferTensorContents()
    getattr(contents, CONTENTS_FIELD[datatype]).extend(VALUES[datatype])
    array = decode_contents("x", datatype, (2, 2), contents)
    assert array.shape == (2, 2)
    assert array.ravel().tolist() == VALUES[datatype]
    if datatype != "BYTES":
        assert array.dtype == np.dtype(datatype.lower().replace("fp", "float").replace("bool", "bool_"))


@pytest.mark.parametrize(
    ("datatype", "field", "values", "words"),
    [
        ("INT8", "int_contents", [128], "INT8: its values must lie in [-128, 127]"),
        ("UINT8", "uint_contents", [256], "UINT8: its values must lie in [0, 255]"),
        ("INT16", "int_contents", [-32769], "must lie in [-32768, 32767]"),
        ("FP32", "fp64_contents", [1.0], "its values belong in fp32_contents, not fp64_contents"),
        ("FP16", "fp32_contents", [1.0], "FP16 has no typed contents; send it in raw_input_contents"),
        ("FP32", "fp32_contents", [1.0, 2.0], "shape [1] needs 1 values, contents has 2"),
        ("BF16", "fp32_contents", [1.0], "unsupported datatype 'BF16'"),
    ],
)
def test_typed_contents_that_do_not_fit_their_datatype_are_refused_by_name(datatype, field, values, words):
    contents = pb.InferTensorContents()
    getattr(contents, field).extend(values)
    with pytest.raises(InvalidInput, match="input 'x'") as refused:
        decode_contents("x", datatype, (1,), contents)
    assert words in str(refused.value)


def test_too_many_bytes_elements_are_refused_before_they_are_made():
    contents = pb.InferTensorContents()
    contents.bytes_contents.extend([b""] * (MAX_BYTES_ELEMENTS + 1))
    with pytest.raises(PayloadTooLarge, match="BYTES elements"):
        decode_contents("x", "BYTES", (MAX_BYTES_ELEMENTS + 1,), contents)


def test_a_request_decodes_raw_or_typed_and_refuses_mixing_them():
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="q", raw_input_contents=[rows.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.outputs.add(name="y")
    decoded = decode_infer_request(request)
    np.testing.assert_array_equal(decoded.inputs["x"], rows)
    assert (decoded.model, decoded.version, decoded.id, decoded.outputs) == ("m", "2", "q", ("y",))

    request.inputs[0].contents.fp32_contents.extend(rows.ravel().tolist())
    with pytest.raises(InvalidInput, match="contents and raw_input_contents are both given"):
        decode_infer_request(request)
    twice = pb.ModelInferRequest(model_name="m")
    for _ in range(2):
        twice.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="input 'x' is given twice"):
        decode_infer_request(twice)
    with pytest.raises(InvalidInput, match="no inputs"):
        decode_infer_request(pb.ModelInferRequest(model_name="m"))


def test_the_response_carries_raw_outputs_and_refuses_one_over_the_limit():
    decoded = decode_infer_request(_one_input())
    outputs = {"y": np.arange(6, dtype=np.float32).reshape(2, 3), "z": np.array([1, 2], np.int64)}
    response = encode_infer_response(decoded, "m", "1", outputs, limit=1 << 20)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("y", "FP32", [2, 3]),
        ("z", "INT64", [2]),
    ]
    assert response.raw_output_contents[0] == outputs["y"].tobytes()
    with pytest.raises(InvalidInput, match="over this server's 16-byte message limit"):
        encode_infer_response(decoded, "m", "1", outputs, limit=16)
    with pytest.raises(InvalidInput, match=r"requested more than once"):
        check_requested_outputs(["y", "y"], ["y"])
    with pytest.raises(InvalidInput, match=r"unknown output\(s\) \['w'\]"):
        check_requested_outputs(["w"], ["y", "z"])


def _one_input() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    return request


async def test_the_call_table_ends_the_call_waiting_longest_for_its_message_at_its_limit():
    table = CallTable(limit=2, probe_slots=1)
    sleepers = [asyncio.ensure_future(asyncio.sleep(30)) for _ in range(3)]
    first, second = table.enter(probe=False), table.enter(probe=False)
    first.task, second.task = sleepers[0], sleepers[1]
    second.waiting = False  # its message came: it is being served

    third = table.enter(probe=False)  # at the limit: the first, still waiting, makes room
    third.task = sleepers[2]
    await asyncio.sleep(0)
    assert first.evicted and sleepers[0].cancelled() and not second.evicted
    assert list(table.calls) == [second, third]

    third.waiting = False
    with pytest.raises(Refused, match="limit of 2 calls"):
        table.enter(probe=False)  # every call is being served: nothing to end
    probe = table.enter(probe=True)  # probes have a slot beyond the limit
    probe.waiting = False
    with pytest.raises(Refused):
        table.enter(probe=True)
    for call in (second, third, probe):
        table.leave(call)
    assert not table.calls
    for sleeper in sleepers:
        sleeper.cancel()


async def test_the_call_table_never_ends_a_probe_waiting_for_its_message():
    table = CallTable(limit=2, probe_slots=1)
    sleepers = [asyncio.ensure_future(asyncio.sleep(30)) for _ in range(2)]
    probe, call = table.enter(probe=True), table.enter(probe=False)  # both waiting, the probe longer
    probe.task, call.task = sleepers

    newcomer = table.enter(probe=False)
    await asyncio.sleep(0)
    assert call.evicted and sleepers[1].cancelled()
    assert not probe.evicted and not sleepers[0].cancelled()
    newcomer.waiting = False
    with pytest.raises(Refused):  # only the probe waits: nothing to end
        table.enter(probe=False)
    for entry in (probe, newcomer):
        table.leave(entry)
    sleepers[0].cancel()


MiB = 1 << 20


async def test_the_message_budget_holds_the_largest_message_per_call_until_its_own_has_come():
    budget = MessageBudget(total=100 * MiB, message_limit=40 * MiB, wait_s=0.2)
    first, second = await budget.reserve(), await budget.reserve()
    third = asyncio.ensure_future(budget.reserve())  # 20 MiB left: it waits
    while not budget.waiting:
        await asyncio.sleep(0)
    assert not third.done()

    first.keep(2 * 5 * MiB)  # its 5 MiB message came: the message and its tensors are kept
    held = await asyncio.wait_for(third, 5)
    assert budget.memory.free == (100 - 10 - 40 - 40) * MiB
    with pytest.raises(Refused, match="budget of 100 MiB") as refused:
        await budget.reserve()  # 10 MiB free, and nothing returns within its wait
    assert "the largest message, 40 MiB" in str(refused.value) and budget.waiting == 0

    for reservation in (first, second, held):
        reservation.release()
    assert budget.memory.free == 100 * MiB


async def test_answers_not_yet_read_count_against_the_budget_each_connection_within_its_share():
    budget = MessageBudget(total=100 * MiB, message_limit=40 * MiB, wait_s=0.2)
    answers = Answers(budget)
    assert answers.share == 25 * MiB
    first = await budget.reserve()
    first.keep(2 * MiB)
    gone = answers.hold("a", 21 * MiB, first)  # its answer made: it takes what its message held, and more
    assert budget.memory.free == 79 * MiB and answers.held == {"a": 21 * MiB}
    answers.admit("a")  # a new call of a's may still come: a small answer fits what is left of its share

    second = await budget.reserve()
    with pytest.raises(Refused, match="its share of 25 MiB"):
        answers.hold("a", 6 * MiB, second)  # beyond a's share: refused, not waited for
    answers.hold("b", 21 * MiB, second)
    third = await budget.reserve()
    answers.hold("c", 21 * MiB, third)
    assert budget.memory.free == 37 * MiB
    with pytest.raises(Refused, match="hold 63 MiB of the server's 100 MiB"):
        answers.admit("d")  # no room for a message until an answer leaves: refused at once

    gone(None)  # a's call is done: its answer has left, or its connection has
    assert answers.held == {"b": 21 * MiB, "c": 21 * MiB} and answers.total == 42 * MiB
    assert budget.memory.free == 58 * MiB
    answers.admit("d")

"""The Open Inference Protocol over gRPC, asked by Triton's own client (tritonclient.grpc) and by
raw calls: health, metadata and inference answer as REST does for the same input, every error has
its status code and a message that names the problem, and the bounds hold (message size, queue,
deadlines, cancelled and silent calls)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from bounded_http.grpc_calls import SERVICE
from model_server import grpc_predict_v2_pb2 as pb
from testsupport import adversary, adversary_h2
from testsupport.onnx_models import affine_model
from testsupport.waiting import eventually

from .grpc_helpers import infer, raw_call, running_grpc_server
from .helpers import HeldRuntime, make_settings

RNG = np.random.default_rng(7)
MiB = 1 << 20


def triton_input(rows: np.ndarray, name: str = "x") -> triton.InferInput:
    tensor = triton.InferInput(name, list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


def status_of(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    """The status code and message a call ended with."""
    with pytest.raises(grpc.RpcError) as failure:
        call()
    return failure.value.code(), failure.value.details()


def test_triton_client_gets_health_metadata_and_the_answers_rest_gives(affine_repo, affine_params):
    weight, bias = affine_params
    rows = RNG.standard_normal((3, 4)).astype(np.float32)
    with running_grpc_server(make_settings(affine_repo, grpc_port=0)) as server:
        client = triton.InferenceServerClient(server.target)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
        metadata = client.get_server_metadata(as_json=True)
        assert metadata["name"] == "model-server"
        model = client.get_model_metadata("tiny", as_json=True)
        rest_model = httpx.get(f"{server.http.url}/v2/models/tiny").json()
        assert model["name"] == rest_model["name"] and model["versions"] == rest_model["versions"]
        assert model["platform"] == rest_model["platform"]
        for side in ("inputs", "outputs"):
            as_ints = [{**t, "shape": [int(d) for d in t["shape"]]} for t in model[side]]
            assert as_ints == rest_model[side]

        answer = client.infer("tiny", [triton_input(rows)], request_id="r-1")
        rest = httpx.post(
            f"{server.http.url}/v2/models/tiny/infer",
            json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": rows.ravel().tolist()}]},
        ).json()
    got = answer.as_numpy("y")
    assert got.dtype == np.float32 and got.shape == (3, 3)
    np.testing.assert_array_equal(got, np.asarray(rest["outputs"][0]["data"], np.float32).reshape(3, 3))
    np.testing.assert_allclose(got, rows @ weight + bias, rtol=1e-5, atol=1e-5)
    response = answer.get_response()
    assert (response.model_name, response.model_version, response.id) == ("tiny", "1", "r-1")


def test_typed_contents_answer_as_raw_contents_do(affine_repo):
    rows = RNG.standard_normal((2, 4)).astype(np.float32)
    typed = pb.ModelInferRequest(model_name="tiny")
    typed.inputs.add(name="x", datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(rows.ravel().tolist())
    raw = pb.ModelInferRequest(model_name="tiny", raw_input_contents=[rows.tobytes()])
    raw.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    with running_grpc_server(make_settings(affine_repo, grpc_port=0)) as server:
        by_contents, by_raw = infer(server.target, typed), infer(server.target, raw)
    assert by_contents.raw_output_contents == by_raw.raw_output_contents
    assert [(o.name, o.datatype, list(o.shape)) for o in by_contents.outputs] == [("y", "FP32", [2, 3])]


def request_with(**changes) -> pb.ModelInferRequest:  # type: ignore[no-untyped-def]
    rows = np.zeros((1, 4), np.float32)
    request = pb.ModelInferRequest(model_name="tiny", raw_input_contents=[rows.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    for field, value in changes.items():
        if field == "shape":
            request.inputs[0].ClearField("shape")
            request.inputs[0].shape.extend(value)
        elif field == "datatype":
            request.inputs[0].datatype = value
        elif field == "output":
            request.outputs.add(name=value)
        elif field == "raw":
            del request.raw_input_contents[:]
            request.raw_input_contents.extend(value)
        else:
            setattr(request, field, value)
    return request


BAD_REQUESTS = {
    "unknown model": (request_with(model_name="nope"), grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
    "unknown version": (request_with(model_version="9"), grpc.StatusCode.NOT_FOUND, "has no version '9'"),
    "wrong shape": (request_with(shape=[2, 2]), grpc.StatusCode.INVALID_ARGUMENT, "model expects [-1, 4]"),
    "bytes do not fit": (request_with(shape=[2, 4]), grpc.StatusCode.INVALID_ARGUMENT, "needs 32 bytes, got 16"),
    "wrong datatype": (
        request_with(datatype="INT32"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "has datatype INT32, model expects FP32",
    ),
    "unknown output": (request_with(output="z"), grpc.StatusCode.INVALID_ARGUMENT, "unknown output(s) ['z']"),
    "raw entries": (
        request_with(raw=[b"", b""]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents has 2 entries for 1 inputs",
    ),
    "negative dimension": (request_with(shape=[-1, 4]), grpc.StatusCode.INVALID_ARGUMENT, "must be non-negative"),
}


def test_bad_requests_get_their_status_code_and_a_message_that_names_the_problem(affine_repo):
    with running_grpc_server(make_settings(affine_repo, grpc_port=0)) as server:
        outcomes = {
            name: status_of(lambda r=request: infer(server.target, r)) for name, (request, _, _) in BAD_REQUESTS.items()
        }
        garbage = status_of(lambda: raw_call(server.target, "ModelInfer", b"\xff\xff\xff"))
        metadata = status_of(
            lambda: raw_call(server.target, "ModelMetadata", pb.ModelMetadataRequest(name="x").SerializeToString())
        )
        still_live = pb.ServerLiveResponse.FromString(raw_call(server.target, "ServerLive", b"")).live
        counted = {
            (version, code): server.metric(
                "model_server_requests_total", {"model": "tiny", "version": version, "code": code}
            )
            for version in ("1", "unresolved")
            for code in ("400", "404")
        }
    for name, (_, code, words) in BAD_REQUESTS.items():
        assert outcomes[name][0] == code, name
        assert words in outcomes[name][1], (name, outcomes[name][1])
    assert garbage[0] == grpc.StatusCode.INVALID_ARGUMENT and "not a ModelInferRequest" in garbage[1]
    assert metadata == (grpc.StatusCode.NOT_FOUND, "unknown model 'x'; this server serves 'tiny'")
    assert still_live
    # counted as REST counts them: under the HTTP status, and the version when one was chosen
    assert counted == {("1", "400"): 3, ("unresolved", "400"): 3, ("1", "404"): None, ("unresolved", "404"): 2}


def test_a_server_without_a_model_is_live_not_ready_and_answers_unavailable(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    settings = make_settings(tmp_path / "empty", grpc_port=0, termination_log=None)
    with running_grpc_server(settings, wait_ready=False) as server:
        client = triton.InferenceServerClient(server.target)
        live, ready, model_ready = client.is_server_live(), client.is_server_ready(), client.is_model_ready("tiny")
        code, message = status_of(lambda: infer(server.target, request_with()))
    assert (live, ready, model_ready) == (True, False, False)
    assert code == grpc.StatusCode.UNAVAILABLE and "no model found" in message


def test_messages_over_64_mib_are_refused_with_resource_exhausted(affine_repo):
    settings = make_settings(affine_repo, grpc_port=0, memory_limit_bytes=8 << 30)
    assert settings.max_body_bytes == 64 * MiB  # the default the limit follows, for REST and gRPC alike
    under = request_with(raw=[bytes(60 * MiB)])  # arrives, then is refused for what it holds
    over = request_with(raw=[bytes(64 * MiB)])
    with running_grpc_server(settings) as server:
        client = triton.InferenceServerClient(server.target)
        under_code, under_message = status_of(lambda: infer(server.target, under, timeout=60))
        over_code, over_message = status_of(lambda: infer(server.target, over, timeout=60))
        with pytest.raises(InferenceServerException) as triton_over:
            client.infer("tiny", [triton_input(np.zeros((4 * MiB + 1, 4), np.float32))])
        assert client.is_server_live()
    assert under_code == grpc.StatusCode.INVALID_ARGUMENT and "needs 16 bytes" in under_message
    assert over_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(64 * MiB) in over_message and "larger than max" in over_message
    assert triton_over.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def occupy_the_runtime(client: triton.InferenceServerClient, held: HeldRuntime, server) -> list[threading.Thread]:  # type: ignore[no-untyped-def]
    """Two calls that leave the queue empty: one held in the runtime, one batched behind it (the
    batcher hands one batch to the runtime's executor ahead); the next calls queue."""
    rows = np.zeros((1, 4), np.float32)
    calls = []
    for taken in (1, 2):
        call = threading.Thread(target=lambda: client.infer("tiny", [triton_input(rows)]))
        call.start()
        calls.append(call)
        wait_for(lambda n=taken: server.metric("model_server_queue_wait_seconds_count", LABELS) == n)
    return calls


LABELS = {"model": "tiny", "version": "1"}
DEPTH = {"model": "tiny"}


def test_a_full_queue_answers_resource_exhausted(affine_repo):
    settings = make_settings(affine_repo, grpc_port=0, max_batch_size=1, max_queue=1)
    held = HeldRuntime()
    rows = np.zeros((1, 4), np.float32)
    with running_grpc_server(settings, backend_factory=held) as server:
        client = triton.InferenceServerClient(server.target)
        calls = occupy_the_runtime(client, held, server)
        answers: list[object] = []
        queued = threading.Thread(target=lambda: answers.append(client.infer("tiny", [triton_input(rows)])))
        queued.start()
        wait_for(lambda: server.metric("model_server_queue_depth", DEPTH) == 1)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny", [triton_input(rows)])
        held.release()
        joined(*calls, queued)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "queue is full" in refused.value.message()
    assert len(answers) == 1


def test_a_call_past_its_deadline_or_cancelled_leaves_the_queue_and_is_counted_as_closed(affine_repo):
    """With room for one queued request: a queued call that its client gives up on (its deadline
    passes, or it is cancelled) gives that room back at once, so the next call is queued instead
    of refused, and never reaches the runtime."""
    settings = make_settings(affine_repo, grpc_port=0, max_batch_size=1, max_queue=1)
    held = HeldRuntime()
    rows = np.zeros((1, 4), np.float32)
    closed = {**LABELS, "code": "499"}
    with running_grpc_server(settings, backend_factory=held) as server:
        client = triton.InferenceServerClient(server.target)
        calls = occupy_the_runtime(client, held, server)
        with pytest.raises(InferenceServerException) as late:
            client.infer("tiny", [triton_input(rows)], client_timeout=0.5)
        wait_for(lambda: server.metric("model_server_requests_total", closed) == 1)
        assert server.metric("model_server_queue_depth", DEPTH) == 0

        pending = client.async_infer("tiny", [triton_input(rows)], callback=lambda result, error: None)
        wait_for(lambda: server.metric("model_server_queue_depth", DEPTH) == 1)
        pending.cancel()
        wait_for(lambda: server.metric("model_server_requests_total", closed) == 2)
        assert server.metric("model_server_queue_depth", DEPTH) == 0

        answers: list[object] = []
        after = threading.Thread(target=lambda: answers.append(client.infer("tiny", [triton_input(rows)])))
        after.start()
        wait_for(lambda: server.metric("model_server_queue_depth", DEPTH) == 1)
        held.release()
        joined(*calls, after)
        ran = server.metric("model_server_batch_size_count", LABELS)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert len(answers) == 1 and answers[0].as_numpy("y").shape == (1, 3)  # type: ignore[attr-defined]
    assert ran == 3  # the two ahead and the last: the abandoned two never reached the runtime


def test_a_call_whose_message_never_comes_is_ended_after_the_body_timeout(affine_repo):
    stop = threading.Event()

    def silent_messages():  # type: ignore[no-untyped-def]
        stop.wait(30)
        yield from ()

    settings = make_settings(affine_repo, grpc_port=0, body_timeout_s=0.5)
    with running_grpc_server(settings) as server, grpc.insecure_channel(server.target) as channel:
        call = channel.stream_unary(f"/{SERVICE}/ModelInfer")
        try:
            code, message = status_of(lambda: call(silent_messages(), timeout=20))
        finally:
            stop.set()
    # ended by the server (its message), not by the client's own deadline
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "did not arrive within 0.5 s" in message


def test_calls_whose_messages_are_coming_hold_the_budget_and_probes_answer_beside_it(affine_repo):
    """gRPC's core takes a message whole once its call asks for it, so a call asks only with the
    largest message reserved: with 512 MiB, REST's read budget (51 MiB) holds two reservations of
    20 MiB. Two calls whose messages stall hold both; the next call waits for one of them, and
    the probes answer meanwhile."""
    settings = make_settings(affine_repo, grpc_port=0, memory_limit_bytes=512 * MiB)
    rows = np.zeros((1, 4), np.float32)
    with running_grpc_server(settings) as server:
        assert server.server.grpc is not None
        budget = server.server.grpc.service.messages
        assert budget.memory.total // budget.message_limit == 2
        endpoint = adversary.Target("gRPC", "127.0.0.1", server.grpc_port, "", 0)
        stalled = [adversary_h2.Client(endpoint) for _ in range(2)]
        for client in stalled:  # a message of 1 MiB announced, 1 KiB of it sent
            client.call("ModelInfer", adversary_h2.frame(bytes(1024), announced=MiB), end=False)
            client.flush()
        wait_for(lambda: budget.memory.free < budget.message_limit)

        client = triton.InferenceServerClient(server.target)
        answers: list[object] = []
        waiting = threading.Thread(target=lambda: answers.append(client.infer("tiny", [triton_input(rows)])))
        waiting.start()
        wait_for(lambda: budget.waiting == 1)
        live, ready = client.is_server_live(), client.is_model_ready("tiny")
        assert not answers and budget.waiting == 1

        stalled[0].close()  # its call ends, its reservation returns: the waiting call goes on
        joined(waiting)
        stalled[1].close()
        wait_for(lambda: budget.memory.free == budget.memory.total)
    assert live and ready
    assert len(answers) == 1 and answers[0].as_numpy("y").shape == (1, 3)  # type: ignore[attr-defined]


def wait_for(condition: Callable[[], object]) -> None:
    eventually(condition, interval=0.01)


def joined(*threads: threading.Thread) -> None:
    """Each thread has ended (its call answered or failed): an event, not a window."""
    eventually(lambda: not any(thread.is_alive() for thread in threads), what="the calls to end")


def test_sigterm_lets_a_call_in_progress_finish_and_takes_no_new_one(affine_repo):
    held = HeldRuntime()
    rows = np.zeros((1, 4), np.float32)
    with running_grpc_server(make_settings(affine_repo, grpc_port=0), backend_factory=held) as server:
        client = triton.InferenceServerClient(server.target)
        answers: list[object] = []
        call = threading.Thread(target=lambda: answers.append(client.infer("tiny", [triton_input(rows)])))
        call.start()
        wait_for(lambda: held.held == 1)
        server.server.handle_exit(signal.SIGTERM, None)
        fresh = triton.InferenceServerClient(server.target)
        wait_for(lambda: not _answers_ready(fresh))  # unready, then the listener closes
        held.release()
        joined(call)
    assert len(answers) == 1 and answers[0].as_numpy("y").shape == (1, 3)  # type: ignore[attr-defined]


def _answers_ready(client: triton.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready(client_timeout=1))
    except InferenceServerException:
        return False


@pytest.fixture
def wide_repo(tmp_path: Path) -> Path:
    """A model whose answers are 64 times its requests: x[N, 4] @ W[4, 256]."""
    affine_model(tmp_path / "wide" / "1" / "model.onnx", np.ones((4, 256), np.float32), np.zeros(256, np.float32))
    return tmp_path / "wide"


#: A ModelInfer message of 3,500 rows (55 KiB, within HTTP/2's first window): its answer, 3.4 MiB,
#: takes over half a connection's share of a 512 MiB server's budget until it is read.
WIDE_MESSAGE = adversary_h2.frame(adversary_h2.infer_message(3500))


def test_an_answer_its_client_does_not_read_holds_the_budget_and_the_next_is_refused(wide_repo):
    """An answer waiting for a window its client keeps shut counts against the message budget
    until it leaves; that connection's next answer, beyond its share, is refused with
    RESOURCE_EXHAUSTED (not held, not waited for), and another client is answered meanwhile.
    When the connection goes, so do the bytes."""
    settings = make_settings(wide_repo, grpc_port=0, memory_limit_bytes=512 * MiB)
    rows = np.ones((2, 4), np.float32)
    with running_grpc_server(settings) as server:
        shut = adversary_h2.Client(adversary.Target("gRPC", "127.0.0.1", server.grpc_port, "", 0), window=0)
        first = shut.call("ModelInfer", WIDE_MESSAGE)
        shut.flush()
        assert shut.read_until(lambda: first in shut.answering, 10)  # its answer is handed over
        shut.read_until(lambda: shut.h2.outbound_flow_control_window >= len(WIDE_MESSAGE), 10)
        second = shut.call("ModelInfer", WIDE_MESSAGE)
        shut.flush()
        shut.read_until(lambda: second in shut.ended, 10)
        answer = triton.InferenceServerClient(server.target).infer("tiny", [triton_input(rows)])
        assert first not in shut.ended and shut.status.get(second) == "8"  # RESOURCE_EXHAUSTED
        assert server.server.grpc is not None
        answers, budget = server.server.grpc.service.answers, server.server.grpc.service.messages.memory
        held, free = answers.total, budget.free
        shut.close()
        wait_for(lambda: answers.total == 0 and budget.free == budget.total)
    assert 2 * 3500 * 1024 < held <= answers.share  # its two copies, within its connection's share
    assert budget.total - free >= held
    assert answer.as_numpy("y").shape == (2, 256)


def closed_by_peer(client: adversary_h2.Client, timeout: float) -> bool:
    """Whether the server closes `client`'s connection within `timeout` (what it sends is drained)."""
    client.sock.settimeout(timeout)
    try:
        while client.sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_a_connection_whose_answer_is_never_read_is_dropped_after_its_age_and_grace(wide_repo):
    """gRPC's core asks each connection to reconnect after grpc_max_connection_age_s and drops it
    write_timeout_s later: an answer whose window stays shut goes with it, and its bytes return."""
    settings = make_settings(wide_repo, grpc_port=0, grpc_max_connection_age_s=1, write_timeout_s=1)
    with running_grpc_server(settings) as server:
        shut = adversary_h2.Client(adversary.Target("gRPC", "127.0.0.1", server.grpc_port, "", 0), window=0)
        stream = shut.call("ModelInfer", WIDE_MESSAGE)
        shut.flush()
        assert shut.read_until(lambda: stream in shut.answering, 10)  # its answer is handed over
        dropped = closed_by_peer(shut, 20)
        shut.close()
        assert dropped
        assert server.server.grpc is not None
        answers, budget = server.server.grpc.service.answers, server.server.grpc.service.messages.memory
        wait_for(lambda: answers.total == 0 and budget.free == budget.total)

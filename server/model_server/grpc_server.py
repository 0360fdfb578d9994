"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService` (KServe's and
Triton's) on `--grpc-port`, on the HTTP server's event loop, through the same data plane,
batcher, metrics and error types as REST. An error's gRPC status follows from its HTTP status
(api/errors.py), so the two transports cannot disagree on what a failure is.

Bounds, as every port has them: messages up to `max_body_bytes` (RESOURCE_EXHAUSTED above, from
gRPC itself, with the sizes in its message), at most `max_connections` connections, 100 streams
on each, and `max_connections` calls at once. Every method is served as a client-streaming call
that reads its one message itself, so that a call whose message does not come is bounded too:
it is ended after `body_timeout_s`, and at the call limit the call waiting longest for its message
is ended for the newcomer (idle first, as the HTTP port evicts; its stream is reset: answering it
with a status took the loop twice as long under a flood of such calls). Probes (ServerLive,
ServerReady, ModelReady) have slots beyond the limit and are never ended for a newcomer; each
method has its own queue of new calls in gRPC's core, so a flood of one method does not hold the
kubelet's ServerLive. A call whose client goes away or whose deadline passes is cancelled, which
takes its request out of the batch queue (batching.py drops cancelled requests).

Messages being received hold memory under a budget the size of REST's read budget
(`MessageBudget`): gRPC's core takes a message whole once its call asks for it, opening the
stream's flow-control window to the message's length, and holds at most its lookahead (64 KiB,
with BDP probing off) of a stream that has not asked, so a call asks only with the largest
message reserved, and keeps twice what came until it is answered. ServerLive and ServerReady do
not read their (empty) message; ModelReady reads its own beside the budget, a few at once.

Answers hold the same budget until they have left (`Answers`): gRPC's core keeps an answer whole
until the client's flow-control window lets it out, and reports the call done only then, so an
answer is counted from the moment it is handed over to that report. One connection's answers
hold at most a quarter of the budget, so a client that never reads cannot take it all; a call
finding no room is refused with RESOURCE_EXHAUSTED at once. An answer that is never read leaves
with its connection: gRPC's core sends every connection a GOAWAY after
`grpc_max_connection_age_s` and closes it `write_timeout_s` later (clients reconnect unnoticed).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError, Message

from bounded_http.grpc_calls import (
    CONNECTIONS_PER_CALL_SLOT,
    LOOKAHEAD_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_STREAMS_PER_CONNECTION,
    PROBE_RECEIVERS,
    PROBES,
    SERVICE,
    CallTable,
    MessageBudget,
    Refused,
    Reservation,
)

from . import __version__
from . import grpc_predict_v2_pb2 as pb
from .discovery import version_key
from .errors import CLIENT_CLOSED, INTERNAL_ERROR, ModelNotFound, ServerError, status_of
from .grpc_codec import decode_infer_request, encode_infer_response
from .state import AppState

log = logging.getLogger(__name__)

#: Probes whose request has no fields: answered without reading it, so they wait for nothing (a
#: message sent anyway stays unread, its stream holding at most the lookahead).
UNREAD = frozenset({"ServerLive", "ServerReady"})
#: What a received message costs until its call is answered, in multiples of its size: the message
#: and the tensors decoded from it (protobuf's bytes fields are copied out).
RECEIVED_COPIES = 2
#: What an answer costs until it has left, in multiples of its size: the serialized message the
#: handler hands over and gRPC's core's copy of it, both kept until the message is written.
ANSWER_COPIES = 2
#: And what its call costs meanwhile, whatever its size (the call's state in gRPC's core and in
#: its Python server, about 12 KiB), so that calls with small answers are bounded too.
CALL_BYTES = 16 * 1024
#: The answers of one connection hold at most this share of the message budget (a quarter): two
#: connections whose clients never read leave room for another client's message.
CONNECTION_SHARES = 4

#: An error's gRPC status, from its status (the one table of error types is errors.py).
GRPC_STATUS_OF_HTTP: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CLIENT_CLOSED: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def grpc_status_of(exc: ServerError) -> grpc.StatusCode:
    return GRPC_STATUS_OF_HTTP.get(status_of(exc), grpc.StatusCode.INTERNAL)


# ---------------------------------------------------------------------- admission


@dataclass(frozen=True)
class Failure:
    """How a call ends when it is not answered: its status and the message that says why."""

    code: grpc.StatusCode
    details: str


class Ended(Exception):
    """A call ends with `failure` (raised where it is found, returned where the call is served)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.failure = Failure(code, details)


class Answers:
    """Answers handed to gRPC's core and not gone yet, counted against the message budget until
    they leave: gRPC reports a call done only once its answer is written to the connection (or
    the call has ended), so an answer waiting for a flow-control window that stays shut holds its
    bytes here, not beside the budget. Each connection's answers hold at most `share` bytes; a
    call that would take more, or that finds no room for its message until an answer leaves, is
    refused at once. An answer never read leaves with its connection: gRPC's core asks every
    connection to reconnect after `grpc_max_connection_age_s` and drops it `write_timeout_s` later."""

    def __init__(self, budget: MessageBudget, shares: int = CONNECTION_SHARES) -> None:
        self.budget = budget
        self.share = budget.memory.total // shares
        self.held: dict[str, int] = {}  # bytes by peer: a peer's address and port are one connection
        self.total = 0

    def admit(self, peer: str) -> None:
        """Refuse a new call of `peer` if answers already leave it nothing to wait for."""
        held = self.held.get(peer, 0)
        if held >= self.share:
            raise Refused(
                f"this connection's answers not yet read hold {held >> 20} MiB, its share of "
                f"{self.share >> 20} MiB of the server's memory; read them, then call again"
            )
        room = self.budget.memory.total - self.total
        if room < self.budget.message_limit:
            raise Refused(
                f"answers waiting for their clients to read them hold {self.total >> 20} MiB of the server's "
                f"{self.budget.memory.total >> 20} MiB for messages; retry shortly"
            )

    def hold(self, peer: str, size: int, reservation: Reservation) -> Callable[[object], None]:
        """Count `size` bytes of `peer`'s answer, from `reservation` (which it takes over) and the
        budget; the callback that gives them back once the call is done."""
        held = self.held.get(peer, 0)
        if held + size > self.share:
            raise Refused(
                f"the answer takes {size >> 20} MiB until it is read; this connection's answers not yet read "
                f"would then hold more than its share of {self.share >> 20} MiB; read them, or ask for fewer rows"
            )
        if not reservation.become(size):
            raise Refused(
                f"the server's {self.budget.memory.total >> 20} MiB for messages are taken by messages and "
                "answers in transit; retry shortly"
            )
        self.held[peer] = held + size
        self.total += size

        def release(_: object) -> None:
            reservation.release()
            left = self.held.pop(peer) - size
            if left:
                self.held[peer] = left
            self.total -= size

        return release


# ---------------------------------------------------------------------- the service

RequestT = TypeVar("RequestT", bound=Message)
Handler = Callable[[Any], Awaitable[Message]]
ServicerContext = grpc.aio.ServicerContext[bytes, bytes]


class InferenceService:
    """The six calls of the protocol over one server's state."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.settings = state.settings
        self.calls = CallTable(state.settings.max_connections)
        self.messages = MessageBudget(state.bodies.buffer.total, receive_limit(state), state.bodies.wait_s)
        self.answers = Answers(self.messages)
        self.answer_limit = answer_limit(state)
        self.probe_receivers = CallTable(PROBE_RECEIVERS, probe_slots=0)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """Each method's handler, registered with gRPC's core one by one: the core then queues
        each method's new calls apart, so calls of a flood wait behind each other, not in front of
        the kubelet's ServerLive (on one queue, 2,000 half-open connections held it 1-3 s and
        past the core's backlog of 1,000 calls it refused some)."""
        methods: dict[str, tuple[type[Message], Handler]] = {
            "ServerLive": (pb.ServerLiveRequest, self.server_live),
            "ServerReady": (pb.ServerReadyRequest, self.server_ready),
            "ModelReady": (pb.ModelReadyRequest, self.model_ready),
            "ServerMetadata": (pb.ServerMetadataRequest, self.server_metadata),
            "ModelMetadata": (pb.ModelMetadataRequest, self.model_metadata),
            "ModelInfer": (pb.ModelInferRequest, self.model_infer),
        }
        return {
            name: grpc.stream_unary_rpc_method_handler(self._bounded(name, message, handler))
            for name, (message, handler) in methods.items()
        }

    def _bounded(
        self, name: str, message: type[Message], handler: Handler
    ) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]:
        """`handler` for one message of type `message`, read under the call table, the message
        budget and the body timeout, its errors answered with their status.

        A failure is aborted only once the frames that held the message are gone: gRPC keeps the
        abort's exception with the call, whose traceback keeps those frames' locals (the message
        and its tensors) in a cycle until a collection; 100 calls of 19 MiB refused one after
        another so grew the server 120 MiB a second."""
        probe = name in PROBES

        async def call(requests: AsyncIterator[bytes], context: ServicerContext) -> bytes:
            outcome = await self._serve(name, message, handler, probe, context)
            if isinstance(outcome, Failure):
                await context.abort(outcome.code, outcome.details)
                raise AssertionError("abort raises")
            return outcome

        return call

    async def _serve(
        self, name: str, message: type[Message], handler: Handler, probe: bool, context: ServicerContext
    ) -> bytes | Failure:
        """The call's answer, serialized; once handed to gRPC it is counted (`Answers`) until it
        has left, the probes' excepted (they must always answer, and their answers are a few bytes).
        The call's slot is given back now: answers that wait, counted by their bytes and their
        calls', would otherwise fill the call table as cheaply as they fill a connection's share."""
        peer = "" if probe else context.peer()
        try:
            if not probe:
                self.answers.admit(peer)
            entry = self.calls.enter(probe)
        except Refused as exc:
            return Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        reservation: Reservation | None = None
        try:
            if name in UNREAD:
                raw = b""
            elif probe:
                raw = await self._receive_probe(context)
            else:
                reservation = await self.messages.reserve()
                raw = await self._receive(context)
                reservation.keep(RECEIVED_COPIES * len(raw))
            entry.waiting = False
            request = message.FromString(raw)
            del raw
            answer = await self._answer(name, handler, request)
            if isinstance(answer, Failure):
                return answer
            serialized = answer.SerializeToString()
            del answer
            if reservation is not None:
                release = self.answers.hold(peer, ANSWER_COPIES * len(serialized) + CALL_BYTES, reservation)
                context.add_done_callback(cast(Any, release))  # the stubs' callback type is a class of theirs
                reservation = None
            return serialized
        except Refused as exc:
            return Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Ended as exc:
            return exc.failure
        except DecodeError as exc:
            return Failure(grpc.StatusCode.INVALID_ARGUMENT, f"not a {message.__name__}: {exc}")
        finally:
            self.calls.leave(entry)
            if reservation is not None:
                reservation.release()

    async def _receive_probe(self, context: ServicerContext) -> bytes:
        """A probe's message, received beside the budget: at PROBE_RECEIVERS, the newcomer ends
        the probe receiving longest (a probe's message is a name; one that does not come is hostile)."""
        receiver = self.probe_receivers.enter(probe=False)
        try:
            return await self._receive(context)
        finally:
            self.probe_receivers.leave(receiver)

    async def _receive(self, context: ServicerContext) -> bytes:
        """The call's one message, read through its context: the request iterator gRPC hands the
        handler keeps the last message it yielded in a cycle of its own until a collection."""
        timeout = self.settings.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                raw = await context.read()
        except TimeoutError:
            raise Ended(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the request message did not arrive within {timeout:g} s"
            ) from None
        if not isinstance(raw, bytes):  # grpc.aio.EOF
            raise Ended(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")
        return raw

    async def _answer(self, name: str, handler: Handler, request: Message) -> Message | Failure:
        try:
            return await handler(request)
        except ServerError as exc:
            return Failure(grpc_status_of(exc), str(exc))
        except Exception as exc:
            request_id = uuid.uuid4().hex[:16]
            log.error("unhandled error in gRPC %s (request id %s)", name, request_id, exc_info=exc)
            return Failure(
                grpc.StatusCode.INTERNAL, f"internal error (request id {request_id}); the server log has the details"
            )

    # ------------------------------------------------------------------ the calls

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        ready, _ = self.state.readiness()
        return pb.ServerReadyResponse(ready=ready)

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        self.state.dataplane.check_model(request.name)
        try:
            self.state.repository.resolve(request.version or None)
        except ModelNotFound:
            raise
        except ServerError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not self.state.draining)

    async def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="model-server", version=__version__)

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        self.state.dataplane.check_model(request.name)
        served = self.state.repository.resolve(request.version or None)
        response = pb.ModelMetadataResponse(
            name=self.settings.name,
            versions=sorted(self.state.repository.served, key=version_key),
            platform=served.backend.platform,
        )
        for specs, tensors in ((served.inputs, response.inputs), (served.outputs, response.outputs)):
            for spec in specs:
                tensors.add(name=spec.name, datatype=spec.datatype, shape=spec.shape if spec.shape else [-1])
        return response

    async def model_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        """Decoded here, then served by the data plane as REST's infer is (DataPlane.predict);
        counted in the request metrics under the status REST would have answered."""
        with self.state.metrics.track(self.settings.name) as tracker:
            try:
                dataplane = self.state.dataplane
                dataplane.check_model(request.model_name)
                decoded = decode_infer_request(request)
                served, outputs = await dataplane.predict(decoded.version, decoded.inputs, decoded.outputs, tracker)
                return encode_infer_response(decoded, self.settings.name, served.version, outputs, self.answer_limit)
            except ServerError as exc:
                tracker.code = status_of(exc)
                raise
            except asyncio.CancelledError:
                tracker.code = CLIENT_CLOSED
                raise
            except Exception:
                tracker.code = INTERNAL_ERROR
                raise


def receive_limit(state: AppState) -> int:
    """The largest message a call may send: REST's largest body."""
    return min(MAX_MESSAGE_BYTES, state.settings.max_body_bytes)


def answer_limit(state: AppState) -> int:
    """The largest answer: one that a connection's share of the message budget holds until it
    is read (a larger one is refused before it is encoded, with its size)."""
    budget = max(state.bodies.buffer.total, receive_limit(state))
    share = budget // CONNECTION_SHARES // ANSWER_COPIES
    return min(MAX_MESSAGE_BYTES, state.settings.parse_memory_bytes, share)


def server_options(state: AppState) -> list[tuple[str, int]]:
    """The listener's bounds, from the settings every port shares."""
    settings = state.settings
    return [
        ("grpc.max_receive_message_length", receive_limit(state)),
        # No window grows beyond the lookahead until its call asks for its message.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES),
        ("grpc.max_send_message_length", answer_limit(state)),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_allowed_incoming_connections", CONNECTIONS_PER_CALL_SLOT * settings.max_connections),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", settings.keep_alive_timeout_s * 1000),
        # An answer whose client never reads it leaves with its connection, within both.
        ("grpc.max_connection_age_ms", int(settings.grpc_max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(settings.write_timeout_s * 1000)),
        ("grpc.max_metadata_size", settings.max_header_bytes),
        ("grpc.absolute_max_metadata_size", settings.max_header_bytes),
        ("grpc.so_reuseport", 0),
    ]


class GrpcFrontEnd:
    """The gRPC listener of one server: started and stopped by the process edge (runner.py)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.service = InferenceService(state)
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Listen on `grpc_port` (0: a free port); the port bound."""
        settings = self.state.settings
        server = grpc.aio.server(options=server_options(self.state))
        server.add_registered_method_handlers(SERVICE, self.service.handlers())
        self.port = server.add_insecure_port(f"{_host(settings.host)}:{settings.grpc_port or 0}")
        await server.start()
        self.server = server
        log.info("gRPC on :%d", self.port)
        return self.port

    async def stop(self, grace_s: float) -> None:
        """No new calls; calls in progress get `grace_s` to finish."""
        if self.server is not None:
            await self.server.stop(grace_s)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

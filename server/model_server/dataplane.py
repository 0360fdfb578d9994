"""Inference whatever the transport: a request body in, an encoded answer out.

Every front end calls these methods, as KServe's `DataPlane` is called by its REST and gRPC
servers: the FastAPI routes and the fast path in front of them (fastpath.py) with a body to
decode (`infer`, `infer_simple`), the gRPC port with a request its codec decoded (`predict`,
which the other two end in too). What goes wrong
is raised as an `errors.ServerError` that says what happened; status codes, headers and
`Retry-After` are the HTTP layer's (api/errors.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from . import tracing
from .bodies import BodyDecoder, RequestBody
from .errors import ClientClosed, InvalidInput, ModelNotFound
from .jsoncodec import check_content_type, dumps
from .metrics import RequestTracker
from .protocol_simple import decode_simple
from .protocol_v2 import Answer, decode_request, encode_response, estimate_request_bytes
from .repository import ModelRepository, ServedVersion
from .settings import ServerSettings
from .tensors import shape_simple_rows, validate_inputs


class DataPlane:
    def __init__(self, settings: ServerSettings, repository: ModelRepository, bodies: BodyDecoder) -> None:
        self.settings = settings
        self.repository = repository
        self.bodies = bodies

    def check_model(self, name: str) -> None:
        if name != self.settings.name:
            raise ModelNotFound(f"unknown model '{name}'; this server serves '{self.settings.name}'")

    async def infer(
        self,
        model: str,
        version: str | None,
        body: RequestBody,
        media_type: str | None,
        header_length: str | None,
        tracker: RequestTracker,
    ) -> Answer:
        """Open Inference Protocol: `header_length` is the binary extension's JSON header size."""
        self.check_model(model)
        check_content_type(media_type, binary=True)
        with tracing.stage("decode"):
            req, arrays = await self.bodies.decode(
                body,
                lambda raw: decode_request(raw, header_length),
                lambda raw: estimate_request_bytes(raw, header_length),
            )
        served, outputs = await self.predict(version, arrays, [output.name for output in req.outputs or ()], tracker)
        if body.gone():
            raise ClientClosed("the client closed the connection before its answer")
        with tracing.stage("encode"):
            return encode_response(req, self.settings.name, served.version, outputs, self.settings.parse_memory_bytes)

    async def infer_simple(self, body: RequestBody, media_type: str | None, tracker: RequestTracker) -> Answer:
        """The simple API: rows in, the first output's rows out (a flat row in gives one row out)."""
        started = time.perf_counter()
        check_content_type(media_type)
        with tracing.stage("decode"):
            request, data = await self.bodies.decode(body, decode_simple)
        version = None if request.model_version is None else str(request.model_version)
        served = self.repository.resolve(version)
        if len(served.inputs) != 1:
            raise InvalidInput(
                f"model has {len(served.inputs)} inputs; /infer feeds exactly one, use "
                f"/v2/models/{self.settings.name}/infer"
            )
        spec = served.inputs[0]
        rows = shape_simple_rows(data, spec)
        served, outputs = await self.predict(version, {spec.name: rows}, (), tracker)
        if body.gone():
            raise ClientClosed("the client closed the connection before its answer")
        first = next(iter(outputs.values()))
        single = data.ndim == 1 and rows.shape[0] == 1 and first.ndim >= 2
        latency_ms = (time.perf_counter() - started) * 1000.0
        with tracing.stage("encode"):
            return Answer(
                dumps(
                    {"result": first[0] if single else first, "latency_ms": latency_ms, "model_version": served.version}
                )
            )

    async def predict(
        self, version: str | None, inputs: dict[str, np.ndarray], outputs: Sequence[str], tracker: RequestTracker
    ) -> tuple[ServedVersion, dict[str, np.ndarray]]:
        """What every protocol's infer does once its request is decoded: the version resolved
        (and counted), the outputs asked for checked against it, the inputs validated and batched."""
        served = self.repository.resolve(version)
        tracker.version = served.version
        if outputs:
            check_requested_outputs(outputs, [spec.name for spec in served.outputs])
        return served, await submit(served, inputs)


def check_requested_outputs(wanted: Sequence[str], known: Sequence[str]) -> None:
    """Refuse an output asked for twice (each would be encoded again: a small request for a
    huge answer) or one the model does not have (when it names its outputs)."""
    repeated = sorted(name for name, count in Counter(wanted).items() if count > 1)
    if repeated:
        raise InvalidInput(f"output(s) {repeated} requested more than once")
    unknown = [name for name in wanted if name not in known]
    if known and unknown:
        raise InvalidInput(f"unknown output(s) {unknown}; model outputs are {list(known)}")


async def submit(served: ServedVersion, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate against the version's signature, then queue for batching."""
    rows = validate_inputs(inputs, served.inputs, batchable=served.backend.batchable)
    return await served.batcher.submit(inputs, rows)

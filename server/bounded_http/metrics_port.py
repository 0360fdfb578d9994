"""The metrics port of the model server and of the activator: a second listener beside the main
one, on the same loop and under the same connection limits, serving the registry's exposition."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import Receive, Scope, Send

log = logging.getLogger("bounded_http.metrics_port")


class MetricsExposition:
    """The metrics port's app: the registry's exposition at any path, made at most once per
    `max_age_s` whoever asks. Made on the loop, a flood of scrapes (300 at once) held every
    port's answers for seconds; a second's staleness means nothing to a scrape every 15 s."""

    def __init__(self, registry: CollectorRegistry, max_age_s: float = 1.0) -> None:
        self.registry = registry
        self.max_age_s = max_age_s
        self._made_at = -max_age_s
        self._body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        now = time.monotonic()
        if now - self._made_at >= self.max_age_s:
            self._body, self._made_at = generate_latest(self.registry), now
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", b"%d" % len(self._body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})


async def listen(config: uvicorn.Config, server_state: Any) -> asyncio.Server:
    """The metrics listener: its connections kept in `server_state` (the main server's own, for
    the same shutdown and Date header, or one of their own, to outlive it), each under the limits
    `config` gives its protocol."""
    config.load()

    def connection(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
        protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state={}, _loop=_loop
        )
        return protocol

    server = await asyncio.get_running_loop().create_server(
        connection, host=config.host, port=config.port, backlog=config.backlog
    )
    log.info("metrics on :%d/metrics", config.port)
    return server

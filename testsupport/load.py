"""A bounded closed-loop HTTP load: `concurrency` workers posting one body round-robin to a list
of URLs until stopped or `max_seconds` have passed, counting what failed and why (used by the
autoscaler, vLLM and real-pods tests); `CompletionLoad` is the same load on an OpenAI-compatible
completions endpoint."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Self

import httpx


class Load:
    def __init__(
        self,
        urls: list[str],
        concurrency: int,
        max_seconds: float,
        body: Any = None,
        timeout: float = 10,
        on_success: Callable[[httpx.Response], None] | None = None,
        keep_alive: bool = True,
    ) -> None:
        self.urls = urls
        self.concurrency = concurrency
        self.max_seconds = max_seconds
        self.body = {"data": [0.1] * 64} if body is None else body
        self.timeout = timeout
        self.on_success = on_success  # sees each 200 answer (e.g. to count generated tokens)
        # Without keep-alive each request opens a connection: behind a Service, each picks a pod.
        self.limits = httpx.Limits() if keep_alive else httpx.Limits(max_keepalive_connections=0)
        self.sent = 0
        self.failed = 0
        self.failures: Counter[str] = Counter()  # "503", "ConnectError", ...
        self.started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        async with httpx.AsyncClient(timeout=self.timeout, limits=self.limits) as client:

            async def worker(i: int) -> None:
                url = self.urls[i % len(self.urls)]
                while not self._stop.is_set() and time.monotonic() < deadline:
                    try:
                        response = await client.post(url, json=self.body)
                        if response.status_code != 200:
                            self.failures[str(response.status_code)] += 1
                        elif self.on_success is not None:
                            self.on_success(response)
                    except httpx.HTTPError as exc:
                        self.failures[type(exc).__name__] += 1
                    self.sent += 1
                    self.failed = sum(self.failures.values())

            await asyncio.gather(*(worker(i) for i in range(self.concurrency)))

    def start(self) -> Self:
        self.started_at = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)


class CompletionLoad(Load):
    """`concurrency` workers posting /v1/completions for `model` back to back, counting generated tokens.

    EOS is ignored, so every completion is `max_tokens` long and each request costs the engine the same.
    """

    def __init__(self, url: str, model: str, concurrency: int, max_seconds: float, max_tokens: int = 48) -> None:
        body = {
            "model": model,
            "prompt": "the operator scales the model server on latency",
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        super().__init__([url], concurrency, max_seconds, body, timeout=60, on_success=self._count)
        self.tokens = 0

    def _count(self, response: httpx.Response) -> None:
        self.tokens += response.json()["usage"]["completion_tokens"]

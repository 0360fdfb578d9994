"""A small async client for Prometheus' instant-query API (`/api/v1/query`).

Only what the autoscaler needs: one scalar-ish answer per query, bounded time per attempt,
a few retries for what retrying can fix (connection errors, timeouts, 5xx, 429), optional
bearer token and private CA. A query Prometheus rejects (400/422) is not retried.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from dataclasses import dataclass
from typing import Any, Self

import httpx

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


class PrometheusError(Exception):
    """Prometheus could not answer: unreachable, failing, or the query is invalid."""


@dataclass(frozen=True)
class Sample:
    value: float
    timestamp: float


def parse_response(payload: dict) -> Sample | None:
    """The answer of an instant query; None for an empty vector (no matching series).

    The autoscaler's queries aggregate to one series; if a query ever yields more, the
    largest value is taken, which errs towards scaling up rather than down.
    """
    if payload.get("status") != "success":
        raise PrometheusError(f"{payload.get('errorType', 'error')}: {payload.get('error', payload)}")
    data: dict[str, Any] = payload.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind not in ("scalar", "vector"):
        raise PrometheusError(f"unexpected result type {kind!r}")
    try:
        points: list[Any] = [result] if kind == "scalar" else [item["value"] for item in result or []]
        # Prometheus spells NaN/+Inf the way float() reads them.
        samples = [Sample(float(text), float(timestamp)) for timestamp, text in points]
    except (TypeError, ValueError, KeyError) as exc:
        raise PrometheusError(f"malformed {kind} result {result!r}: {exc}") from None
    if not samples:
        return None
    finite = [s for s in samples if not math.isnan(s.value)]
    return max(finite, key=lambda s: s.value) if finite else samples[0]


class PrometheusClient:
    """Instant queries against one Prometheus; close with `aclose()` (or `async with`)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_pem: str | None = None,
        timeout: float = 5.0,
        retries: int = 2,
        backoff: float = 0.25,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        verify: ssl.SSLContext | bool = True
        if ca_pem:
            verify = ssl.create_default_context(cadata=ca_pem)
        self.url = url.rstrip("/")
        self._retries = retries
        self._backoff = backoff
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, verify=verify, timeout=httpx.Timeout(timeout), transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def query(self, promql: str) -> Sample | None:
        last: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                response = await self._http.get("/api/v1/query", params={"query": promql})
            except httpx.TransportError as exc:
                last = PrometheusError(f"{self.url} unreachable: {type(exc).__name__}: {exc}")
                continue
            if response.status_code in RETRYABLE_STATUS:
                last = PrometheusError(f"{self.url} answered {response.status_code}")
                continue
            if response.status_code in (400, 422):
                try:
                    return parse_response(response.json())
                except ValueError:
                    raise PrometheusError(f"query rejected ({response.status_code})") from None
            if response.status_code != 200:
                raise PrometheusError(f"{self.url} answered {response.status_code}")
            try:
                payload = response.json()
            except ValueError as exc:
                raise PrometheusError(f"{self.url} answered non-JSON: {exc}") from None
            return parse_response(payload)
        assert last is not None
        raise last

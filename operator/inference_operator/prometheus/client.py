"""A small async client for Prometheus' instant-query API (`/api/v1/query`).

Only what the autoscaler and the canary analysis need: one scalar-ish answer per query,
bounded time per attempt, a few retries for what retrying can fix (connection errors,
timeouts, 5xx, 429), optional bearer token and private CA. A query Prometheus rejects (400/422) is not retried.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from dataclasses import dataclass
from typing import Any, Self

import httpx

from ..jsontypes import JsonObject

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


# Prometheus' own error types (its API documentation); any other is reported as "unknown".
ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found", "not_acceptable"}
)


class PrometheusError(Exception):
    """Prometheus could not answer: unreachable, failing, or the query is invalid.

    The message names what failed (an HTTP status, an error class, Prometheus' error type from
    a fixed list) and never carries what the server sent: the URL is the InferenceService
    author's, and whatever answers there must not reach status, events or logs (SSRF)."""


@dataclass(frozen=True)
class Sample:
    value: float
    timestamp: float


def _result(payload: JsonObject) -> tuple[str, Any]:
    """The result type (scalar or vector) and result of a successful answer; otherwise
    PrometheusError, naming only what Prometheus documents."""
    if not isinstance(payload, dict):
        raise PrometheusError("not a Prometheus API answer")
    if payload.get("status") != "success":
        error_type = payload.get("errorType")
        raise PrometheusError(f"query failed: {error_type if error_type in ERROR_TYPES else 'unknown'} error")
    data = payload.get("data")
    data = data if isinstance(data, dict) else {}
    kind, result = data.get("resultType"), data.get("result")
    if kind not in ("scalar", "vector"):
        named = repr(kind) if kind in ("matrix", "string") else "none"
        raise PrometheusError(f"unexpected result type {named}: not a scalar or vector")
    return kind, result


def parse_response(payload: JsonObject) -> Sample | None:
    """The answer of an instant query; None for an empty vector (no matching series).

    The autoscaler's queries aggregate to one series; if a query ever yields more, the
    largest value is taken, which errs towards scaling up rather than down.
    """
    kind, result = _result(payload)
    try:
        points: list[Any] = [result] if kind == "scalar" else [item["value"] for item in result or []]
        # Prometheus spells NaN/+Inf the way float() reads them.
        samples = [Sample(float(text), float(timestamp)) for timestamp, text in points]
    except (TypeError, ValueError, KeyError):
        raise PrometheusError(f"malformed {kind} result") from None
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
                last = PrometheusError(f"{self.url} unreachable ({type(exc).__name__})")
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
            except ValueError:
                raise PrometheusError(f"{self.url} answered, but not with JSON") from None
            return parse_response(payload)
        assert last is not None
        raise last

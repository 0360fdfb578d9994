"""Asks every replica's adapters sidecar how its LoRA adapters stand, for status.adapters.

The I/O half of adapter_status: list the service's pods, GET each one's /adapters (one
deadline for the whole exchange, however slowly the answer trickles; a bounded answer, parsed
only when shallow; no redirect, no proxy from the operator's environment: the request goes to
the pod, or nowhere), a few replicas at a time, and sum up. Run by the `adapters` daemon in
handlers/adapters.py.
"""

from __future__ import annotations

import asyncio

import httpx

from . import adapter_status
from .adapter_status import Target
from .builders.adapters import STATUS_PATH, sidecar_port
from .builders.common import Owner, selector_string
from .jsontypes import JsonObject
from .k8s import KubeApi
from .kinds import POD

TIMEOUT_SECONDS = 2.0  # for the whole exchange with one replica, not per read
CONCURRENT_ASKS = 8  # replicas asked at once: the answers held at a time, the sockets open


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False, follow_redirects=False)


async def _read(http: httpx.AsyncClient, url: str) -> bytes | None:
    async with http.stream("GET", url) as answer:
        if answer.status_code != 200:
            return None
        body = bytearray()
        async for chunk in answer.aiter_bytes():
            body += chunk
            if len(body) > adapter_status.MAX_ANSWER_BYTES:
                return None
    return bytes(body)


async def _ask(http: httpx.AsyncClient, target: Target, timeout: float = TIMEOUT_SECONDS) -> JsonObject | None:
    """The sidecar's answer, or None (no answer in time, an error status, too long, not a
    shallow JSON object)."""
    try:
        async with asyncio.timeout(timeout):
            body = await _read(http, target.url)
    except (httpx.HTTPError, TimeoutError):
        return None
    return None if body is None else adapter_status.parse_answer(body)


async def answers(api: KubeApi, http: httpx.AsyncClient, owner: Owner) -> dict[str, JsonObject | None]:
    """pod name -> its sidecar's answer, reduced to what status.adapters reads, for every
    running replica of the service, CONCURRENT_ASKS at a time."""
    pods = await asyncio.to_thread(api.list_objects, *POD.key, owner.namespace, selector_string(owner))
    targets = adapter_status.targets(pods, sidecar_port(owner.spec), STATUS_PATH)
    wanted = {a.name: a.uri for a in owner.spec.adapters}
    slots = asyncio.Semaphore(CONCURRENT_ASKS)

    async def ask(target: Target) -> JsonObject | None:
        async with slots:
            return adapter_status.reduced(await _ask(http, target), wanted)

    found = await asyncio.gather(*(ask(target) for target in targets))
    return {target.pod: answer for target, answer in zip(targets, found, strict=True)}

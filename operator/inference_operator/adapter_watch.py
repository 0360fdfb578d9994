"""Asks every replica's adapters sidecar how its LoRA adapters stand, for status.adapters.

The I/O half of adapter_status: list the service's pods, GET each one's /adapters (a short
timeout, a bounded answer, no redirect, no proxy from the operator's environment: the request
goes to the pod, or nowhere), and sum up. Run by the `adapters` daemon in handlers.py.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from . import adapter_status
from .adapter_status import Target
from .builders.adapters import STATUS_PATH, sidecar_port
from .builders.common import Owner, selector_string
from .jsontypes import JsonObject
from .k8s import KubeApi

TIMEOUT_SECONDS = 2.0


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False, follow_redirects=False)


async def _ask(http: httpx.AsyncClient, target: Target) -> JsonObject | None:
    """The sidecar's answer, or None (no answer, an error status, too long, not a JSON object)."""
    try:
        async with http.stream("GET", target.url) as answer:
            if answer.status_code != 200:
                return None
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > adapter_status.MAX_ANSWER_BYTES:
                    return None
        data = json.loads(body)
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def answers(api: KubeApi, http: httpx.AsyncClient, owner: Owner) -> dict[str, JsonObject | None]:
    """pod name -> its sidecar's answer, for every running replica of the service."""
    pods = await asyncio.to_thread(api.list_objects, "v1", "Pod", owner.namespace, selector_string(owner))
    targets = adapter_status.targets(pods, sidecar_port(owner.spec), STATUS_PATH)
    found = await asyncio.gather(*(_ask(http, target) for target in targets))
    return {target.pod: answer for target, answer in zip(targets, found, strict=True)}

"""The few Kubernetes API calls the activator makes, over httpx: list and watch its
EndpointSlices, get a Service, list the pods of one IP address (`ClientNamespaces`: whose a
client is), merge-patch an InferenceService's wake annotation.

In a pod it reads the API server's address from KUBERNETES_SERVICE_HOST/PORT and its
ServiceAccount's token and CA from their mounted files; the token is read again whenever the
file changes (a projected token is rotated by the kubelet while the pod runs).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
PODS = "/api/v1/pods"
#: How long the API server keeps one watch open before it ends it (and it is watched again).
WATCH_SECONDS = 290
#: The largest line of a watch stream: an EndpointSlice is a few KiB, a thousand endpoints ~100 KiB.
MAX_EVENT_BYTES = 4 * 1024 * 1024


class ApiError(Exception):
    """The API server answered with an error (or a watch said so); `code` is its HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass
class TokenFile:
    """A bearer token file, read again when its modification time or size changes."""

    path: Path
    _seen: tuple[int, int] | None = None
    _token: str = ""

    def token(self) -> str:
        stat = self.path.stat()
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._token, self._seen = self.path.read_text().strip(), seen
        return self._token


@dataclass
class KubeApi:
    """An API server at `base_url`, as one ServiceAccount."""

    base_url: str
    token: TokenFile | None = None
    ca_file: Path | None = None
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] = os.environ) -> KubeApi:
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not in a cluster (no KUBERNETES_SERVICE_HOST): give --kube-api")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", TokenFile(SERVICE_ACCOUNT / "token"), SERVICE_ACCOUNT / "ca.crt")

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            verify: Any = str(self.ca_file) if self.ca_file is not None else True
            timeout = httpx.Timeout(connect=5.0, read=30.0, write=10.0, pool=10.0)
            self._client = httpx.AsyncClient(base_url=self.base_url, verify=verify, timeout=timeout, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token.token()}"
        return headers

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`; None if there is none."""
        response = await self.client.get(path, headers=self._headers())
        if response.status_code == 404:
            return None
        _raise_for(response)
        result: dict[str, Any] = response.json()
        return result

    async def list(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        response = await self.client.get(path, params=dict(params), headers=self._headers())
        _raise_for(response)
        result: dict[str, Any] = response.json()
        return result

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> None:
        headers = {**self._headers(), "content-type": "application/merge-patch+json"}
        response = await self.client.patch(path, content=json.dumps(patch).encode(), headers=headers)
        _raise_for(response)

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch, until the API server ends it. An ERROR event raises ApiError
        with its code (410: the resourceVersion is too old, list again)."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        timeout = httpx.Timeout(connect=5.0, read=WATCH_SECONDS + 30.0, write=10.0, pool=10.0)
        async with self.client.stream("GET", path, params=query, headers=self._headers(), timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
                _raise_for(response)
            buffer = b""
            async for chunk in response.aiter_bytes():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _event(line)
                if len(buffer) > MAX_EVENT_BYTES:
                    raise ApiError(0, f"a watch event over {MAX_EVENT_BYTES} bytes")


def _event(line: bytes) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise ApiError(int(status.get("code") or 0), str(status.get("message") or "watch error"))
    return event


def _raise_for(response: httpx.Response) -> None:
    if response.status_code >= 400:
        try:
            message = str(response.json().get("message") or response.reason_phrase)
        except ValueError:
            message = response.reason_phrase
        raise ApiError(response.status_code, message)


@dataclass
class ClientNamespaces:
    """The namespace of a client address: that of the running pod with that IP, as the API
    server says (a list of all namespaces' pods by `status.podIP`). None when no pod has it, or
    pods of several namespaces share it (host-network pods: the node's address), or the API
    server does not answer. Answers are kept `ttl_s`, for at most `max_entries` addresses;
    lookups of one address at once are one, and at most `max_lookups` are made at once.
    A short TTL: a pod's IP goes to another pod once it is deleted."""

    api: KubeApi
    ttl_s: float = 2.0
    max_entries: int = 4096
    max_lookups: int = 4
    clock: Callable[[], float] = time.monotonic
    _known: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    _asked: dict[str, asyncio.Future[str | None]] = field(default_factory=dict)
    _lookups: asyncio.Semaphore | None = None

    async def of(self, ip: str) -> str | None:
        known = self._known.get(ip)
        if known is not None and known[0] > self.clock():
            return known[1]
        asked = self._asked.get(ip)
        if asked is None:
            asked = self._asked[ip] = asyncio.ensure_future(self._look_up(ip))
            asked.add_done_callback(lambda _: self._asked.pop(ip, None))
        return await asyncio.shield(asked)

    async def _look_up(self, ip: str) -> str | None:
        if self._lookups is None:
            self._lookups = asyncio.Semaphore(self.max_lookups)
        async with self._lookups:
            try:
                listing = await self.api.list(PODS, {"fieldSelector": f"status.podIP={ip}", "limit": "50"})
                namespaces = {
                    str((pod.get("metadata") or {}).get("namespace") or "")
                    for pod in listing.get("items") or []
                    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                }
            except (ApiError, httpx.HTTPError, ValueError, AttributeError):
                namespaces = set()
        namespace = next(iter(namespaces)) if len(namespaces) == 1 else None
        self._known.pop(ip, None)
        while len(self._known) >= self.max_entries:
            del self._known[next(iter(self._known))]
        self._known[ip] = (self.clock() + self.ttl_s, namespace)
        return namespace


def service_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(name, safe='')}"


def inference_service_path(namespace: str, name: str) -> str:
    return (
        f"/apis/inference.rocm.dev/v1alpha1/namespaces/{quote(namespace, safe='')}"
        f"/inferenceservices/{quote(name, safe='')}"
    )

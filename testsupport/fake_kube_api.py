"""A small API server for the activator's tests: what the activator asks of Kubernetes and no
more. EndpointSlices listed (equality label selectors) and watched from a resourceVersion,
Services got by name, pods listed by their IP (`fieldSelector=status.podIP=...`, all namespaces),
InferenceService merge patches recorded. Objects are set from the test's
thread; the server runs on a thread of its own (`running_api`).

A watch can be ended from the test (`break_watches`) or answered 410 Gone (`expire_watches`),
as a real API server ends watches and compacts its history.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import uvicorn

from testsupport.processes import free_port

SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
PODS = "/api/v1/pods"


@dataclass
class Patch:
    namespace: str
    name: str
    body: dict[str, Any]
    authorization: str


@dataclass
class FakeKubeApi:
    """The state: slices and their events, Services, patches seen. Every method is thread-safe."""

    slices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    version: int = 1
    watch_generation: int = 0
    expired_below: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ the test's side

    def put_service(self, service: dict[str, Any]) -> None:
        with self.lock:
            meta = service["metadata"]
            self.services[meta["namespace"], meta["name"]] = copy.deepcopy(service)

    def put_pod(self, namespace: str, name: str, ip: str, phase: str = "Running") -> None:
        with self.lock:
            self.pods[namespace, name] = {
                "metadata": {"namespace": namespace, "name": name},
                "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]},
            }

    def put_slice(self, slice_: dict[str, Any]) -> None:
        with self.lock:
            meta = slice_["metadata"]
            key = meta["namespace"], meta["name"]
            kind = "MODIFIED" if key in self.slices else "ADDED"
            self.version += 1
            stored = copy.deepcopy(slice_)
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.slices[key] = stored
            self.events.append((self.version, kind, stored))

    def delete_slice(self, namespace: str, name: str) -> None:
        with self.lock:
            stored = self.slices.pop((namespace, name))
            self.version += 1
            gone = copy.deepcopy(stored)
            gone["metadata"]["resourceVersion"] = str(self.version)
            self.events.append((self.version, "DELETED", gone))

    def break_watches(self) -> None:
        """Every open watch ends (as at the API server's timeout)."""
        with self.lock:
            self.watch_generation += 1

    def expire_watches(self) -> None:
        """Open watches end, and a watch from any version seen so far is answered 410."""
        with self.lock:
            self.expired_below = self.version + 1
            self.watch_generation += 1

    def patches_of(self, namespace: str, name: str) -> list[Patch]:
        with self.lock:
            return [p for p in self.patches if (p.namespace, p.name) == (namespace, name)]

    def seen(self, path: str) -> int:
        with self.lock:
            return self.requests.count(path)

    # ------------------------------------------------------------------ the API server's side

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
        headers = dict(scope["headers"])
        with self.lock:
            self.requests.append(path)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        parts = path.strip("/").split("/")
        if path == SLICES and query.get("watch") in ("1", "true"):
            gone = asyncio.ensure_future(receive())  # the next message is the client's leaving
            try:
                await self._watch(query, send, gone)
            finally:
                gone.cancel()
        elif path == SLICES:
            await _json(send, self._list(query.get("labelSelector", "")))
        elif path == PODS:
            await _json(send, self._pods(query.get("fieldSelector", "")))
        elif len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "services":
            with self.lock:
                service = self.services.get((parts[3], parts[5]))
            await _json(send, service or _status(404, "not found"), 200 if service else 404)
        elif method == "PATCH" and len(parts) == 7 and parts[5] == "inferenceservices":
            authorization = headers.get(b"authorization", b"").decode()
            with self.lock:
                self.patches.append(Patch(parts[4], parts[6], json.loads(body), authorization))
            await _json(send, {"metadata": {"namespace": parts[4], "name": parts[6]}})
        else:
            await _json(send, _status(404, f"no {path}"), 404)

    def _list(self, selector: str) -> dict[str, Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        with self.lock:
            items = [copy.deepcopy(s) for s in self.slices.values() if _matches(s, wanted)]
            version = str(self.version)
        return {"kind": "EndpointSliceList", "metadata": {"resourceVersion": version}, "items": items}

    def _pods(self, selector: str) -> dict[str, Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        with self.lock:
            items = [
                copy.deepcopy(pod)
                for pod in self.pods.values()
                if all(k == "status.podIP" and pod["status"]["podIP"] == v for k, v in wanted.items())
            ]
        return {"kind": "PodList", "metadata": {"resourceVersion": str(self.version)}, "items": items}

    async def _watch(self, query: dict[str, str], send: Any, gone: asyncio.Future[Any]) -> None:
        wanted = dict(term.split("=", 1) for term in query.get("labelSelector", "").split(",") if "=" in term)
        since = int(query.get("resourceVersion") or 0)
        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
        await send(start)
        with self.lock:
            generation = self.watch_generation
            expired = since < self.expired_below
        if expired:
            error = {"type": "ERROR", "object": _status(410, "too old resource version")}
            await send({"type": "http.response.body", "body": json.dumps(error).encode() + b"\n"})
            return
        while True:
            with self.lock:
                fresh = [(v, kind, copy.deepcopy(obj)) for v, kind, obj in self.events if v > since]
                ended = self.watch_generation != generation
            for version, kind, obj in fresh:
                since = version
                if _matches(obj, wanted):
                    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                    await send({"type": "http.response.body", "body": line, "more_body": True})
            if gone.done():
                return
            if ended:
                await send({"type": "http.response.body", "body": b""})
                return
            await asyncio.sleep(0.02)


def _matches(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "status": "Failure", "code": code, "message": message}


async def _json(send: Any, value: object, status: int = 200) -> None:
    body = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def running_api(api: FakeKubeApi) -> Iterator[str]:
    """`api` served on loopback from a thread; its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True, name="fake-kube-api")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the fake API server did not start")
            threading.Event().wait(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = True  # watches held open do not end by themselves
        thread.join(10)


def service(
    namespace: str,
    name: str,
    cluster_ip: str,
    port: int,
    selector: dict[str, str] | None = None,
    grpc_port: int | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """A ClusterIP Service with one port named http (and one named grpc, with `grpc_port`),
    owned (controller) by the InferenceService `owner` when one is named, as the operator's are."""
    grpc = [{"name": "grpc", "port": grpc_port, "targetPort": 9000, "protocol": "TCP", "appProtocol": "grpc"}]
    metadata: dict[str, Any] = {"namespace": namespace, "name": name}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "inference.rocm.dev/v1alpha1",
                "kind": "InferenceService",
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "selector": {"app": name.removesuffix("-private")} if selector is None else selector,
            "ports": [
                {"name": "http", "port": port, "targetPort": 8000, "protocol": "TCP"},
                *(grpc if grpc_port is not None else []),
            ],
        },
    }


def activator_slice(namespace: str, service_name: str, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The slice the operator keeps while `service_name` is at zero."""
    metadata: dict[str, Any] = {
        "namespace": namespace,
        "name": f"{service_name}-activator",
        "labels": {
            "kubernetes.io/service-name": service_name,
            "endpointslice.kubernetes.io/managed-by": "activator.inference.rocm.dev",
        },
    }
    if policy is not None:
        metadata["annotations"] = {"inference.rocm.dev/activator": json.dumps(policy)}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
    }

"""A running emulated cluster on loopback, for tests that drive the real operator against it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import httpx
import kmock
import kubernetes
import yaml

from inference_operator.jsontypes import JsonObject
from inference_operator.k8s import KubeApi, Ref
from testsupport.emulator import CR_RESOURCE, ClusterEmulator
from testsupport.waiting import eventually

DEPLOYMENTS = "apps/v1/deployments"


@dataclass
class Cluster:
    """The emulator, its URL, and a small client for what a user would do with kubectl."""

    emulator: ClusterEmulator
    url: str
    kubeconfig: pathlib.Path

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
    ) -> httpx.Response:
        headers = {"Content-Type": content_type} if body is not None else {}
        return httpx.request(method, self.url + path, json=body, headers=headers, timeout=10)

    def apply_cr(self, obj: JsonObject) -> httpx.Response:
        ns = obj["metadata"].get("namespace", "default")
        return self.request(
            "POST",
            f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices",
            obj,
            content_type="application/json",
        )

    def add_secret(
        self, namespace: str, name: str, data: dict[str, bytes], labels: dict[str, str] | None = None
    ) -> None:
        """Create an Opaque Secret holding `data` (base64-encoded here), with `labels` if given."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if labels is not None:
            metadata["labels"] = labels
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
        }
        response = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/secrets", secret, content_type="application/json"
        )
        assert response.status_code in (200, 201), response.text

    def patch(
        self, resource: str, namespace: str, name: str, patch: JsonObject, subresource: str = ""
    ) -> httpx.Response:
        prefix = "/api" if resource.count("/") == 1 else "/apis"
        group_version, plural = resource.rsplit("/", 1)
        path = f"{prefix}/{group_version}/namespaces/{namespace}/{plural}/{name}"
        return self.request("PATCH", path + (f"/{subresource}" if subresource else ""), patch)

    def complete_rollout(self, namespace: str, name: str, replicas: int) -> httpx.Response:
        """Play the Deployment controller and the kubelet, which the emulator lacks: the current
        generation of Deployment `name` is rolled out and `replicas` pods are ready."""
        deployment = self.get(DEPLOYMENTS, namespace, name)
        assert deployment is not None, f"no Deployment {namespace}/{name}"
        counts = ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas")
        status = {"observedGeneration": deployment["metadata"]["generation"], **dict.fromkeys(counts, replicas)}
        status["conditions"] = [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ]
        response = self.patch(DEPLOYMENTS, namespace, name, {"status": status}, subresource="status")
        response.raise_for_status()
        return response

    def patch_cr(self, namespace: str, name: str, patch: JsonObject) -> httpx.Response:
        return self.patch(CR_RESOURCE, namespace, name, patch)

    def get(self, resource: str, namespace: str, name: str) -> JsonObject | None:
        try:
            obj = self.emulator.objects[resource, namespace, name]
        except KeyError:
            return None
        return None if obj.deleted else obj.raw

    def get_cr(self, namespace: str, name: str) -> JsonObject | None:
        return self.get(CR_RESOURCE, namespace, name)

    def wait_condition(
        self,
        namespace: str,
        name: str,
        type_: str,
        status: str | None = None,
        reason: str | None = None,
        timeout: float = 30,
    ) -> JsonObject:
        """An InferenceService's condition of `type_` once it has this status and reason (each
        if given); fails naming what it waited for."""

        def matching() -> JsonObject | None:
            found = condition(self.get_cr(namespace, name), type_)
            if found is None or (status, reason) != (status and found["status"], reason and found.get("reason")):
                return None
            return found

        wanted = " ".join(filter(None, [type_, status, reason]))
        result: JsonObject = wait_for(matching, timeout=timeout, message=f"{wanted} on {namespace}/{name}")
        return result

    def replicas(self, namespace: str, name: str) -> int | None:
        """An InferenceService's spec.replicas (what the autoscaler writes)."""
        cr = self.get_cr(namespace, name)
        return None if cr is None else cr["spec"].get("replicas")

    def autoscaler_status(self, namespace: str, name: str) -> JsonObject:
        cr = self.get_cr(namespace, name) or {}
        return (cr.get("status") or {}).get("autoscaler") or {}

    def events(self, namespace: str, involving: str | None = None) -> list[JsonObject]:
        """Kubernetes events posted in `namespace`, optionally about one object by name."""
        found = []
        for (resource, ns, _), obj in list(self.emulator.objects.items()):
            if resource.plural == "events" and ns == namespace and not obj.deleted:
                event = obj.raw
                if involving is None or event.get("involvedObject", {}).get("name") == involving:
                    found.append(event)
        return found


@dataclass
class ReplicaRecorder:
    """Samples an InferenceService's spec.replicas every 20 ms from a thread, keeping each
    change with its wall time: what the autoscaler wrote, and when."""

    cluster: Cluster
    namespace: str
    name: str
    changes: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        # The caller may have seen a change the thread had not sampled yet when told to stop;
        # one last sample keeps it (a one-step scale-down would otherwise go unrecorded).
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def _sample(self) -> None:
        current = self.cluster.replicas(self.namespace, self.name)
        if current is not None and (not self.changes or current != self.changes[-1][1]):
            self.changes.append((time.time(), current))

    def writes(self) -> list[tuple[float, int, int]]:
        """(time, before, after) of each change."""
        return [(t, before, after) for (_, before), (t, after) in itertools.pairwise(self.changes)]


def inference_service(name: str, namespace: str, spec: JsonObject) -> JsonObject:
    """An InferenceService manifest, as a test applies it."""
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def condition(obj: JsonObject | None, type_: str) -> JsonObject | None:
    """The condition of `type_` in an object's status, if it has one."""
    conditions: list[JsonObject] = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 20,
    interval: float = 0.05,
    message: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail naming what we waited for
    (`eventually`, with this module's names)."""
    return eventually(predicate, timeout=timeout, interval=interval, what=message, ignore=ignore)


def wait_quiet(read: Callable[[], Any], quiet: float = 0.5, timeout: float = 20, message: str = "quiet") -> Any:
    """Poll `read()` until its value has stayed the same for `quiet` seconds; return it (what
    a test that says "nothing more happens" waits for, rather than a fixed sleep)."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(min(0.05, quiet))
        if (now := read()) != value:
            value, since = now, time.monotonic()
    return value


@contextlib.contextmanager
def running_cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    """Serve a ClusterEmulator on 127.0.0.1 from a thread of its own, with a kubeconfig for it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="emulator", daemon=True)
    thread.start()
    emulator = ClusterEmulator()
    server = kmock.Server(emulator)

    async def start() -> None:
        await emulator.__aenter__()
        await server.__aenter__()

    async def stop() -> None:
        await server.__aexit__(None, None, None)
        await emulator.__aexit__(None, None, None)

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    url = f"http://127.0.0.1:{server.port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
                "current-context": "emulator",
            }
        )
    )
    try:
        yield Cluster(emulator=emulator, url=url, kubeconfig=kubeconfig)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


class LogCapture(logging.Handler):
    """Collects the operator's per-object log lines while it runs (KopfRunner's output is
    only readable after it stops)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []
        self.times: list[float] = []  # each line's wall-clock time, as `time.time()` reads it

    def emit(self, record: logging.LogRecord) -> None:
        self.times.append(record.created)
        self.lines.append(record.getMessage())

    def timed(self, fragment: str) -> list[tuple[float, str]]:
        """The lines holding `fragment`, with the time each was logged."""
        return [(t, line) for t, line in zip(list(self.times), list(self.lines), strict=False) if fragment in line]

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in list(self.lines))


@contextlib.contextmanager
def captured_operator_logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    logger = logging.getLogger("kopf.objects")
    logger.addHandler(capture)
    try:
        yield capture
    finally:
        logger.removeHandler(capture)


class CountingApi(KubeApi):
    """The operator's API client to a `Cluster`, counting its reads (GETs and LISTs): what a test
    of "this costs no read" asserts on."""

    def __init__(self, cluster: Cluster) -> None:
        client = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        super().__init__(client, timeout=10)
        self.reads = 0

    def get(self, ref: Ref) -> JsonObject | None:
        self.reads += 1
        return super().get(ref)

    def list_objects(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[JsonObject]:
        self.reads += 1
        return super().list_objects(api_version, kind, namespace, label_selector)

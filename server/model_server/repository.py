"""Model repository: the versions being served, kept in line with what is on
disk (discovery.py), with hot reload.

Loading and warmup happen in a thread, off the request path; the map of served
versions is replaced in one assignment, so a request sees either the old or the
new map, never a half-built one. A replaced or removed version drains its queue
before its runtime is released. A version that fails to load is recorded with
the reason and not retried until its files change, while the versions already
being served keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .backends import Backend, create_backend
from .backends.torch import SIGNATURE_FILE
from .batching import DynamicBatcher
from .discovery import Fingerprint, VersionSource, discover, latest_version, select_versions, version_key
from .errors import ModelNotFound, ModelNotReady
from .loading import BackendFactory, in_daemon_thread, load_instances
from .metrics import ServerMetrics
from .settings import ServerSettings
from .tensors import TensorSpec

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ServedVersion:
    """One loaded version: its runtime and its batching queue."""

    version: str
    source: VersionSource
    backends: list[Backend]  # one per model instance (device)
    batcher: DynamicBatcher
    loaded_at: float = field(default_factory=time.time)

    @property
    def backend(self) -> Backend:
        """The first instance: all instances share one signature."""
        return self.backends[0]

    def close(self) -> None:
        for backend in self.backends:
            backend.close()

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.backend.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.backend.outputs


@dataclass(frozen=True, slots=True)
class LoadFailure:
    fingerprint: Fingerprint
    reason: str


class ModelRepository:
    """Keeps the served versions in line with what is on disk."""

    def __init__(
        self,
        settings: ServerSettings,
        metrics: ServerMetrics,
        *,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.root = settings.model
        self._factory = backend_factory or (lambda p, s, v, i: create_backend(p, s, version=v, device_index=i))
        self._served: Mapping[str, ServedVersion] = MappingProxyType({})
        self._latest: ServedVersion | None = None
        self._available: dict[str, VersionSource] = {}
        self._failed: dict[str, LoadFailure] = {}
        self._loading: set[str] = set()
        self._scanned = asyncio.Event()  # the first scan has finished (loaded or failed)
        self._sync_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Begin loading in the background: liveness answers while a large model loads."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="model-repository")

    @property
    def scanned(self) -> bool:
        """The first scan has finished (loaded or failed)."""
        return self._scanned.is_set()

    async def wait_loaded(self) -> None:
        """Until the first scan has finished (loaded or failed), or the repository stops."""
        waits = [asyncio.ensure_future(event.wait()) for event in (self._scanned, self._stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def stop(self, drain_timeout: float) -> None:
        """Stop watching, drain every queue (bounded), release the runtimes."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        served = list(self._served.values())
        await asyncio.gather(
            *(sv.batcher.close(drain_timeout) for sv in served),
            *self._retiring,
            return_exceptions=True,
        )
        for sv in served:
            await asyncio.to_thread(sv.close)

    def flush(self) -> None:
        """Run every queued request now (shutdown has begun)."""
        for served in self._served.values():
            served.batcher.flush()

    async def _run(self) -> None:
        try:
            await self.sync()
        except Exception:
            log.exception("initial model scan failed")
        finally:
            self._scanned.set()
        if self.settings.watch:
            await self._watch()

    async def _watch(self) -> None:
        import watchfiles

        root = self.root
        while not self._stop.is_set():
            if not root.exists():
                await self._sleep(max(1.0, self.settings.watch_debounce_ms / 1000))
                await self._safe_sync()
                continue
            target, watch_filter = root, None
            if root.is_file():  # watch the directory: files are often replaced by rename
                target = root.parent
                watch_filter = lambda _change, path: Path(path) in (root, root.parent / SIGNATURE_FILE)  # noqa: E731
            try:
                async for _ in watchfiles.awatch(
                    target,
                    watch_filter=watch_filter,
                    stop_event=self._stop,
                    debounce=self.settings.watch_debounce_ms,
                    step=min(50, self.settings.watch_debounce_ms),
                    force_polling=self.settings.watch_polling or None,
                    poll_delay_ms=max(100, self.settings.watch_debounce_ms),
                    recursive=True,
                    ignore_permission_denied=True,
                ):
                    await self._safe_sync()
                    if not root.exists():
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watching %s failed (%s); retrying", target, exc)
                await self._sleep(1.0)
                await self._safe_sync()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _safe_sync(self) -> None:
        try:
            await self.sync()
        except Exception:
            log.exception("model rescan failed")

    # ------------------------------------------------------------------ reconcile

    async def sync(self) -> None:
        """Load new or changed versions, retire unwanted ones."""
        async with self._sync_lock:
            pinned = self.settings.model_version
            available = await asyncio.to_thread(discover, self.root, self.settings.format, pinned or "1")
            if pinned:  # --model-version: this version only, never another
                available = {v: s for v, s in available.items() if v == pinned}
            self._available = available
            self._failed = {
                v: f for v, f in self._failed.items() if v in available and available[v].fingerprint == f.fingerprint
            }
            while True:
                desired, pending = self._plan(available)
                if not pending:
                    break
                source = max(pending, key=lambda s: version_key(s.version))
                await self._load(source)
            if desired:
                for version in set(self._served) - set(desired):
                    self._remove(version)
            elif self._served:
                log.warning("no loadable version under %s; still serving %s", self.root, sorted(self._served))

    def _plan(self, available: dict[str, VersionSource]) -> tuple[dict[str, VersionSource], list[VersionSource]]:
        """The versions to serve among `available` (a failed one only while it is still served),
        and those of them to load: not failed, and not served or served from other files."""
        candidates = {v: s for v, s in available.items() if v not in self._failed or v in self._served}
        desired = select_versions(candidates, self.settings.max_versions)
        pending = [
            s
            for v, s in desired.items()
            if v not in self._failed and (v not in self._served or self._served[v].source.fingerprint != s.fingerprint)
        ]
        return desired, pending

    async def _load(self, source: VersionSource) -> None:
        version = source.version
        settings = self.settings
        log.info("loading %s version %s from %s", settings.name, version, source.path)
        self._loading.add(version)
        started = time.perf_counter()
        try:
            backends, buckets = await in_daemon_thread(load_instances, self._factory, settings, source)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            self._failed[version] = LoadFailure(source.fingerprint, reason)
            log.error("version %s failed to load: %s", version, reason)
            return
        finally:
            self._loading.discard(version)
        backend = backends[0]
        batcher = DynamicBatcher(
            [b.infer for b in backends],
            max_batch_size=settings.max_batch_size,
            max_delay_s=settings.max_delay_s,
            max_queue=settings.max_queue,
            workers=settings.batch_workers,
            batchable=backend.batchable,
            observer=self.metrics.batch_observer(settings.name, version),
            name=f"{settings.name}:{version}",
            buckets=buckets,
        )
        batcher.start()
        served = ServedVersion(version, source, backends, batcher)
        old = self._served.get(version)
        self._install({**self._served, version: served})
        log.info(
            "serving %s version %s on %s (loaded in %.2fs, batchable=%s)",
            settings.name,
            version,
            ", ".join(b.device for b in backends),
            time.perf_counter() - started,
            backend.batchable,
        )
        if old is not None:
            self._retire(old)

    def _install(self, served: dict[str, ServedVersion]) -> None:
        """The atomic swap: one assignment of an immutable map."""
        self._served = MappingProxyType(served)
        self._latest = served[latest_version(served)] if served else None

    def _remove(self, version: str) -> None:
        old = self._served[version]
        self._install({v: s for v, s in self._served.items() if v != version})
        log.info("retiring %s version %s", self.settings.name, version)
        self._retire(old)

    def _retire(self, old: ServedVersion) -> None:
        old.batcher.stop_accepting()

        async def drain() -> None:
            await old.batcher.close(self.settings.drain_timeout_s)
            await asyncio.to_thread(old.close)

        task = asyncio.get_running_loop().create_task(drain())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # ------------------------------------------------------------------ queries

    @property
    def served(self) -> Mapping[str, ServedVersion]:
        return self._served

    @property
    def failures(self) -> dict[str, str]:
        return {v: f.reason for v, f in self._failed.items()}

    def resolve(self, version: str | None) -> ServedVersion:
        """The version a request asked for (`latest`/empty = highest served).
        Must be followed by `batcher.submit` without an `await` in between, so a
        swap cannot retire the version in the gap."""
        if not version or version == "latest":
            latest = self._latest
            if latest is None:
                if self._failed and self.scanned and not self._loading:
                    raise ModelNotReady(f"no model version is loaded: {_failed_to_load(sorted(self._failed))}")
                raise ModelNotReady(self.not_ready_reason() or "no model version is loaded")
            return latest
        served = self._served.get(version)
        if served is not None:
            return served
        if version in self._loading:
            raise ModelNotReady(f"version {version} is still loading")
        if version in self._failed:
            raise ModelNotReady(_failed_to_load([version]))
        listed = sorted(self._served, key=version_key)
        if version in self._available:
            raise ModelNotFound(
                f"version {version} is on disk but not served (max-versions="
                f"{self.settings.max_versions}); served versions: {listed}"
            )
        raise ModelNotFound(f"model '{self.settings.name}' has no version '{version}'; served versions: {listed}")

    def not_ready_reason(self) -> str | None:
        """Why nothing is served, for anyone who can reach the server: no path on disk and no
        runtime error text (both are in the log, where `version ... failed to load` names them)."""
        if self._served:
            return None
        if not self.scanned or self._loading:
            return "loading the model"
        if self._failed:
            return "; ".join(f"version {v} failed to load (the reason is in the server log)" for v in self._failed)
        if self.settings.model_version:
            version = self.settings.model_version
            return (
                f"version {version} (--model-version) not found in the model directory "
                f"(expected {version}/model.onnx|model.pt|model.pt2)"
            )
        return (
            "no model found in the model directory (expected a model file, or <version>/model.onnx|model.pt|model.pt2)"
        )


def _failed_to_load(versions: list[str]) -> str:
    """For inference answers: the runtime's error text stays in the log."""
    return f"version {', '.join(versions)} failed to load; the reason is in the server log"

"""Loading a model version off the event loop: its runtime instances, loaded and warmed
up in a daemon thread, so requests keep being served and SIGTERM is not held up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .backends import Backend
from .discovery import VersionSource
from .errors import ModelLoadError
from .settings import ServerSettings, resolve_buckets, resolve_instances

T = TypeVar("T")
#: (model file, settings, version, device index) -> an unloaded backend.
BackendFactory = Callable[[Path, ServerSettings, str, int], Backend]


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` in a daemon thread: unlike `asyncio.to_thread`, a model that is
    still compiling when SIGTERM arrives does not hold the process open."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as error:  # handed to the awaiting coroutine
            result, exc = None, error
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=target, name="model-load", daemon=True).start()
    return await future


def load_and_warm(backend: Backend, settings: ServerSettings) -> list[int] | None:
    """Runs in a worker thread: a slow load (MIGraphX compiles) must not block
    requests. Returns the batch buckets, which are also the warmup sizes."""
    try:
        backend.load()
        buckets = resolve_buckets(settings.batch_buckets, settings.max_batch_size, backend.prefers_static_shapes)
        if settings.warmup:
            backend.warmup(buckets or sorted({1, settings.max_batch_size}))
        return buckets
    except ModelLoadError:
        backend.close()
        raise
    except Exception as exc:
        backend.close()
        raise ModelLoadError(f"{type(exc).__name__}: {exc}") from exc


def load_instances(
    factory: BackendFactory, settings: ServerSettings, source: VersionSource
) -> tuple[list[Backend], list[int] | None]:
    """In a worker thread: the first instance decides (by its device) how many
    more to load, one per visible GPU unless `--instances` says otherwise."""
    version = source.version
    first = factory(source.path, settings, version, 0)
    buckets = load_and_warm(first, settings)
    count = resolve_instances(settings.instances, on_gpu=first.device != "cpu", env=os.environ)
    backends = [first]
    try:
        for index in range(1, count):
            backend = factory(source.path, settings, version, index)
            load_and_warm(backend, settings)
            backends.append(backend)
    except Exception:
        for backend in backends:
            backend.close()
        raise
    return backends, buckets

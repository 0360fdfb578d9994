"""The sidecar's work: vLLM's adapter endpoints on loopback, and the loop's step that fetches,
loads and unloads adapters and keeps each one's state, with reasons that name no uri, bucket
or endpoint (any pod that reaches the status port may read them)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import shutil
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from model_fetcher.errors import ExitCode, FetchError
from model_fetcher.fetching import fetch
from model_fetcher.limits import Limits

from .desired import (
    Adapter,
    Load,
    State,
    Unload,
    adapter_dir,
    adapter_of,
    digest,
    plan,
    read_desired,
    served_adapters,
    valid_uri,
)

log = logging.getLogger("model_server.adapters")

REASON_LENGTH = 300

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
# A request's path with its query, as an HTTP library's message quotes it (the key's prefix in it).
_PATH_AND_QUERY = re.compile(r"/\S*\?\S*")


def _reason(text: str, *hidden: str) -> str:
    """One bounded line, without the `hidden` strings (the adapter's uri, its bucket path), as
    written or URL-encoded, or any URL or request path (an S3 endpoint's address, a redirect's
    target): the port that reports it answers other pods, not only the operator."""
    forms = {form for h in hidden if h for form in (h, urllib.parse.quote(h, safe=""), urllib.parse.quote(h))}
    for secret in sorted(forms, key=len, reverse=True):  # whole words only: "ai" of hf://ai/x, not of "failed"
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "<uri>", text)
    text = _PATH_AND_QUERY.sub("<path>", _URL.sub("<url>", text))
    text = " ".join(text.split())
    return text if len(text) <= REASON_LENGTH else text[: REASON_LENGTH - 3] + "..."


_CODE = re.compile(r"[^A-Za-z0-9._-]+")


def describe(exc: BaseException) -> str:
    """Why a fetch or load failed, in words that carry no answer of the source's beyond its
    error code: an S3 endpoint is the author's to choose (runtime.env), and may be an internal
    service whose answer they must not read in status. botocore's ClientError quotes the
    answer's <Message>; only its <Code> (a word) and HTTP status are kept."""
    cause = exc.__cause__ if isinstance(exc, FetchError) and exc.__cause__ is not None else exc
    response = getattr(cause, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    if isinstance(error, dict):
        code = _CODE.sub("", str(error.get("Code") or ""))[:64] or "an error"
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")  # type: ignore[union-attr]
        operation = _CODE.sub("", str(getattr(cause, "operation_name", "") or ""))[:64] or "a request"
        return f"{type(cause).__name__}: S3 answered {code} (HTTP {status}) to {operation}"
    if isinstance(exc, FetchError):
        return f"fetching: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _uri_parts(uri: str) -> tuple[str, ...]:
    """The uri and what an error message may quote of it: its path, its bucket or repository."""
    rest = uri.split("://", 1)[-1]
    return (uri, rest, rest.split("@", 1)[0], rest.split("/", 1)[0] if "/" in rest else "")


class Engine:
    """vLLM's adapter endpoints on loopback."""

    def __init__(self, url: str, timeout: float = 120.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        # Loopback only: no proxy from the environment (the sidecar may have the platform's).
        self.client = httpx.AsyncClient(base_url=url, timeout=timeout, trust_env=False, transport=transport)

    async def served(self) -> dict[str, str]:
        answer = await self.client.get("/v1/models")
        answer.raise_for_status()
        return served_adapters(answer.json())

    async def load(self, name: str, path: Path, in_place: bool) -> str | None:
        """None when loaded, else vLLM's refusal."""
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": in_place}
        return self._refusal(await self.client.post("/v1/load_lora_adapter", json=body))

    async def unload(self, name: str) -> str | None:
        return self._refusal(await self.client.post("/v1/unload_lora_adapter", json={"lora_name": name}))

    @staticmethod
    def _refusal(answer: httpx.Response) -> str | None:
        if answer.is_success:
            return None
        try:
            message = answer.json().get("error", {}).get("message") or answer.text
        except (ValueError, AttributeError):
            message = answer.text
        return f"vLLM answered {answer.status_code}: {message}"


class Sidecar:
    """Keeps vLLM's adapters equal to the desired list; the state of each, for /adapters."""

    def __init__(self, desired_file: Path, root: Path, engine: Engine, limits: Limits) -> None:
        self.desired_file = desired_file
        self.root = root
        self.engine = engine
        self.limits = limits
        self.desired: dict[str, str] = {}
        self.adapters: dict[str, Adapter] = {}
        self.first: set[str] | None = None  # the list read at start; /ready waits for it
        self.engine_up = False

    def read(self) -> None:
        try:
            desired = read_desired(self.desired_file.read_text())
        except (OSError, ValueError) as exc:
            log.warning("keeping the adapters list: %s: %s", self.desired_file, _reason(str(exc)))
            return
        self.desired = {name: uri for name, uri in desired.items() if valid_uri(uri)}
        for name, uri in desired.items():
            adapter = self.adapters.get(name)
            if adapter is None or adapter.uri != uri:
                self.adapters[name] = adapter = Adapter(uri)
            if name not in self.desired:
                adapter.state, adapter.reason = (
                    State.FAILED,
                    "uri refused: hf://ORG/NAME[@REVISION] or s3://BUCKET/PATH",
                )
        for name in set(self.adapters) - set(desired):
            del self.adapters[name]
        if self.first is None:
            self.first = set(desired)

    async def step(self) -> None:
        """Read the list, look at vLLM, and act. One adapter's failure, whatever raised it, is
        that adapter's state: the others go on, and so does the process."""
        self.read()
        try:
            served = await self.engine.served()
        except (httpx.HTTPError, ValueError):
            self.engine_up = False  # vLLM is starting or restarting: nothing to compare with yet
            return
        self.engine_up = True
        for name, adapter in self.adapters.items():
            if served.get(name) == str(adapter_dir(self.root, name, adapter.uri)):
                adapter.state, adapter.reason = State.READY, ""
        for action in plan(self.desired, served, self.adapters, self.root, time.monotonic()):
            try:
                if isinstance(action, Unload):
                    await self._unload(action.name)
                else:
                    await self._load(action.name, action.uri, in_place=action.name in served)
            except Exception as exc:  # a bug or an error type nobody listed: log it, keep going
                log.exception("adapter %s: %s", action.name, type(exc).__name__)
                if isinstance(action, Load) and action.name in self.adapters:
                    self._failed(action.name, describe(exc))

    async def _unload(self, name: str) -> None:
        refusal = await self.engine.unload(name)
        if refusal:
            log.warning("unloading adapter %s: %s", name, _reason(refusal))
            return
        log.info("unloaded adapter %s", name)
        for old in self._directories(name):
            await in_thread(shutil.rmtree, old, True)

    async def _load(self, name: str, uri: str, in_place: bool) -> None:
        adapter = self.adapters[name]
        adapter.state, adapter.reason = State.LOADING, ""
        target = adapter_dir(self.root, name, uri)
        try:
            if not (target / "adapter_config.json").exists():
                await in_thread(self._fetch, uri, target)
            refusal = await self.engine.load(name, target, in_place)
        except Exception as exc:  # storage's, boto3's and huggingface_hub's own errors among them
            refusal = describe(exc)
        if refusal:
            self._failed(name, refusal)
            return
        adapter.state = State.READY
        log.info("loaded adapter %s from %s", name, uri)
        for old in self._directories(name):
            if old != target:
                await in_thread(shutil.rmtree, old, True)

    def _directories(self, name: str) -> list[Path]:
        """The adapter's directories under the root (each uri's), by exact name: no glob."""
        return [entry for entry in self.root.iterdir() if adapter_of(entry.name) == name]

    def _failed(self, name: str, why: str) -> None:
        adapter = self.adapters[name]
        adapter.state, adapter.failed_at = State.FAILED, time.monotonic()
        adapter.reason = _reason(why, *_uri_parts(adapter.uri))
        log.warning("adapter %s failed: %s", name, adapter.reason)

    def _fetch(self, uri: str, target: Path) -> None:
        """Into a temporary directory first, so a half-fetched adapter is never loaded."""
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        limits = dataclasses.replace(self.limits, started=time.monotonic(), written=0)
        try:
            fetch(uri, partial, limits)
            if not (partial / "adapter_config.json").exists():
                raise FetchError(f"{uri}: no adapter_config.json (not a PEFT LoRA adapter)", ExitCode.NOT_A_MODEL)
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        """What the operator needs and nothing more: any pod that reaches the port may read it.
        An adapter's uri (a bucket's path, a private repository) is not in it; its digest tells
        the operator which uri the state is for."""
        return {
            "engine": "up" if self.engine_up else "starting",
            "adapters": [
                {
                    "name": name,
                    "digest": digest(a.uri),
                    "state": a.state.value,
                    **({"reason": a.reason} if a.reason else {}),
                }
                for name, a in self.adapters.items()
            ],
        }

    def ready(self) -> bool:
        """Every adapter of the first list settled (a later one never makes a replica unready)."""
        if self.first is None:
            return False
        settled = (State.READY, State.FAILED)
        return all(a.state in settled for n, a in self.adapters.items() if n in self.first)


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a daemon thread: the loop keeps answering probes meanwhile (a large
    adapter's fetch or removal), and a SIGTERM need not wait for it (asyncio.to_thread's threads
    are joined before the process may exit; a fetch can take its whole --deadline)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    def work() -> None:
        try:
            result = function(*args)
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=work, name=f"adapters-{getattr(function, '__name__', 'work')}", daemon=True).start()
    return await done

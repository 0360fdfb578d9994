"""LoRA adapters of a vLLM pod, loaded and unloaded while it serves: the pod's `adapters` sidecar.

    python -m model_server.adapters --desired /etc/adapters/adapters.json --dir /var/lib/adapters \
        --engine http://127.0.0.1:8080 --port 8081 --plugins /var/run/vllm-plugins

The operator writes the adapters a service wants (`spec.adapters`: name and uri) into the
ConfigMap NAME-adapters, which the pod mounts; the kubelet updates the file in place, with no
restart. Every `--interval` seconds this sidecar compares that list with what vLLM serves
(`GET /v1/models`) and closes the gap: a new adapter is fetched into `--dir` with the model
fetcher's rules and limits (hf://, s3://) and loaded (`POST /v1/load_lora_adapter`); one that
left the list is unloaded and its files removed; one whose uri changed is fetched and loaded
in place. Comparing with vLLM's own list each time also reloads everything after vLLM restarts.

On `--port` (bounded like the model server's ports: header time and size, connections) it
answers `GET /adapters` (each adapter's name, its uri's digest and its state: Pending, Loading,
Ready or Failed with a reason the operator copies into status; never a uri, which other pods
could read there) and `GET /ready`: 200 once every
adapter of the list it first read has settled (Ready or Failed), so a new replica takes no
request before its adapters are loaded, while adapters added later never take a serving
replica out of its Service.

It holds the Hub token and S3 keys, and its HOME, /tmp and tools' configuration paths are in
a volume of its own (the pod's builder sees to it): nothing the vLLM container (the author's
code) can write steers its HTTP or S3 clients. The list it reads is held to the CRD's rules
again, since names become directories.

At start it copies `vllm_guard.py` into `--plugins`, vLLM's `--middleware`, which refuses
adapter management to any client but this sidecar; vLLM starts after it (a native sidecar's
startup probe on /health/live).
"""

from __future__ import annotations

from . import signals

if __name__ == "__main__":  # the container's PID 1, before the imports that take a while
    # While it imports, SIGTERM ends it at once (main() then remembers one, uvicorn handles it
    # once serving); as PID 1 it would otherwise ignore one that came meanwhile and run on for
    # the grace period.
    signals.exit_on_stop_signal("adapters sidecar")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses
import enum
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import vllm_guard
from .http_protocol import ConnectionLimits, LimitedHttpProtocol
from .storage.errors import ExitCode, FetchError
from .storage.fetching import fetch
from .storage.limits import Limits, parse_size
from .storage.trust import trust_ca_bundle

log = logging.getLogger("model_server.adapters")

GUARD_MODULE = "rocm_inference_guard"  # the name vLLM imports it under (--middleware)
# The CRD's rules for spec.adapters (operator/inference_operator/models/: model.py's AdapterSpec and
# service.py's InferenceServiceSpec.adapters; the two programs share no code, tests/server/test_adapters_sidecar.py
# holds these to them). The ConfigMap is the operator's, but a name goes into paths: checked again.
MAX_ADAPTERS = 64
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX_LENGTH = 63
HF_URI_PATTERN = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[A-Za-z0-9][-A-Za-z0-9_./]*)?"
URI_PATTERN = re.compile(rf"^({HF_URI_PATTERN}|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/\S*)?)$")
URI_MAX_LENGTH = 2048
_DIGEST_LENGTH = 12
RETRY_SECONDS = 30.0  # a failed adapter is tried again after this, unless its uri changes
REASON_LENGTH = 300
# The status port's bounds, as the model server's ports have them (its clients are the kubelet's
# probes and the operator, a request or two every few seconds): a client that sends its headers
# slowly, or keeps many connections, holds no memory and no slot for long. 256 connections: 100
# busy pipelining clients still leave room for the probes (64 did not), and 1,000 stalled uploads
# take 59 -> 87 MiB (1,024 connections: 61 -> 183 MiB; the container has 1 GiB).
STATUS_LIMITS = ConnectionLimits(
    header_timeout_s=5.0,
    body_timeout_s=5.0,
    max_header_bytes=16 * 1024,
    max_connections=256,
    probe_paths=frozenset({"/health/live", "/ready"}),  # answered even with every connection busy
)
STATUS_KEEP_ALIVE_SECONDS = 5
STOP_POLL_SECONDS = 0.1  # how often a step under way looks whether SIGTERM came (as uvicorn does)


class State(enum.StrEnum):
    PENDING = "Pending"
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"


@dataclasses.dataclass
class Adapter:
    uri: str
    state: State = State.PENDING
    reason: str = ""
    failed_at: float = 0.0


@dataclasses.dataclass(frozen=True)
class Load:
    name: str
    uri: str


@dataclasses.dataclass(frozen=True)
class Unload:
    name: str


Action = Load | Unload


def valid_name(name: str) -> bool:
    return len(name) <= NAME_MAX_LENGTH and NAME_PATTERN.match(name) is not None


def valid_uri(uri: str) -> bool:
    return len(uri) <= URI_MAX_LENGTH and URI_PATTERN.match(uri) is not None


def read_desired(text: str) -> dict[str, str]:
    """name -> uri from the ConfigMap's file (`{"adapters": [{"name", "uri"}]}`); ValueError
    when it is not such a file (the caller keeps the list it had). An entry whose name breaks
    the CRD's rules is left out (a name becomes a directory); one whose uri does is kept, for
    `Sidecar.read` to report Failed without fetching it."""
    data = json.loads(text)
    entries = data.get("adapters") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_ADAPTERS:
        raise ValueError(f"expected {{'adapters': [...]}} with at most {MAX_ADAPTERS} entries")
    desired: dict[str, str] = {}
    for entry in entries:
        name, uri = (entry.get("name"), entry.get("uri")) if isinstance(entry, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(uri, str) or name in desired:
            raise ValueError(f"bad or repeated adapter entry {entry!r:.100}")
        if not valid_name(name):
            log.warning("adapter name %r refused: not the CRD's pattern %s", name[:80], NAME_PATTERN.pattern)
            continue
        desired[name] = uri
    return desired


def digest(uri: str) -> str:
    """What tells two uris of one adapter apart, in its directory's name and in /adapters."""
    return hashlib.sha256(uri.encode()).hexdigest()[:_DIGEST_LENGTH]


def adapter_dir(root: Path, name: str, uri: str) -> Path:
    """Where an adapter's files go: a changed uri gets a new directory beside the old one."""
    return root / f"{name}-{digest(uri)}"


def adapter_of(directory: str) -> str | None:
    """The adapter whose directory (or partial fetch) this is: `sql-v2-<digest>` is sql-v2's,
    never sql's."""
    stem = directory.removesuffix(".partial")
    name, _, hashed = stem.rpartition("-")
    if len(hashed) == _DIGEST_LENGTH and all(c in "0123456789abcdef" for c in hashed) and valid_name(name):
        return name
    return None


def plan(
    desired: Mapping[str, str],
    served: Mapping[str, str],
    known: Mapping[str, Adapter],
    root: Path,
    now: float,
) -> list[Action]:
    """What brings vLLM's adapters (`served`: name -> path it loaded) to `desired`: unloads
    first (they free slots of --max-loras), then loads, in the list's order. A failed adapter
    waits RETRY_SECONDS before it is tried again with the same uri."""
    actions: list[Action] = [Unload(name) for name in served if name not in desired]
    for name, uri in desired.items():
        if served.get(name) == str(adapter_dir(root, name, uri)):
            continue
        adapter = known.get(name)
        if adapter and adapter.uri == uri and adapter.state == State.FAILED and now - adapter.failed_at < RETRY_SECONDS:
            continue
        actions.append(Load(name, uri))
    return actions


def served_adapters(models: Any) -> dict[str, str]:
    """name -> path of the LoRA adapters in vLLM's /v1/models answer (entries with a parent)."""
    data = models.get("data") if isinstance(models, dict) else None
    return {
        entry["id"]: str(entry.get("root") or "")
        for entry in data or []
        if isinstance(entry, dict) and entry.get("parent") and isinstance(entry.get("id"), str)
    }


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


def install_guard(plugins: Path) -> Path:
    """vllm_guard.py as `rocm_inference_guard.py` in `plugins`, for vLLM's --middleware."""
    plugins.mkdir(parents=True, exist_ok=True)
    target = plugins / f"{GUARD_MODULE}.py"
    partial = plugins / f".{GUARD_MODULE}.py.partial"
    shutil.copyfile(vllm_guard.__file__, partial)
    partial.rename(target)
    return target


def status_app(sidecar: Sidecar) -> Starlette:
    """The kubelet's probes and the operator's status reads; nothing here changes anything."""

    async def adapters(request: Request) -> JSONResponse:
        return JSONResponse(sidecar.status())

    async def ready(request: Request) -> JSONResponse:
        settled = sidecar.ready()
        return JSONResponse({"ready": settled}, status_code=200 if settled else 503)

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    return Starlette(
        routes=[Route("/adapters", adapters), Route("/ready", ready), Route("/health/live", live)],
    )


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


def status_server(sidecar: Sidecar, host: str, port: int) -> uvicorn.Server:
    """The status port, bounded like the model server's (model_server.http_protocol)."""
    config = uvicorn.Config(
        status_app(sidecar),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=STATUS_KEEP_ALIVE_SECONDS,
        http=LimitedHttpProtocol.with_limits(STATUS_LIMITS),
    )
    return uvicorn.Server(config)


async def run(args: argparse.Namespace) -> None:
    """Serve the status, and keep vLLM's adapters equal to the list until SIGTERM, which uvicorn
    catches: a step under way is abandoned (its fetch thread dies with the process), so the
    container stops at once instead of at the end of its grace period."""
    limits = Limits(max_bytes=args.max_bytes, deadline_seconds=args.deadline)
    sidecar = Sidecar(Path(args.desired), Path(args.dir), Engine(args.engine), limits)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    server = status_server(sidecar, args.host, args.port)
    serving = asyncio.create_task(server.serve())
    log.info("adapters sidecar on %s:%d, vLLM at %s", args.host, args.port, args.engine)

    received = False

    def stopping() -> bool:
        nonlocal received  # a stop signal from before uvicorn's handler (signals.py remembered it)
        received = received or signals.take_received() is not None
        return received or server.should_exit or serving.done()

    try:
        while not stopping():
            step = asyncio.create_task(sidecar.step())
            while not step.done() and not stopping():
                await asyncio.wait({step}, timeout=STOP_POLL_SECONDS)
            if not step.done():
                step.cancel()
                log.info("stopping: the step under way is abandoned")
                break
            if not step.cancelled() and step.exception() is not None:  # the probes go on; so do the steps
                log.error("adapters step failed", exc_info=step.exception())
            await asyncio.wait({serving}, timeout=args.interval)
    finally:
        server.should_exit = True
        await serving
        await sidecar.engine.client.aclose()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model_server.adapters", description=__doc__.split("\n\n")[0])
    p.add_argument("--desired", required=True, help="the ConfigMap's adapters.json")
    p.add_argument("--dir", required=True, help="where adapters are fetched (a volume vLLM mounts at the same path)")
    p.add_argument("--engine", default="http://127.0.0.1:8080", help="vLLM's URL on loopback")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--plugins", help="copy vLLM's adapter guard middleware here first")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between two looks")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("20Gi"))
    p.add_argument("--deadline", type=float, default=1800.0, help="seconds one adapter's fetch may take")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # From here a stop signal is remembered and acted on once the loop runs: uvicorn restores
    # this handler after its graceful stop and raises the signal again, which then ends nothing.
    signals.remember_stop_signals()
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trust_ca_bundle(os.environ)  # the platform's CA, as for the model's fetch
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plugins:
        install_guard(Path(args.plugins))
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The init container's command line (`python -m model_server.storage URI DIR`): its options,
each also an environment variable; the deadline as an alarm that interrupts a read blocked in
a library; why a fetch failed, logged and written where the kubelet reads it; the exit code."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from .errors import ExitCode, FetchError
from .fetching import fetch
from .limits import DEFAULT_DEADLINE_SECONDS, DEFAULT_MAX_BYTES, Limits, parse_size
from .trust import trust_ca_bundle

log = logging.getLogger("model_server.storage")

DESCRIPTION = "Fetch a model into a local directory: the job of the pod's `model-fetch` init container."


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _sha256(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sha256 hex digest")
    return text.strip().lower()


def parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m model_server.storage",
        description=DESCRIPTION,
        epilog="exit codes: 0 ok, 1 source failed, 2 usage, 3 unsafe, 4 not a model, 5 too large, "
        "6 deadline, 7 checksum, 8 local I/O",
    )
    p.add_argument("uri")
    p.add_argument("dest", type=Path)
    p.add_argument("--sha256", type=_sha256, default=env.get("MODEL_FETCH_SHA256") or None)
    p.add_argument("--max-bytes", type=parse_size, default=env.get("MODEL_FETCH_MAX_BYTES") or DEFAULT_MAX_BYTES)
    p.add_argument(
        "--deadline",
        type=_positive_seconds,
        default=env.get("MODEL_FETCH_DEADLINE_SECONDS") or DEFAULT_DEADLINE_SECONDS,
        help="seconds for the whole fetch",
    )
    hosts = [h.strip().lower() for h in env.get("MODEL_FETCH_REDIRECT_HOSTS", "").split(",") if h.strip()]
    p.add_argument("--allow-redirect-host", action="append", default=hosts, metavar="HOST")
    return p


# After the deadline's exception, how long unwinding may take before the process just exits
# (a library's download threads can keep its thread pool from shutting down).
GRACE_SECONDS = 2.0


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGALRM, _exit_now)
    signal.setitimer(signal.ITIMER_REAL, GRACE_SECONDS)
    raise FetchError("not done within the deadline", ExitCode.DEADLINE)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    log.error("fetch failed (exit %d, deadline): not done within the deadline", ExitCode.DEADLINE)
    logging.shutdown()
    os._exit(ExitCode.DEADLINE)


# Where the kubelet reads a container's last words (its terminationMessagePath), for the pod's
# status and so the InferenceService's; the operator sets it and redacts what it reads again.
ENV_TERMINATION_LOG = "MODEL_FETCH_TERMINATION_LOG"
TERMINATION_MESSAGE_BYTES = 1024


def say_why(message: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Write why the fetch failed, one line of bounded length, where the kubelet reads it."""
    path = environ.get(ENV_TERMINATION_LOG)
    if not path:
        return
    line = " ".join(message.split()).encode()[:TERMINATION_MESSAGE_BYTES].decode(errors="ignore")
    with contextlib.suppress(OSError):
        Path(path).write_text(line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exits 2 on bad arguments, like ExitCode.USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("httpx", "httpx2", "huggingface_hub"):  # one line per request otherwise
        logging.getLogger(chatty).setLevel(logging.WARNING)
    limits = Limits(
        max_bytes=args.max_bytes,
        deadline_seconds=args.deadline,
        sha256=args.sha256,
        redirect_hosts=frozenset(h.lower() for h in args.allow_redirect_host),
    )
    # A backstop for reads that block inside a library: the alarm interrupts them.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.deadline + 1)
    try:
        trust_ca_bundle(os.environ)
        files = fetch(args.uri, args.dest, limits)
    except FetchError as exc:
        log.error("fetch failed (exit %d, %s): %s", exc.code, exc.code.name.lower(), exc)
        say_why(f"fetch failed (exit {int(exc.code)}, {exc.code.name.lower()}): {exc}")
        if exc.code == ExitCode.DEADLINE:
            logging.shutdown()
            os._exit(exc.code)  # download threads of a library may still be blocked: do not wait
        return exc.code
    except OSError as exc:
        log.error("fetch failed (exit %d, local_io): %s: %s", ExitCode.LOCAL_IO, type(exc).__name__, exc)
        say_why(f"fetch failed (exit {int(ExitCode.LOCAL_IO)}, local_io): {type(exc).__name__}: {exc}")
        return ExitCode.LOCAL_IO
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    total = sum(f.stat().st_size for f in files)
    log.info("fetched %d file(s), %d bytes, from %s into %s", len(files), total, args.uri, args.dest)
    return ExitCode.OK

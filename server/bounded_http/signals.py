"""Stop signals that arrive before the server can act on them.

In a container the server is PID 1, and PID 1 ignores a signal it has no handler for: a
SIGTERM sent while Python was still importing (a pod deleted as it starts: a scale-down, a
rollout, a canary rolled back) was lost, and the pod ran on until the kubelet killed it at the
end of its grace period, holding its GPU. So `python -m model_server serve` first installs
handlers that remember such a signal, and the server acts on it as soon as it has started.
The same handlers stay beneath uvicorn's own, so uvicorn's re-raise of the signal it caught,
after a graceful stop, ends in a normal return (exit 0).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def remember_stop_signals() -> None:
    """From now on a stop signal is remembered, not ignored (PID 1) or fatal (elsewhere)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _remember)


def take_received() -> int | None:
    """The first stop signal remembered since the last call, if any."""
    first = _received[0] if _received else None
    _received.clear()
    return first


def exit_on_stop_signal(program: str) -> None:
    """For a process with nothing to finish yet (the model fetch; the adapters sidecar until its
    server has started and put its own handler in place): SIGTERM ends it at once, with 128 + 15,
    rather than being ignored as PID 1 ignores a signal it has no handler for. A partial
    download is never moved into place, so nothing half-done is left to be taken for whole."""

    def stop(signum: int, frame: FrameType | None) -> None:
        print(f"{program} stopped by signal {signum}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

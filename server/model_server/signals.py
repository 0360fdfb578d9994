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

import signal
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

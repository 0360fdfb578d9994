"""The `inference-operator` command: a stop signal is acted on from its first line.

In the chart's pod the operator is its container's PID 1, and PID 1 drops a signal it has no
handler for. A SIGTERM sent while Python imported the operator and kopf (a pod deleted as it
starts: a rollout, a scale-down, `helm upgrade` twice in a row) was lost, and the pod ran on to
the SIGKILL at the end of its grace period. Until kopf puts its own handler in place, SIGTERM
ends the process at once: it has nothing to finish yet. The chart's preStop sleep covers the
interpreter's own start, before this module runs.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    print(f"inference-operator stopped by signal {signum} while starting", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_while_starting)
    from .__main__ import main as run

    return run()

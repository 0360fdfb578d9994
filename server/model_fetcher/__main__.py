"""`python -m model_server.storage URI DIR`: the model-fetch init container's process.

Its first act, before the imports that take a while, is a SIGTERM handler: as PID 1 the
process would otherwise ignore a SIGTERM sent meanwhile and hold the pod for its whole grace
period. model_server's and this package's __init__.py import nothing, so nothing slow runs
before it."""

from __future__ import annotations

import sys

from model_server import signals

if __name__ == "__main__":  # the init container's process, before the imports that take a while
    signals.exit_on_stop_signal("fetch")

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

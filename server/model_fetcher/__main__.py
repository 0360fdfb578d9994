"""`python -m model_fetcher URI DIR`: the model-fetch init container's process (its pods run it
as `python -m model_server.storage`, which calls run() here).

Its first act, before the imports that take a while, is a SIGTERM handler: as PID 1 the
process would otherwise ignore a SIGTERM sent meanwhile and hold the pod for its whole grace
period. model_server's and this package's __init__.py import nothing, so nothing slow runs
before it."""

from __future__ import annotations

import sys

from bounded_http import signals


def run() -> int:
    """The process: the SIGTERM handler first, then the imports that take a while, then main()."""
    signals.exit_on_stop_signal("fetch")
    from .cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())

"""`python -m adapters_sidecar ...`: the adapters sidecar's process (see process.py; its pods
run it as `python -m model_server.adapters`, which calls run() here).

Its first act, before the imports that take a while, is a SIGTERM handler that ends it at
once (main() then remembers one, uvicorn handles it once serving); as PID 1 it would otherwise
ignore one that came meanwhile and run on for the grace period. model_server's and this
package's __init__.py import nothing, so nothing slow runs before it."""

from __future__ import annotations

import sys

from bounded_http import signals


def run() -> int:
    """The process: the SIGTERM handler first, then the imports that take a while, then main()."""
    signals.exit_on_stop_signal("adapters sidecar")
    from .process import main

    return main()


if __name__ == "__main__":
    sys.exit(run())

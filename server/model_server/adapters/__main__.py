"""`python -m model_server.adapters ...`: the adapters sidecar (adapters_sidecar/__main__.py)."""

from __future__ import annotations

import sys

from adapters_sidecar.__main__ import run

if __name__ == "__main__":
    sys.exit(run())

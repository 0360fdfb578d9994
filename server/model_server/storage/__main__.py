"""`python -m model_server.storage URI DIR`: the model fetcher (model_fetcher/__main__.py)."""

from __future__ import annotations

import sys

from model_fetcher.__main__ import run

if __name__ == "__main__":
    sys.exit(run())

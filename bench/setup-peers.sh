#!/usr/bin/env bash
# Sets up what bench/peer_bench.py compares against, so a newcomer gets the same numbers:
# wrk (the load generator, a Debian package) and one venv per peer server under a cache
# directory (never the project's venv: the peers pin their own FastAPI/numpy/protobuf).
#   kserve   - KServe's Python ModelServer (PyPI `kserve`) + onnxruntime
#   pytriton - NVIDIA PyTriton (PyPI `nvidia-pytriton`, bundles tritonserver) + onnxruntime
# Safe to re-run; a peer that fails to install is reported and skipped, not fatal.
set -uo pipefail

cache="${MODEL_SERVER_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/model-server-bench}"
python="${PYTHON:-python3}"
mkdir -p "$cache"

if ! command -v wrk >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
command -v wrk >/dev/null 2>&1 && echo "wrk: $(command -v wrk)" || echo "wrk: NOT installed (the bench falls back to a Python load generator)"

peer() {  # peer NAME PYTHON PACKAGES...
    local name="$1" python="$2"
    shift 2
    local venv="$cache/peers/$name"
    if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
        echo "$name: $venv (present)"
        return 0
    fi
    rm -rf "$venv"
    "$python" -m venv "$venv" || return 1
    if "$venv/bin/python" -m pip install --quiet --upgrade pip >"$cache/$name-install.log" 2>&1 &&
        "$venv/bin/python" -m pip install --quiet "$@" >>"$cache/$name-install.log" 2>&1; then
        touch "$venv/.complete"
        echo "$name: $venv"
    else
        echo "$name: install FAILED (log: $cache/$name-install.log):"
        tail -5 "$cache/$name-install.log"
    fi
}

peer kserve "$python" 'kserve==0.21.0' 'onnxruntime' 'numpy'
# Triton's Python backend stub (inside the wheel) links the system's libpython3.N and then
# imports the venv interpreter's standard library: the two must be the same build, or the
# stub fails in multiprocessing ('_thread.RLock' object has no attribute '_recursion_count'
# with a pyenv 3.11.7 venv over Debian's libpython 3.11.2). So the system Python, if any.
pytriton_python="${PYTRITON_PYTHON:-$(command -v /usr/bin/python3.11 || command -v /usr/bin/python3 || echo "$python")}"
peer pytriton "$pytriton_python" 'nvidia-pytriton==0.7.0' 'onnxruntime' 'numpy'
echo "peers in $cache/peers (MODEL_SERVER_BENCH_CACHE overrides)"

#!/usr/bin/env bash
# Installs what the demo runs (the `demo` extra: the operator, the model server on ONNX Runtime's
# CPU build, the emulated cluster) into .venv, then runs the end-to-end demo on this machine (no
# cluster, no GPU needed). The test and lint tools, Prometheus, etcd and vLLM are scripts/test.sh's
# (scripts/setup.sh): the demo uses none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# A venv's bundled pip resolves this install several times slower than a current one.
.venv/bin/python -m pip install --quiet --upgrade pip
# Not compiled at install: the demo compiles the modules it imports, a fraction of those installed.
.venv/bin/python -m pip install --quiet --no-compile -e '.[demo]'
exec .venv/bin/python scripts/demo.py

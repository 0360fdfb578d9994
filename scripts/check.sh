#!/usr/bin/env bash
# The quality gates, run by scripts/test.sh before the tests (and by hand: `bash scripts/check.sh`):
# lint, format, types, import contracts and the freshness of the generated CRD and reference page.
# Each names what is wrong; the first failure stops CI.
# Uses the project's .venv (scripts/setup.sh installs the `dev` extra into it), or $VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${VENV:-.venv}/bin"
# Run against this checkout's sources, whatever the venv's editable install points at.
export PYTHONPATH="$PWD/operator:$PWD/server:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# mypy's cache outside the checkout: a fresh clone (CI) reuses what an earlier checkout of this
# machine checked (each entry is validated against its file's hash) instead of starting cold.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rocm-inference-operator/mypy}"

step() { echo "==> $*" >&2; }
step "ruff check";          "$bin/ruff" check --no-cache .
step "ruff format --check"; "$bin/ruff" format --check --no-cache .
step "mypy";                "$bin/mypy"
step "import contracts";    "$bin/lint-imports" --no-cache
step "CRD up to date";      "$bin/python" -m inference_operator.crd --check
step "reference up to date"; "$bin/python" -m inference_operator.reference --check
echo "gates passed" >&2

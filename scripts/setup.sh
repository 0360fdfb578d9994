#!/usr/bin/env bash
# Creates .venv and installs the project with everything its tests and demo need,
# plus the Prometheus server the autoscaler tests run for real. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned (CPU build) in the `cpu` extra; `test` pulls `server` and `cpu`.
.venv/bin/python -m pip install --quiet -e '.[test]'

if ! command -v prometheus >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

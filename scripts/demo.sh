#!/usr/bin/env bash
# Installs the project, then runs the end-to-end demo on this machine (no cluster, no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py

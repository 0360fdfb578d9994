#!/usr/bin/env bash
# Installs what the tests need, then runs the whole suite (slow tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k autoscal`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here, not a pass" >&2
    exit 1
fi
exit "$rc"

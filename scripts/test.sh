#!/usr/bin/env bash
# Installs what the tests need, runs the quality gates (scripts/check.sh: lint, format, types,
# import contracts), then the whole suite (slow tests included); a failing gate fails CI first.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k autoscal`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check.sh
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here, not a pass" >&2
    exit 1
fi
exit "$rc"

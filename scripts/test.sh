#!/usr/bin/env bash
# Installs what the tests need, runs the quality gates (scripts/check.sh: lint, format, types,
# import contracts), then the whole suite (slow tests included); a failing gate fails CI first.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k autoscal`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check.sh
set +e
# Two workers: the real-pods tier (tests/conftest.py runs it first, as one scope) spends most of
# its time waiting on pods under CPU limits, and the rest of the suite fills the idle core.
.venv/bin/python -m pytest -n 2 --dist loadscope "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here, not a pass" >&2
    exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Installs what the tests need, runs the quality gates (scripts/check.sh: lint, format, types,
# import contracts), then the whole suite (slow tests included); a failing gate fails CI first.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k autoscal`.
# `--under-load` first keeps one core busy with a CPU hog for the whole run (not part of the
# normal command): the suite must hold on a loaded machine, e.g.
# `bash scripts/test.sh --under-load tests/security`.
set -euo pipefail
cd "$(dirname "$0")/.."
hog=""
if [ "${1:-}" = "--under-load" ]; then
    shift
    python3 -c 'while True: pass' &
    hog=$!
    trap 'kill "$hog" 2>/dev/null || true' EXIT
    echo "a CPU hog (pid $hog) keeps one core busy for this run" >&2
fi
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

#!/usr/bin/env bash
# Install, lint, then run the whole test suite. pytest's "no tests collected" (exit 5) fails too.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export PREFECT_HOME=${PREFECT_HOME:-$PWD/.prefect}
.venv/bin/ruff check . || exit 1
.venv/bin/python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"

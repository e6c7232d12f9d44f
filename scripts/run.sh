#!/usr/bin/env bash
# Install, then run the main job on the embedded default: generated sample logs
# -> the pipeline -> lake + catalog under ./sample (override: scripts/run.sh --users 2000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_HOME=${PREFECT_HOME:-$PWD/.prefect}
exec .venv/bin/trajforge run "$@"

#!/usr/bin/env bash
# The GPU check from a bare checkout, nothing installed: scripts/gpu_check.sh [OUT_DIR] [--dry-run]
# OUT_DIR defaults to $OUT, else ./gpu_check_out. See scripts/gpu_check.py for what it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"

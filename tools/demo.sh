#!/usr/bin/env bash
# The main job on the built-in demo table: set up, build, compress INT8 and
# FP16, run both ops, print sizes, errors and latencies.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec "${PYTHON:-python3}" tools/demo.py "$@"

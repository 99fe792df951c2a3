#!/usr/bin/env bash
# The main job on the built-in demo model: set up, build it, export it INT8,
# INT4 and FP16 (fused and stock ops), verify, print sizes, errors and
# latencies.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec "${PYTHON:-python3}" tools/demo.py "$@"

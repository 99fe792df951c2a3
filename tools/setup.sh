#!/usr/bin/env bash
# Installs what the project needs and builds the op library in place.
# Idempotent: a second run installs nothing and only rebuilds _ops.so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Any TensorFlow satisfies us (tensorflow, tensorflow-cpu, a vendor build);
# install the CPU wheel only when none is importable.
if ! "$PYTHON" -c "import tensorflow" >/dev/null 2>&1; then
  echo "== installing tensorflow-cpu"
  "$PYTHON" -m pip install -q "tensorflow-cpu==2.21.0"
fi
"$PYTHON" -m pip install -q "setuptools>=64" wheel rich pytest
# Tests only: run the example notebook (nbclient + a Jupyter kernel) and fuzz
# the ops (atheris).
"$PYTHON" -m pip install -q nbclient nbformat ipykernel atheris
# Tests only: TF Serving's protos, to parse the warmup requests the export tool
# writes. --no-deps: it requires `tensorflow`, which would pull a second TF.
"$PYTHON" -m pip install -q --no-deps "tensorflow-serving-api==2.21.0"

echo "== building the op library (pip install --no-build-isolation -e .)"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .

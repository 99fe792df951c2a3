#!/usr/bin/env bash
# Installs what the project needs and builds the op library in place.
# Idempotent: a second run installs nothing and only rebuilds _ops.so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# The supported and tested versions live in one file; read it without
# importing the package (nothing is built yet).
supported() {
  "$PYTHON" -c "import runpy; print(runpy.run_path(
      'tf_compressed_embedding/supported_versions.py')['$1'])"
}
TF_VERSION=$(supported TF_NEWEST_TESTED)

# Any TensorFlow in the supported range satisfies us (tensorflow,
# tensorflow-cpu, a vendor build; setup.py refuses one that is too old);
# install the newest tested CPU wheel only when none is importable.
if ! "$PYTHON" -c "import tensorflow" >/dev/null 2>&1; then
  echo "== installing tensorflow-cpu==$TF_VERSION"
  "$PYTHON" -m pip install -q "tensorflow-cpu==$TF_VERSION"
fi
"$PYTHON" -m pip install -q "setuptools>=64" wheel rich pytest
# Tests only: run the example notebook (nbclient + a Jupyter kernel) and fuzz
# the ops (atheris).
"$PYTHON" -m pip install -q nbclient nbformat ipykernel atheris
# Tests only: TF Serving's protos, to parse the warmup requests the export tool
# writes. --no-deps: it requires `tensorflow`, which would pull a second TF.
# Its release that matches the installed TensorFlow's major.minor.
TF_MAJOR_MINOR=$("$PYTHON" -c "import tensorflow as tf; print('.'.join(tf.__version__.split('.')[:2]))" 2>/dev/null)
"$PYTHON" -m pip install -q --no-deps "tensorflow-serving-api==$TF_MAJOR_MINOR.*"

echo "== building the op library (pip install --no-build-isolation -e .)"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .

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
"$PYTHON" -m pip install -q "setuptools>=64" wheel rich pytest "ruff==0.17.6"
# Test-only packages that follow TensorFlow's releases take its major.minor.
TF_MAJOR_MINOR=$("$PYTHON" -c "import tensorflow as tf; print('.'.join(tf.__version__.split('.')[:2]))" 2>/dev/null)
# Tests only: run the example notebook (nbclient + a Jupyter kernel), fuzz
# the ops (atheris), run test files in parallel (pytest-xdist).
"$PYTHON" -m pip install -q nbclient nbformat ipykernel atheris pytest-xdist
# Tests only: the recommender libraries whose models the export tool is
# tested on (tests/export_tools/test_third_party_models.py). --no-deps: they
# require `tensorflow`/`keras`, which would pull a second TF.
"$PYTHON" -m pip install -q --no-deps "tf-keras==$TF_MAJOR_MINOR.*" \
  tensorflow-recommenders==0.7.7 deepctr==0.9.4 keras-rs==0.4.0
# Tests only: TF Serving's protos, to parse the warmup requests the export tool
# writes. --no-deps: it requires `tensorflow`, which would pull a second TF.
"$PYTHON" -m pip install -q --no-deps "tensorflow-serving-api==$TF_MAJOR_MINOR.*"

# C++ tests only: googletest (tests/cc/, built by g++ and by Bazel), from apt
# (Debian), when missing.
if command -v dpkg-query >/dev/null && [[ $(dpkg-query -W -f='${Status}' \
    libgtest-dev 2>/dev/null) != "install ok installed" ]]; then
  echo "== installing libgtest-dev"
  SUDO=$([[ $(id -u) -eq 0 ]] || echo sudo)
  $SUDO apt-get install -y -qq libgtest-dev >/dev/null || {
    $SUDO apt-get update -qq >/dev/null &&
      $SUDO apt-get install -y -qq libgtest-dev >/dev/null; }
fi

echo "== building the op library (pip install --no-build-isolation -e .)"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .

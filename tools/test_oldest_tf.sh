#!/usr/bin/env bash
# Builds the package against the oldest supported TensorFlow, with the oldest
# supported Keras, in a venv of its own, and runs the op, layer and export
# tests there (see below which) (the newest is what tools/test.sh itself runs on). Versions come
# from tf_compressed_embedding/supported_versions.py.
#
# The tree is built in a copy: an in-place build writes _ops.so next to the
# sources, and the main tree's library belongs to the newest TensorFlow.
# The venv is kept in build/ and reused while its TensorFlow is right.
#
#   bash tools/test_oldest_tf.sh [pytest args...]
#   bash tools/test_oldest_tf.sh --venv-only   # only make the venv (tools/test.sh
#                                              # runs this beside its first stages)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

supported() {
  "$PYTHON" -c "import runpy; print(runpy.run_path(
      'tf_compressed_embedding/supported_versions.py')['$1'])"
}
TF_VERSION=$(supported TF_OLDEST_TESTED)
KERAS_VERSION=$(supported KERAS_OLDEST_TESTED)
TF_MAJOR_MINOR=${TF_VERSION%.*}

venv="$ROOT/build/venv-tf$TF_VERSION"
if ! "$venv/bin/python" -c "
import sys, tensorflow as tf, keras
sys.exit(tf.__version__ != '$TF_VERSION' or keras.__version__ != '$KERAS_VERSION')
" >/dev/null 2>&1; then
  echo "== venv with tensorflow-cpu==$TF_VERSION, keras==$KERAS_VERSION ($venv)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "tensorflow-cpu==$TF_VERSION" \
    "keras==$KERAS_VERSION" "setuptools>=64" wheel rich pytest
  # Tests only: TF Serving's protos; --no-deps keeps the venv's TensorFlow.
  "$venv/bin/pip" install -q --no-deps "tensorflow-serving-api==$TF_MAJOR_MINOR.*"
fi
if [[ ${1:-} == --venv-only ]]; then
  exit 0
fi
# Tests only: run test files in parallel (tools/test.sh passes -n N).
"$venv/bin/python" -c "import xdist" 2>/dev/null ||
  "$venv/bin/pip" install -q pytest-xdist

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
echo "== copying the tracked sources to $tree"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked and new files as they are in the work tree (a file deleted but
  # not yet committed is skipped).
  git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null \
    | tar -xf - -C "$tree"
else
  tar --exclude=./build --exclude='./bazel-*' --exclude='*.so' \
    --exclude='*.egg-info' -cf - . | tar -xf - -C "$tree"
fi

cd "$tree"
echo "== building against TensorFlow $TF_VERSION"
"$venv/bin/pip" install -q --no-build-isolation --no-deps -e .
"$venv/bin/python" -c "
import tensorflow as tf, keras, tf_compressed_embedding as tfce
print('TensorFlow', tf.__version__, '| Keras', keras.__version__,
      '| kernels:', tfce.active_isa())"

echo "== op, layer and export tests on TensorFlow $TF_VERSION"
# What depends on TensorFlow's version: the ops, the layers, and the export's
# graph rewrite, checkpoint reading and CLI (its examples are TF Serving
# protos). The export matrix in one format: the graph rewrite is the same for
# every rowwise format, and encoding is numpy. The main suite runs every
# format, and the export's fault tests (processes killed, disks full), which
# do not depend on TensorFlow's version.
TFCE_TEST_EXPORT_FORMATS=int8 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/tf_compressed_embedding tests/export_tools/test_export.py \
  tests/export_tools/test_export_io.py tests/export_tools/test_export_cli.py "$@"

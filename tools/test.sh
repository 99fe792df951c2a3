#!/usr/bin/env bash
# The whole test suite: pip build, Bazel build + Bazel tests, the op tests on
# the Bazel-built library, then every pytest test on the pip-built library.
# Installs what it needs (see tools/setup.sh, tools/bazelisk_offline.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

bash tools/setup.sh

echo "== Bazel: configure, build //..., test //..."
"$PYTHON" tools/configure_bazel.py
tools/bazelisk_offline.sh build //...
tools/bazelisk_offline.sh test //...

echo "== op tests on the Bazel-built library"
TFCE_OPS_LIBRARY="$PWD/bazel-bin/kernels/_ops.so" "$PYTHON" -m pytest -q \
  -p no:cacheprovider tests/python/test_lookup_op.py \
  tests/python/test_fused_decode_axpy_op.py tests/python/test_sparse_api.py \
  tests/python/test_savedmodel.py

echo "== the whole pytest suite (pip-built library)"
"$PYTHON" -m pytest -q -p no:cacheprovider tests "$@"

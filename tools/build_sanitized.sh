#!/usr/bin/env bash
# Builds the op library under ASan+UBSan (TFCE_SANITIZE=1, see setup.py) into
# build/asan/: the library in build/asan/lib/, the objects in build/asan/tmp/
# (the C++ kernel tests link the TF-free ones: tests/kernels/test_cc_kernels.py).
# The in-place tf_compressed_embedding/_ops.so is not touched.
#
# build_ext, not pip: --build-lib keeps the result out of the source tree.
# A source is recompiled only when it, a header it includes or its command
# changed (setup.py keeps a record beside each object), so a second run only
# links. The export tool's _bundle_writer.so is built beside it, unused.
# Prints the log's tail and fails when the build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
out=build/asan
mkdir -p "$out"
if ! TFCE_SANITIZE=1 "$PYTHON" setup.py build_ext --build-lib "$out/lib" \
    --build-temp "$out/tmp" >"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log" >&2
  echo "build_sanitized: build failed (full log: $out/build.log)" >&2
  exit 1
fi

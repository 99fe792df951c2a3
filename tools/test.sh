#!/usr/bin/env bash
# The whole test suite: lint, pip build, Bazel build + Bazel tests, the op tests on
# the Bazel-built library and on an ASan+UBSan build (every kernel row), the
# wheel in a fresh venv, every pytest test on the pip-built library, then the
# op, layer and export tests built against the oldest supported TensorFlow.
# Installs what it needs (see tools/setup.sh, tools/bazelisk_offline.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

bash tools/setup.sh

# The oldest-TensorFlow venv (the last stage's) is made meanwhile: it is
# mostly downloading, which the stages before it leave room for.
mkdir -p build
oldest_venv_log=build/oldest_tf_venv.log
bash tools/test_oldest_tf.sh --venv-only >"$oldest_venv_log" 2>&1 &
oldest_venv_pid=$!

# Test files run in parallel, one worker per core (at most 4): pytest-xdist,
# a whole file per worker (--dist loadfile), so a module's fixtures (models
# built and exported once per file) are not built twice. TFCE_TEST_WORKERS
# overrides the count.
cores=$(nproc)
WORKERS=${TFCE_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
PARALLEL=(-n "$WORKERS" --dist loadfile)

# Each section's header says how long the run has taken so far.
section() { echo "== $* [$((SECONDS / 60)) min $((SECONDS % 60)) s in]"; }

section "lint (ruff, configured in pyproject.toml)"
"$PYTHON" -m ruff check .

section "Bazel: configure, build //..., test //..."
"$PYTHON" tools/configure_bazel.py
tools/bazelisk_offline.sh build //...
tools/bazelisk_offline.sh test //...

section "op tests on the Bazel-built library"
TFCE_OPS_LIBRARY="$PWD/bazel-bin/kernels/_ops.so" "$PYTHON" -m pytest -q \
  -p no:cacheprovider "${PARALLEL[@]}" tests/tf_compressed_embedding/test_lookup_op.py \
  tests/tf_compressed_embedding/test_fused_decode_axpy_op.py \
  tests/tf_compressed_embedding/test_batched_op.py \
  tests/tf_compressed_embedding/test_sparse_api.py \
  tests/tf_compressed_embedding/test_savedmodel.py

section "op tests on an ASan+UBSan build of the library, every kernel row"
bash tools/sanitize.sh "${PARALLEL[@]}"

section "a non-editable install: build the wheel, install it in a fresh venv"
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"$PYTHON" -m pip wheel -q --no-build-isolation --no-deps . -w "$wheel_dir"
"$PYTHON" -m venv --system-site-packages "$wheel_dir/venv"
"$wheel_dir/venv/bin/pip" install -q --no-deps "$wheel_dir"/*.whl
(cd "$wheel_dir" && "$wheel_dir/venv/bin/python" - <<'PY'
import numpy as np
import tf_compressed_embedding as tfce
assert "site-packages" in tfce.__file__, tfce.__file__
ct = tfce.quantize(np.arange(12, dtype=np.float32).reshape(4, 3), "int8")
out = tfce.fused_decode_axpy(ct, [1, 3], [0, 0], combiner="mean").numpy()
np.testing.assert_allclose(out, ct.dequantize()[[1, 3]].mean(0, keepdims=True), rtol=1e-6)
from export_tools.checkpoint_io import StreamingBundleWriter
StreamingBundleWriter._lib()  # the export tool's native writer is in the wheel too
print("wheel OK:", tfce.__file__, "kernels:", tfce.active_isa())
PY
"$wheel_dir/venv/bin/tfce-export" --help >/dev/null
)

section "the whole pytest suite (pip-built library)"
# Its op-suite-per-kernel-row test is left out: tools/sanitize.sh above ran
# those op files (and more) on every row the CPU has.
"$PYTHON" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" tests \
  --durations=20 --deselect tests/kernels/test_isa.py::test_op_suite_on_every_row "$@"

section "the oldest supported TensorFlow: build, op, layer and export tests"
if ! wait "$oldest_venv_pid"; then
  cat "$oldest_venv_log" >&2
  echo "test.sh: making the oldest-TensorFlow venv failed (log above)" >&2
  exit 1
fi
bash tools/test_oldest_tf.sh "${PARALLEL[@]}"
section "done"

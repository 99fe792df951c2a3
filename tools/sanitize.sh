#!/usr/bin/env bash
# The op tests on an ASan+UBSan build of the op library, once per kernel row
# this CPU supports (TFCE_ISA). Fails if pytest fails on any row or if a
# sanitizer reported anything (the reports are printed). One summary line per
# row.
#
# The sanitized library is built into build/asan/ by tools/build_sanitized.sh
# (TFCE_SANITIZE=1, see setup.py), whose core objects the C++ kernel tests
# link too; the in-place tf_compressed_embedding/_ops.so is not touched.
# Extra arguments go to pytest, e.g. more test files that use the ops:
#   tools/sanitize.sh tests/tf_compressed_embedding/keras/test_layer_pooling.py
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
unset TFCE_ISA  # the rows are chosen below, one per run
start=$SECONDS

# Test files that run the ops. The op files run on every row: they give
# each row's kernels every storage format (they are parameterised over
# quantization.FORMATS), dims 1..33 and every bad input, as
# tests/kernels/test_isa.py's per-row op suite does without sanitizers. The
# files of the paths around the ops (the sparse API, gradients,
# SavedModels), which reach the same kernels through them, run on the
# first row, the CPU's best.
# The Keras layer tests run the ops too (clean under this build, but about a
# minute a row): pass them as arguments when there is time.
T=tests/tf_compressed_embedding
OP_TESTS=("$T/test_lookup_op.py" "$T/test_fused_decode_axpy_op.py"
          "$T/test_batched_op.py")
PATH_TESTS=("$T/test_sparse_api.py" "$T/test_gradients.py"
            "$T/test_savedmodel.py")

out=build/asan
echo "== building the ASan+UBSan op library into $out/ (log: $out/build.log)"
bash tools/build_sanitized.sh || { echo "sanitize: build failed" >&2; exit 1; }
export TFCE_OPS_LIBRARY="$PWD/$out/lib/tf_compressed_embedding/_ops.so"
echo "   built in $((SECONDS - start))s: $TFCE_OPS_LIBRARY"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# Python is not built with ASan, so the runtimes must be preloaded (ASan's
# first, it must come before every other library). Only into Python (and the
# processes it starts): not into this script's own tools.
libasan=$(g++ -print-file-name=libasan.so)
libubsan=$(g++ -print-file-name=libubsan.so)
for lib in "$libasan" "$libubsan"; do
  [[ -f $lib ]] || { echo "sanitize: no sanitizer runtime $lib" >&2; exit 1; }
done
sanitized_python() { LD_PRELOAD="$libasan $libubsan" "$PYTHON" "$@"; }

# Reports go to files in $1 (the name gets .PID), and are also looked for in
# the output (see count_reports). detect_leaks=0: Python and TF keep their
# allocations until exit by design. halt_on_error=1: ASan stops at the first
# report (UBSan stops anyway: -fno-sanitize-recover). No suppressions: no
# report needs one (TF itself is not instrumented).
# allocator_may_return_null=1: a request ASan cannot serve (the tests ask for
# a 16 TiB output, beyond its 1 TiB limit) returns NULL as glibc's would, so
# TF turns it into ResourceExhausted as the tests expect; by default ASan
# aborts the process instead ("allocation-size-too-big"). ASan still logs a
# "failed to allocate" warning for it, which count_reports does not count.
sanitizer_env() {
  export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:log_path=$1/asan"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$1/ubsan"
}

# oneDNN off on every host. TF turns it on by default only on CPUs with
# AVX512_VNNI / AVX512_BF16 / AMX (so: on our Intel hosts, off on AMD), and
# with it on, tensors of 256 KiB and more are cut from a BFC pool (oneDNN's
# MklCPUAllocator): a huge request fails inside the pool without reaching
# malloc, and big outputs get no redzones of their own. With it off, every
# tensor comes from TF's plain CPU allocator (posix_memalign, intercepted by
# ASan): every output has redzones and the run is the same on every host.
export TF_ENABLE_ONEDNN_OPTS=0

# Prints the sanitizer reports of a run and counts them in $reports: the
# files in $1, and reports in the run's output $2. The output is needed
# because GCC's UBSan beside ASan ignores log_path: libubsan's call to
# __sanitizer_set_report_path binds to libasan's copy (check with
# LD_DEBUG=bindings), so UBSan writes to stderr, and may set ASan's log file
# to the ubsan.PID name (both names are counted). So pytest runs with
# --capture=sys: stderr reaches $2 even when a report aborts the process.
REPORT_LINE=': runtime error: |==ERROR: AddressSanitizer'
count_reports() {
  local f in_output
  reports=0
  for f in "$1"/asan.* "$1"/ubsan.*; do
    [[ -e $f ]] || continue
    if grep -qE "$REPORT_LINE" "$f"; then
      reports=$((reports + 1))
      echo "----- sanitizer report $f" >&2
    else
      # Warnings only (a refused allocation): shown, not counted.
      echo "----- sanitizer warnings $f (not a report)" >&2
    fi
    cat "$f" >&2
  done
  in_output=$(grep -cE "$REPORT_LINE" "$2" || true)
  if ((in_output > 0)); then
    reports=$((reports + in_output))
    echo "----- sanitizer reports in the output ($2)" >&2
    grep -E -A 40 "$REPORT_LINE" "$2" >&2
  fi
}

# The rows, asked of the sanitized library itself under the same runtimes.
mkdir "$logs/query"
sanitizer_env "$logs/query"
rc=0
rows=$(sanitized_python -c 'import tf_compressed_embedding as t; print(*t.supported_isas())' \
  2>"$logs/query/stderr") || rc=$?
count_reports "$logs/query" "$logs/query/stderr"
if ((rc != 0 || reports != 0)); then
  cat "$logs/query/stderr" >&2
  echo "sanitize: asking the library for its rows failed (exit $rc, reports: $reports)" >&2
  exit 1
fi
echo "== kernel rows: $rows"

failed=0
summary=()
first_row=1
for isa in $rows; do
  tests=("${OP_TESTS[@]}")
  if ((first_row)); then
    tests+=("${PATH_TESTS[@]}")
    first_row=0
  fi
  mkdir "$logs/$isa"
  sanitizer_env "$logs/$isa"
  row_start=$SECONDS
  rc=0
  TFCE_ISA=$isa sanitized_python -m pytest -q -p no:cacheprovider --capture=sys \
    "${tests[@]}" "$@" >"$logs/$isa/pytest.out" 2>&1 || rc=$?
  seconds=$((SECONDS - row_start))
  count_reports "$logs/$isa" "$logs/$isa/pytest.out"
  passed=$(grep -Eo '[0-9]+ passed' "$logs/$isa/pytest.out" | tail -n 1 || true)
  if ((rc != 0)); then
    tail -n 60 "$logs/$isa/pytest.out"
  fi
  if ((rc != 0 || reports != 0)); then
    failed=1
  fi
  # No "N passed" when a sanitizer aborted pytest itself.
  line="sanitize [$isa]: ${passed:-no pytest summary}, pytest exit $rc, ${seconds}s, reports: $reports"
  echo "$line"
  summary+=("$line")
done

echo "== summary ($((SECONDS - start))s in all)"
printf '%s\n' "${summary[@]}"
if ((failed)); then
  echo "sanitize: FAILED" >&2
  exit 1
fi
echo "sanitize: OK, no sanitizer reports"

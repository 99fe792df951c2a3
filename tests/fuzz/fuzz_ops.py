"""Atheris fuzzer for the raw ops CompressedEmbeddingLookup, FusedDecodeAxpy
and BatchedFusedDecodeAxpy.

In the style of tensorflow/security/fuzzing/*_fuzz.py. One byte of an input
picks the op, the rest draws its inputs: tables of every storage format
(int8 + float32 scales, float16, and uint8 records of the rowwise int8 and
int4 formats with their row_format and dim attrs; sometimes attrs that do
not fit the table's dtype or shape), small shapes (<= 8, sometimes up to 40 or 64/128/129/257 to
reach the SIMD tails and the fixed-dim paths), int32/int64 ids with
negatives, V and int extremes, sorted and unsorted segment ids, weights and
scales with NaN/Inf/subnormals/huge values, every num_segments from negative
to 2**63 - 1, all combiners, empty inputs, mismatched lengths, wrong ranks and
wrong dtypes.

An independent numpy model (`expect`) decides, before looking at the op's
answer, whether the call is valid. `check` then allows exactly:
  * valid call: a float32 result equal to the numpy result (lookup: bit
    for bit, up to NaN payloads and TF's FTZ/DAZ, from the format's own
    decoder, quantization.decode; pool: within the float32 accumulation
    bound of `pool_bound`, of the terms the kernels add: for int4 a row's
    weighted values and its weighted bias). An error is a finding.
  * invalid call: tf.errors.InvalidArgumentError whose message names one of
    the invalid inputs (for a wrong dtype, TF's own InvalidArgumentError /
    ValueError / TypeError naming the input, its type attr or its dtype).
    A result is a finding.
  * valid call whose output cannot exist (2**60 bytes or more):
    ResourceExhaustedError.
Anything else (another exception, a wrong value or shape, a crash, a hang)
is reported by atheris with the case printed in the exception.

A third of the inputs run 1-4 pool cases as one BatchedFusedDecodeAxpy call
(some with their bags given as row splits, a few of those bad). Its oracle
is the loop of single-op calls it stands for: an invalid feature must be
named (`feature f: `) with one of its invalid inputs; when every feature is
valid, each output must pass the single op's oracle and equal the single
op's result bit for bit.

The op never gets a valid request for a large output: `safe_num_segments`
keeps every valid output under MAX_OUTPUT_BYTES, while huge num_segments
still reach the op with zero-width tables, with invalid inputs and as outputs
that cannot be allocated at all.

Only this file's drawing and oracle code is coverage-instrumented (the op
library is not built with -fsanitize=fuzzer, and instrumenting all of
TensorFlow's Python makes every run slower); the fuzzer is mostly a random
generator steered by which validity and numeric branches an input reaches.

Usage (the kernel row is fixed per process by TFCE_ISA, set before import;
`tf_compressed_embedding.supported_isas()` lists this CPU's rows):

  # bounded CI run, every row: tests/fuzz/test_fuzz.py
  TFCE_FUZZ_SECONDS=12 pytest -s tests/fuzz/test_fuzz.py

  # longer run on one row, corpus and crash files under /tmp
  mkdir -p /tmp/tfce_fuzz/corpus
  TFCE_ISA=avx2 python tests/fuzz/fuzz_ops.py \
      -max_total_time=3600 -rss_limit_mb=4096 \
      -artifact_prefix=/tmp/tfce_fuzz/avx2- /tmp/tfce_fuzz/corpus

  # reproduce a crash file: runs that one input and prints the case
  TFCE_ISA=avx2 python tests/fuzz/fuzz_ops.py /tmp/tfce_fuzz/avx2-crash-<sha1>

RSS grows by a few hundred bytes a run: TF's eager runtime keeps about 0.7 KB
per failed op call (tf.gather with a bad index too), hence the higher
-rss_limit_mb for hour-long runs.

Env: TFCE_FUZZ_STATS=<path> makes the fuzzer write its counters (runs, op
calls, results and errors checked, elements compared) as JSON every second.

Findings so far, all fixed in the ops, with regression tests in
tests/fuzz/test_fuzz.py (REPRODUCERS): an output element count beyond int64
gave TF's overflow error naming no input; bad ids or segment ids with a huge
output were found only after allocating it (ResourceExhausted, gigabytes
touched); the SIMD rows folded the weight into the int8 scale and the
reference did not, so they disagreed where a product overflows float32.
(With the rowwise formats: none yet.)
"""
import dataclasses
import json
import os
import re
import sys
import time

# Before TensorFlow loads, and only when fuzzing (an importer keeps its
# environment). TF logs a long allocator report on every ResourceExhausted,
# which would flood the fuzzer's output. And with oneDNN on, TF's CPU
# allocator retries a failed allocation for 10 s before reporting it; the
# plain allocator fails at once, and the ops under test behave the same on
# both.
if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import atheris  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_compressed_embedding as tfce  # noqa: E402
from tf_compressed_embedding import _batched_inputs, _loader, quantization  # noqa: E402

OPS = _loader.ops()  # raw ops are on the loaded library, not tf.raw_ops
ISA = tfce.active_isa()  # the kernel row of this process (TFCE_ISA)

F32 = np.finfo(np.float32)
FLT_MAX = float(F32.max)
FLT_MIN = float(F32.tiny)  # smallest normal; TF runs kernels with FTZ/DAZ

MAX_OUTPUT_BYTES = 1 << 20  # largest output (plus offsets) a valid call gets
# An allocation this large fails on any 64-bit machine (user address space
# is at most 2**47 or 2**56 bytes), even with memory overcommit on.
UNALLOCATABLE_BYTES = 1 << 60
# Output dims whose float32 bytes are >= 2**60 (or whose element count
# overflows int64 with a second such dim or > 1 id): num_segments that
# cannot be allocated. numpy can still hold an empty int8 table [0, d] of
# each, and a float16 one if d < 2**62: dims the ops refuse (MAX_DIM).
HUGE_DIMS = (1 << 58, (1 << 62) - 1, (1 << 63) - 1)
# The largest dim a table may have (kMaxDim, kernels/core/kernel_api.h):
# the ops refuse larger ones, a rowwise dim attr naming dim, a plain
# table's second dimension naming the table. (MAX_DIM itself is valid but
# not drawn: a valid output [k, 2**40] would really be allocated.)
MAX_DIM = 1 << 40
# Rowwise dim attrs beyond it whose record bytes (4 + D, 4 + ceil(D / 2))
# fit numpy's (and int64's) sizes, and the first one refused.
HUGE_ROWWISE_DIMS = (MAX_DIM + 1, 1 << 58, (1 << 62) - 1)

COMBINERS = ("sum", "mean", "sqrtn")
SPECIAL_FLOATS = np.array(
    [0.0, -0.0, 1.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 1e-40, -1e-45,
     FLT_MIN, 1e-20, 1e20, 1e30, FLT_MAX, -FLT_MAX], np.float32)

# Allowed dtypes of each input, and how TF names the input in a dtype error
# (its type attr, or its position for fixed float32 inputs).
INPUT_DTYPES = {
    "table": ((np.int8, np.float16, np.uint8), "attr 'T'"),
    "scales": ((np.float32,), "input #1"),
    "ids": ((np.int32, np.int64), "attr 'Tidx'"),
    "segment_ids": ((np.int32, np.int64), "attr 'Tseg'"),
    "weights": ((np.float32,), "input #4"),
    "num_segments": ((np.int32, np.int64), "attr 'Tnumsegments'"),
}
WRONG_DTYPES = {
    "table": (np.int16, np.uint16, np.float32),
    "scales": (np.float16, np.float64),
    "ids": (np.uint8, np.int16, np.float32),
    "segment_ids": (np.int16, np.float64),
    "weights": (np.float64, np.int32),
    "num_segments": (np.uint64, np.float32),
}

# The ops' row_format attr of each rowwise format, and back.
ROW_FORMATS = {quantization.op_row_format(f): f
               for f in quantization.ROWWISE_FORMATS}


class Finding(AssertionError):
    """The op's outcome is not one the oracle allows for this case."""


@dataclasses.dataclass(eq=False)  # holds arrays: compare by identity
class Case:
    """One raw-op call: the op's name, its inputs (numpy arrays in the op's
    input order, dtypes exactly as passed), for the pool the combiner, and
    the table's attrs (row_format and dim; none: the defaults)."""
    op: str
    inputs: dict
    combiner: str = "sum"
    attrs: dict = dataclasses.field(default_factory=dict)

    def describe(self):
        lines = [f"op={self.op} isa={ISA}"
                 + (f" combiner={self.combiner!r}"
                    if self.op == "FusedDecodeAxpy" else "")
                 + "".join(f" {k}={v!r}" for k, v in self.attrs.items())]
        for name, value in self.inputs.items():
            text = np.array2string(value, threshold=2000, max_line_width=120,
                                   floatmode="unique")
            lines.append(f"{name}: {value.dtype} {value.shape} = {text}")
        return "\n".join(lines)


STATS = {"runs": 0, "op_calls": {}, "results_checked": 0,
         "errors_checked": 0, "too_big_checked": 0, "elements_compared": 0,
         "elements_unchecked": 0, "results_by_format": {},
         "batched_bag_kinds": {}}
_STATS_PATH = os.environ.get("TFCE_FUZZ_STATS")
_last_stats_write = 0.0


def write_stats(force=False):
    """Writes STATS to TFCE_FUZZ_STATS about once a second: libFuzzer ends
    the process with exit(), so there is no Python shutdown hook to rely on."""
    global _last_stats_write
    now = time.monotonic()
    if _STATS_PATH is None or (not force and now - _last_stats_write < 1.0):
        return
    _last_stats_write = now
    tmp = _STATS_PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**STATS, "isa": ISA}, f)
    os.replace(tmp, _STATS_PATH)


# ------------------------------------------------------------------ drawing


# Every draw maps the bytes an exhausted input yields (zeros) to its common,
# valid choice, so short inputs make valid calls.
#
# atheris traces each comparison in an instrumented function and leaks about
# 100 bytes per comparison of numpy arrays, so those functions compare arrays
# only with ufuncs (np.less, np.equal) or in uninstrumented helpers.


@atheris.instrument_func
def draw_size(fdp, allow_special=False):
    """Mostly 1..8; sometimes 0, 9..40 (SIMD tails), or with allow_special
    64..257 (the fixed-dim kernels; as a count of ids, enough work for the
    op to shard it over threads)."""
    kind = fdp.ConsumeIntInRange(0, 15)
    if kind < 12:
        return 1 + fdp.ConsumeIntInRange(0, 7)
    if kind == 12:
        return 0
    if kind < 15 or not allow_special:
        return fdp.ConsumeIntInRange(9, 40)
    return fdp.PickValueInList([64, 128, 129, 257])


def draw_floats(fdp, n, extreme):
    """n float32 values in [-4, 4]; with `extreme`, about half are specials."""
    values = np.array(fdp.ConsumeIntListInRange(n, -512, 512),
                      np.float32).reshape(n) / np.float32(128)
    if extreme:
        picks = np.array(fdp.ConsumeIntListInRange(
            n, 0, 2 * len(SPECIAL_FLOATS) - 1), np.int64).reshape(n)
        special = picks < len(SPECIAL_FLOATS)
        values[special] = SPECIAL_FLOATS[picks[special]]
    return values


def draw_array(fdp, dtype, shape, extreme=False):
    """An array of any dtype the fuzzer uses, filled from fdp."""
    n = int(np.prod(shape, dtype=np.int64))
    dtype = np.dtype(dtype)
    if dtype == np.float16 and extreme:  # any bits: NaN, Inf, subnormals
        bits = np.array(fdp.ConsumeIntListInRange(n, 0, 0xFFFF), np.uint16)
        return bits.reshape(shape).view(np.float16)
    if dtype == np.float16:  # exactly representable small values
        return (np.array(fdp.ConsumeIntListInRange(n, -2048, 2048),
                         np.float16) / np.float16(64)).reshape(shape)
    if dtype.kind == "f":
        return draw_floats(fdp, n, extreme).astype(dtype).reshape(shape)
    if dtype == np.int8 and extreme:  # zeros (0 * Inf) and the extremes
        picks = np.array(fdp.ConsumeIntListInRange(n, 0, 7), np.int64)
        return np.array([0, 0, 1, -1, 127, -127, -128, 64],
                        np.int8)[picks].reshape(shape)
    info = np.iinfo(dtype)
    low, high = max(int(info.min), -128), min(int(info.max), 127)
    return np.array(fdp.ConsumeIntListInRange(n, low, high),
                    dtype).reshape(shape)


def out_of_range(limit, dtype):
    """Values of an integer dtype outside [0, limit): just outside, the
    extremes, and 2**32 + k (valid if truncated to 32 bits)."""
    info = np.iinfo(dtype)
    candidates = [-1, -2, limit, limit + 1, int(info.min), int(info.max),
                  1 << 31, -(1 << 31) - 1, 1 << 32, (1 << 32) + 1,
                  (1 << 32) + limit - 1, -(1 << 32) + 1, 1 << 62]
    return [v for v in candidates
            if info.min <= v <= info.max and not 0 <= v < limit]


@atheris.instrument_func
def draw_indices(fdp, n, limit, dtype):
    """n indices for [0, limit); in some cases some are out of range."""
    values = np.array(fdp.ConsumeIntListInRange(n, 0, max(limit - 1, 0)),
                      np.int64).reshape(n)
    bad_rate = fdp.ConsumeIntInRange(0, 15)
    bad_rate = 0 if bad_rate < 13 else 2 * (bad_rate - 12)  # of 16 per id
    picks = np.array(fdp.ConsumeIntListInRange(n, 0, 15), np.int64).reshape(n)
    bad_values = out_of_range(limit, dtype)
    for i in np.flatnonzero(np.less(picks, bad_rate) | (limit == 0)):
        values[i] = fdp.PickValueInList(bad_values)
    return values.astype(dtype)


@atheris.instrument_func
def draw_dtype(fdp, name):
    """One of the input's allowed dtypes; a wrong one in 1 case of 32."""
    allowed, _ = INPUT_DTYPES[name]
    if fdp.ConsumeIntInRange(0, 31) == 31:
        return fdp.PickValueInList(list(WRONG_DTYPES[name]))
    return fdp.PickValueInList(list(allowed))


@atheris.instrument_func
def draw_rowwise_attrs(fdp, dtype, dim):
    """The table's attrs: mostly those of its dtype (uint8: a rowwise format
    of dim `dim`; int8 and half: none, i.e. 'plain'); sometimes a row_format
    of the other kind, or a dim that is wrong or fits another record size."""
    rowwise = np.dtype(dtype) == np.uint8
    attrs = {}
    if rowwise:
        attrs = {"row_format": fdp.PickValueInList(sorted(ROW_FORMATS)),
                 "dim": dim}
    kind = fdp.ConsumeIntInRange(0, 31)
    if kind == 31:  # the other kind of row_format
        attrs = ({"row_format": "plain"} if rowwise else
                 {"row_format": fdp.PickValueInList(sorted(ROW_FORMATS)),
                  "dim": dim})
        if rowwise and fdp.ConsumeBool():
            attrs = {}  # left out: 'plain'
    elif kind == 30 and rowwise:  # another dim (int4: dim +- 1 may fit)
        attrs["dim"] = fdp.PickValueInList(
            [-1, -3, 0, dim + 1, max(dim - 1, 0), 2 * dim + 7, MAX_DIM + 1,
             1 << 62, (1 << 63) - 1])
        if attrs["dim"] == -1 and fdp.ConsumeBool():
            del attrs["dim"]  # left out: -1
    elif kind == 30:  # a dim for a 'plain' table
        attrs["dim"] = fdp.PickValueInList([0, dim, -2])
    return attrs


@atheris.instrument_func
def draw_table(fdp):
    """(table, scales, attrs): mostly well formed, sometimes of a wrong
    rank, a zero-row table with a huge dim, a rowwise table whose width is
    not its records', attrs that do not fit it (draw_rowwise_attrs), or
    scales of the wrong shape."""
    dtype = draw_dtype(fdp, "table")
    rows, dim = draw_size(fdp), draw_size(fdp, allow_special=True)
    attrs = draw_rowwise_attrs(fdp, dtype, dim)
    fmt = ROW_FORMATS.get(attrs.get("row_format"))
    if np.dtype(dtype) != np.uint8:
        fmt = None  # only uint8 tables hold records
    width = dim if fmt is None else quantization.record_bytes(fmt, dim)
    shape_kind = fdp.ConsumeIntInRange(0, 31)
    if shape_kind == 31:
        shape = fdp.PickValueInList([(), (rows,), (rows, width, 2)])
    elif shape_kind == 30 and fmt is None:
        shape = (0, fdp.PickValueInList(
            [d for d in (MAX_DIM + 1,) + HUGE_DIMS
             if d * np.dtype(dtype).itemsize < 1 << 63]))
    elif shape_kind == 30:  # an empty table of huge records (refused dims)
        huge = fdp.PickValueInList(list(HUGE_ROWWISE_DIMS))
        attrs["dim"] = huge
        shape = (0, quantization.record_bytes(fmt, huge))
    elif shape_kind == 29 and fmt is not None:  # not its records' width
        other = "int4" if fmt == "int8" else "int8"
        shape = (rows, fdp.PickValueInList(
            [width + 1, width - 1, dim, quantization.record_bytes(other, dim)]))
    else:
        shape = (rows, width)
    extreme = fdp.ConsumeBool()
    if fmt is not None and not extreme and shape == (rows, width):
        # Records as the encoder makes them.
        values = draw_floats(fdp, rows * dim, False).reshape(rows, dim)
        table = quantization.encode(values, fmt)[0]
    elif np.dtype(dtype) == np.uint8:  # any bytes: NaN, Inf, subnormal scales
        n = int(np.prod(shape, dtype=np.int64))
        table = np.array(fdp.ConsumeIntListInRange(n, 0, 255),
                         np.uint8).reshape(shape)
    else:
        table = draw_array(fdp, dtype, shape, extreme=extreme)
    split = np.dtype(dtype) not in (np.float16, np.uint8)  # int8 (or wrong)
    n_scales = shape[0] if split and len(shape) == 2 else 0
    scales_shape = (n_scales,)
    if fdp.ConsumeIntInRange(0, 31) == 31:
        scales_shape = fdp.PickValueInList(
            [(), (n_scales + 1,), (max(n_scales - 1, 0),), (n_scales, 1)])
    scales = draw_array(fdp, draw_dtype(fdp, "scales"), scales_shape,
                        extreme=fdp.ConsumeIntInRange(0, 3) == 0)
    return table, scales, attrs


def table_rows_dim(table, attrs):
    """(V, D) of a table under its attrs ((0, 0) if they do not fit)."""
    if table.ndim != 2:
        return 0, 0
    dim = attrs.get("dim", -1)
    return table.shape[0], (table.shape[1] if dim < 0 else dim)


@atheris.instrument_func
def draw_lookup(fdp):
    table, scales, attrs = draw_table(fdp)
    rows, _ = table_rows_dim(table, attrs)
    ids_dtype = draw_dtype(fdp, "ids")
    rank = fdp.PickValueInList([1, 1, 1, 0, 2, 3])
    shape = tuple(fdp.ConsumeIntInRange(0, 5) for _ in range(rank))
    if rank == 1:
        shape = (draw_size(fdp, allow_special=True),)
    if rank >= 2 and fdp.ConsumeIntInRange(0, 15) == 15:
        shape = (0, 1 << 40) + shape[2:]  # empty, but a huge output dim
    if np.dtype(ids_dtype).kind == "i":
        ids = draw_indices(fdp, int(np.prod(shape, dtype=np.int64)), rows,
                           ids_dtype).reshape(shape)
    else:
        ids = draw_array(fdp, ids_dtype, shape)
    return Case("CompressedEmbeddingLookup",
                {"table": table, "scales": scales, "ids": ids}, attrs=attrs)


@atheris.instrument_func
def draw_num_segments(fdp, fit, dtype, dim):
    """num_segments: mostly `fit`; else 0, negative or huge."""
    kind = fdp.ConsumeIntInRange(0, 15)
    if np.dtype(dtype).kind != "i":
        return np.array(fit, dtype)
    info = np.iinfo(dtype)
    if kind < 13:
        value = fit
    elif kind == 13:
        value = 0
    elif kind == 14:
        value = fdp.PickValueInList([-1, -(1 << 31), int(info.min)])
    elif dim == 0:  # no output bytes: any size is fine
        value = fdp.PickValueInList([int(info.max), 1 << 31, (1 << 32) + 1,
                                     1 << 40, 1 << 62])
    else:  # cannot be allocated, or overflows int64 elements
        value = fdp.PickValueInList(list(HUGE_DIMS))
    value = min(value, int(info.max))
    shape = (1,) if fdp.ConsumeIntInRange(0, 31) == 31 else ()
    return np.full(shape, value, dtype)


@atheris.instrument_func
def draw_pool(fdp):
    table, scales, attrs = draw_table(fdp)
    rows, dim = table_rows_dim(table, attrs)
    n = draw_size(fdp, allow_special=True)
    if fdp.ConsumeIntInRange(0, 15) == 15:  # many segments, over threads
        num_bags = fdp.ConsumeIntInRange(
            1, max(1, min(2048, MAX_OUTPUT_BYTES // (4 * dim + 8))))
    else:
        num_bags = fdp.ConsumeIntInRange(1 if n else 0, 10)
    ids_dtype = draw_dtype(fdp, "ids")
    seg_dtype = draw_dtype(fdp, "segment_ids")
    ids = (draw_indices(fdp, n, rows, ids_dtype)
           if np.dtype(ids_dtype).kind == "i"
           else draw_array(fdp, ids_dtype, (n,)))
    segment_ids = np.sort(np.array(fdp.ConsumeIntListInRange(
        n, 0, max(num_bags - 1, 0)), np.int64)).reshape(n)
    seg_kind = fdp.ConsumeIntInRange(0, 31)
    if seg_kind == 30 and n >= 2:  # unsorted
        segment_ids = segment_ids[::-1].copy()
    elif seg_kind == 31 and n >= 1:  # one out of range
        i = fdp.ConsumeIntInRange(0, n - 1)
        int_dtype = seg_dtype if np.dtype(seg_dtype).kind == "i" else np.int32
        segment_ids[i] = fdp.PickValueInList(out_of_range(num_bags, int_dtype))
    segment_ids = segment_ids.astype(seg_dtype)
    weights_kind = fdp.ConsumeIntInRange(0, 15)
    weights_shape = (0,) if weights_kind < 5 else (n,)
    if weights_kind == 15:  # wrong length or rank
        weights_shape = fdp.PickValueInList([(n + 1,), (), (n, 1)])
    weights = draw_array(fdp, draw_dtype(fdp, "weights"), weights_shape,
                         extreme=fdp.ConsumeIntInRange(0, 3) == 0)
    shape_kind = fdp.ConsumeIntInRange(0, 31)
    if shape_kind == 31:  # mismatched lengths
        segment_ids = segment_ids[:-1] if n else segment_ids.repeat(2)[:1]
    elif shape_kind == 30:  # wrong ranks
        ids = ids.reshape(n, 1)
    elif shape_kind == 29:
        segment_ids = segment_ids.reshape(1, n)
    num_segments = draw_num_segments(
        fdp, num_bags, draw_dtype(fdp, "num_segments"), dim)
    combiner = (fdp.PickValueInList(["max", "", "SUM"])
                if fdp.ConsumeIntInRange(0, 63) == 63 else
                fdp.PickValueInList(list(COMBINERS)))
    case = Case("FusedDecodeAxpy",
                {"table": table, "scales": scales, "ids": ids,
                 "segment_ids": segment_ids, "weights": weights,
                 "num_segments": num_segments}, combiner, attrs)
    return safe_num_segments(case, num_bags)


def safe_num_segments(case, fallback):
    """Replaces num_segments by `fallback` when the op would allocate more
    than MAX_OUTPUT_BYTES but less than UNALLOCATABLE_BYTES: such a call is
    valid up to its allocation and would take real memory."""
    exp = expect(case)
    if MAX_OUTPUT_BYTES < exp.alloc_bytes < UNALLOCATABLE_BYTES:
        ns = case.inputs["num_segments"]
        case.inputs["num_segments"] = np.full(ns.shape, fallback, ns.dtype)
    return case


# ------------------------------------------------------------------ oracle


@dataclasses.dataclass
class Expectation:
    """What the op must do, decided from the inputs alone.

    invalid: inputs that make the call invalid (naming any one is enough).
    dtype_error: some input has a dtype the op does not accept.
    alloc_bytes: bytes the op allocates if the shapes pass (0 when an
      earlier check fails); >= UNALLOCATABLE_BYTES: cannot be allocated.
    overflow: inputs whose shapes make the output's element count overflow
      int64 (the call is invalid; the error should name one of them).
    """
    invalid: tuple = ()
    dtype_error: bool = False
    alloc_bytes: int = 0
    overflow: tuple = ()


def dtype_problems(case):
    return tuple(name for name, value in case.inputs.items()
                 if value.dtype not in [np.dtype(d)
                                        for d in INPUT_DTYPES[name][0]])


def table_format(table, attrs):
    """(fmt, dim, invalid): the storage format (quantization.FORMATS) and D
    that the table's dtype and attrs name, or the attrs that do not fit
    (ParseTableFormat, kernels/tf/table_format.cc): 'plain' takes int8 and
    half tables and dim -1; a rowwise row_format a uint8 table and a dim in
    [0, MAX_DIM]. The errors name row_format or dim."""
    row_format = attrs.get("row_format", "plain")
    dim = attrs.get("dim", -1)
    if row_format == "plain":
        if dim != -1 or table.dtype == np.uint8:
            return None, None, ("row_format", "dim")
        fmt = "int8_split" if table.dtype == np.int8 else "fp16"
        return fmt, (table.shape[1] if table.ndim == 2 else None), ()
    if table.dtype != np.uint8 or not 0 <= dim <= MAX_DIM:
        return None, None, ("row_format", "dim")
    return ROW_FORMATS[row_format], dim, ()


def table_problems(table, scales, fmt, dim):
    """The first of table, scales that does not fit format fmt of dim D (in
    MakeTableView's order: rank, a plain table's dim, record width, scales)."""
    if table.ndim != 2:
        return ("table",)
    if fmt not in quantization.ROWWISE_FORMATS and table.shape[1] > MAX_DIM:
        return ("table",)
    if (fmt in quantization.ROWWISE_FORMATS
            and table.shape[1] != quantization.record_bytes(fmt, dim)):
        return ("table",)
    want = (table.shape[0],) if fmt == "int8_split" else (0,)
    return () if scales.shape == want else ("scales",)


def bad_indices(values, limit):
    values = values.astype(np.int64)
    return bool(np.any((values < 0) | (values >= limit)))


def unsorted(values):
    return bool(np.any(np.diff(values.astype(np.int64)) < 0))


def output_bytes(*dims):
    """float32 bytes of an output of these dims, or None if the element
    count overflows int64 (TF's TensorShape limit)."""
    elements = 1
    for d in dims:
        elements *= int(d)
    return None if elements > (1 << 63) - 1 else 4 * elements


@atheris.instrument_func
def expect(case):
    """The independent validity model of both ops (see ops.cc)."""
    wrong = dtype_problems(case)
    if wrong:
        return Expectation(invalid=wrong, dtype_error=True)
    if case.op == "FusedDecodeAxpy" and case.combiner not in COMBINERS:
        return Expectation(invalid=("combiner",))
    x = case.inputs
    fmt, dim, invalid = table_format(x["table"], case.attrs)
    if invalid:
        return Expectation(invalid=invalid)
    invalid = table_problems(x["table"], x["scales"], fmt, dim)
    if invalid:
        return Expectation(invalid=invalid)
    rows = x["table"].shape[0]
    if case.op == "CompressedEmbeddingLookup":
        size = output_bytes(*x["ids"].shape, dim)
        late = ("ids",) if bad_indices(x["ids"], rows) else ()
        if size is None:
            return Expectation(invalid=late, overflow=("ids", "table"))
        return Expectation(invalid=late, alloc_bytes=size)
    ids, seg, weights, ns = (x["ids"], x["segment_ids"], x["weights"],
                             x["num_segments"])
    early = ()
    if ids.ndim != 1:
        early += ("ids",)
    if seg.ndim != 1:
        early += ("segment_ids",)
    if not early and len(ids) != len(seg):
        early += ("ids", "segment_ids")
    n = ids.shape[0] if ids.ndim == 1 else -1
    if weights.ndim != 1 or weights.shape[0] not in (n, 0):
        early += ("weights",)
    if ns.ndim != 0 or int(ns) < 0:
        early += ("num_segments",)
    if early:
        return Expectation(invalid=early)
    num_segments = int(ns)
    late = ()
    if bad_indices(seg, num_segments) or unsorted(seg):
        late += ("segment_ids",)
    if bad_indices(ids, rows):
        late += ("ids",)
    size = output_bytes(num_segments, dim)
    if size is None:
        return Expectation(invalid=late, overflow=("num_segments", "table"))
    if num_segments > 0 and dim > 0:  # the [num_segments + 1] offsets
        size += 8 * (num_segments + 1)
    return Expectation(invalid=late, alloc_bytes=size)


def names_input(message, names):
    """Whether message names one of the inputs (as a word: 'ids' does not
    match inside 'segment_ids')."""
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])",
                         message) for n in names)


@atheris.instrument_func
def check(case, outcome):
    """Raises Finding unless `outcome` (the op's result tensor, or the
    exception it raised) is allowed for `case`."""
    try:
        check_outcome(case, expect(case), outcome)
    except Finding as e:
        shown = (f"{type(outcome).__name__}: {str(outcome)[:500]}"
                 if isinstance(outcome, Exception) else repr(outcome))
        raise Finding(f"{e}\n--- outcome: {shown}\n--- case:\n"
                      f"{case.describe()}") from None


@atheris.instrument_func
def check_outcome(case, exp, outcome):
    is_error = isinstance(outcome, Exception)
    message = str(outcome) if is_error else ""
    if exp.dtype_error:
        if not isinstance(outcome, (tf.errors.InvalidArgumentError,
                                    ValueError, TypeError)):
            raise Finding(f"wrong dtype of {exp.invalid}: expected a dtype "
                          f"error")
        hints = list(exp.invalid)
        for name in exp.invalid:
            hints.append(INPUT_DTYPES[name][1])
            hints.append(tf.as_dtype(case.inputs[name].dtype).name)
        if not any(h in message for h in hints):
            raise Finding(f"dtype error does not name {exp.invalid}")
        STATS["errors_checked"] += 1
        return
    if exp.overflow:
        names = exp.invalid + exp.overflow
        if (isinstance(outcome, tf.errors.InvalidArgumentError)
                and names_input(message, names)):
            STATS["errors_checked"] += 1
            return
        raise Finding(f"output element count overflows int64: expected an "
                      f"InvalidArgumentError naming one of {names}")
    if exp.invalid:
        if (isinstance(outcome, tf.errors.InvalidArgumentError)
                and names_input(message, exp.invalid)):
            STATS["errors_checked"] += 1
            return
        raise Finding(f"invalid {exp.invalid}: expected an "
                      f"InvalidArgumentError naming one of them")
    if exp.alloc_bytes >= UNALLOCATABLE_BYTES:
        if not isinstance(outcome, tf.errors.ResourceExhaustedError):
            raise Finding(f"valid call needing {exp.alloc_bytes} bytes: "
                          f"expected ResourceExhaustedError")
        STATS["too_big_checked"] += 1
        return
    if is_error:
        raise Finding("valid call failed")
    if case.op == "CompressedEmbeddingLookup":
        check_lookup(case, outcome)
    else:
        check_pool(case, outcome)
    STATS["results_checked"] += 1
    fmt = table_format(case.inputs["table"], case.attrs)[0]
    STATS["results_by_format"][fmt] = STATS["results_by_format"].get(fmt, 0) + 1


def result_values(got, shape):
    """Checks the result's dtype and shape; returns its values as numpy, or
    None when it has no elements (numpy cannot even hold an empty array
    whose other dims multiply past 2**63 bytes)."""
    if not isinstance(got, tf.Tensor) or got.dtype != tf.float32:
        raise Finding(f"result is not a float32 tensor: {got!r}")
    if tuple(got.shape) != tuple(shape):
        raise Finding(f"result shape {tuple(got.shape)}, expected "
                      f"{tuple(shape)}")
    return got.numpy() if got.shape.num_elements() else None


def tiny(x):
    """Nonzero values that flush-to-zero / denormals-are-zero may zero."""
    x = np.abs(x)
    return (x > 0) & (x < 2 * FLT_MIN)


def record_scales(records):
    """The float32 scale of each int8 record (its first 4 bytes)."""
    return np.ascontiguousarray(records[:, :4]).view("<f4")[:, 0]


def int4_fields(records, dim):
    """(q float64 [n, D], scale float32 [n, 1], bias float32 [n, 1]) of int4
    records: float16 scale and bias, then nibbles, low first."""
    meta = np.ascontiguousarray(records[:, :4]).view("<f2").astype(np.float32)
    values = records[:, 4:]
    q = np.stack([values & 0x0F, values >> 4], axis=2).reshape(len(records), -1)
    return q[:, :dim].astype(np.float64), meta[:, 0:1], meta[:, 1:2]


@atheris.instrument_func
def check_lookup(case, got):
    """Lookup decodes with one float32 multiply (int8, both layouts), a
    multiply then an add (int4) or exactly (fp16): bit-exact, except that
    NaN payloads may differ and values TF's FTZ/DAZ may flush (a subnormal
    int8 product, or a subnormal int8 scale) may be zero. int4 has none:
    float16 scales and biases widen to normal floats, and q scale + bias is
    0 or at least 2**-24."""
    table, scales, ids = (case.inputs[k] for k in ("table", "scales", "ids"))
    fmt, dim, _ = table_format(table, case.attrs)
    got = result_values(got, ids.shape + (dim,))
    if got is None:
        return
    ids = ids.astype(np.int64)
    with np.errstate(all="ignore"):
        # The format's own decoder (tables here are tiny: decode them whole).
        want = quantization.decode(table, scales, fmt, dim)[ids]
        if fmt == "int8_split":
            flushable = tiny(want) | tiny(scales[ids])[..., None]
        elif fmt == "int8":
            flushable = tiny(want) | tiny(record_scales(table)[ids])[..., None]
        else:
            flushable = np.zeros(want.shape, bool)
    ok = lookup_ok(got, want, flushable)
    STATS["elements_compared"] += int(ok.size)
    if not ok.all():
        raise Finding(f"lookup mismatch at {np.argwhere(~ok)[:5].tolist()}: "
                      f"got {got[~ok][:5]}, want {want[~ok][:5]}")


def lookup_ok(got, want, flushable):
    return ((got == want) | (np.isnan(got) & np.isnan(want))
            | (flushable & (got == 0)))


@atheris.instrument_func
def denominator(w, combiner):
    """The float32 denominator in the kernels' order, computed both without
    and with flushing subnormals (TF's FTZ/DAZ); None if they differ."""
    if combiner == "sum":
        return np.float32(1)
    results = []
    for flush in (False, True):
        f = ((lambda v: np.float32(0) if tiny(v) else v) if flush
             else (lambda v: v))
        wsum = w2sum = np.float32(0)
        for wi in w:
            wi = f(wi)
            wsum = f(np.float32(wsum + wi))
            w2sum = f(np.float32(w2sum + f(np.float32(wi * wi))))
        results.append(wsum if combiner == "mean" else f(np.sqrt(w2sum)))
    a, b = results
    return a if a == b or (np.isnan(a) and np.isnan(b)) else None


def pool_bound(terms, droppable, denom, count=None):
    """Per element of one segment: (want, bound, checked).

    terms[i, d] = float32(w_i * scale_i) * value(ids[i])[d] in float64 (the
    weight folded into the int8 scale as the kernels do; w_i * value for
    fp16); for int4 followed by one row per id of its float32(w_i * bias_i)
    (the bias sum the kernels add once per bag). `count`: the bag's ids (the
    rows of terms if None). The bound is the kernels'
    (quantization.pooled_error_bound, of every term's magnitude) plus
    what flush-to-zero adds: terms that FTZ/DAZ may drop count in full, plus
    FLT_MIN per operation for flushed partial results. Elements where a
    float32 intermediate may overflow, and dropped non-finite terms (0 * Inf
    versus w * Inf), are not checked.
    """
    n = terms.shape[0]
    count = n if count is None else count
    finite = np.isfinite(terms)
    magnitude = np.where(finite, np.abs(terms), 0).sum(axis=0)
    dropped = np.where(droppable & finite, np.abs(terms), 0).sum(axis=0)
    want = terms.sum(axis=0) / np.float64(denom)
    scale = 1 / abs(np.float64(denom)) if denom != 0 else np.inf
    bound = (quantization.pooled_error_bound(magnitude, count, denom)
             + (dropped + (n + 2) * 2 * FLT_MIN) * scale + FLT_MIN)
    checked = ((magnitude < FLT_MAX / 4) & (magnitude * scale < FLT_MAX / 4)
               & ~np.any(droppable & ~finite, axis=0))
    return want, bound, checked


def segment_terms(table, scales, fmt, dim, ids, w32):
    """(terms, droppable) of the bag of `ids` with float32 weights w32 (see
    pool_bound), as the kernels form them: the weight folded into the
    row's scale in float32 (may be Inf), times each stored value; int4's
    weighted biases as extra rows."""
    w = w32.astype(np.float64)[:, None]
    if fmt == "fp16":
        terms = w * table[ids].astype(np.float64)
        return terms, tiny(w) | tiny(terms)
    if fmt == "int4":
        q, scale, bias = int4_fields(table[ids], dim)
        factor = (w32[:, None] * scale).astype(np.float64)
        values = factor * q
        biases = np.broadcast_to((w32[:, None] * bias).astype(np.float64),
                                 values.shape)
        return (np.concatenate([values, biases]),
                np.concatenate([tiny(w) | tiny(factor) | tiny(values),
                                tiny(w) | tiny(biases)]))
    if fmt == "int8_split":
        scale, q = scales[ids][:, None], table[ids]
    else:
        scale, q = record_scales(table[ids])[:, None], table[ids][:, 4:].view(np.int8)
    factor = (w32[:, None] * scale).astype(np.float64)
    terms = factor * q.astype(np.float64)
    droppable = (tiny(w) | tiny(scale.astype(np.float64)) | tiny(factor)
                 | tiny(terms))
    return terms, droppable


@atheris.instrument_func
def check_pool(case, got):
    """out[s] = sum_i w_i decode(ids[i]) / denom(s); zeros if denom == 0."""
    x = case.inputs
    table, scales = x["table"], x["scales"]
    fmt, dim, _ = table_format(table, case.attrs)
    ids = x["ids"].astype(np.int64)
    seg = x["segment_ids"].astype(np.int64)
    num_segments = int(x["num_segments"])
    got = result_values(got, (num_segments, dim))
    if got is None:
        return
    w32 = (x["weights"] if x["weights"].size
           else np.ones(len(ids), np.float32))
    with np.errstate(all="ignore"):
        for s in np.unique(seg):
            pos = np.flatnonzero(np.equal(seg, s))
            terms, droppable = segment_terms(table, scales, fmt, dim, ids[pos],
                                             w32[pos])
            compare_segment(got, s, terms, droppable,
                            denominator(w32[pos], case.combiner), len(pos))
    # Segments with no ids: zeros, exactly.
    empty = np.setdiff1d(np.arange(num_segments), seg)
    STATS["elements_compared"] += int(empty.size * dim)
    if np.any(np.not_equal(got[empty], 0)):
        raise Finding(f"empty segments {empty.tolist()} are not all zeros")


@atheris.instrument_func
def compare_segment(got, s, terms, droppable, denom, count=None):
    """Checks output row s against its terms (see pool_bound) of a bag of
    `count` ids."""
    if denom is None:  # the denominator depends on FTZ/DAZ
        STATS["elements_unchecked"] += got.shape[1]
        return
    row = got[s]
    if np.isnan(denom):
        ok = np.isnan(row)
        checked = np.ones(row.shape, bool)
        want, bound = np.full(row.shape, np.nan), np.zeros(row.shape)
    elif denom == 0:
        ok = np.equal(row, 0)
        checked = np.ones(row.shape, bool)
        want, bound = np.zeros(row.shape), np.zeros(row.shape)
    else:
        want, bound, checked = pool_bound(terms, droppable, denom, count)
        ok = pool_ok(row, want, bound)
    STATS["elements_compared"] += int(checked.sum())
    STATS["elements_unchecked"] += int((~checked).sum())
    bad = checked & ~ok
    if not bad.any():
        return
    d = np.flatnonzero(bad)[:5]
    raise Finding(f"pool mismatch in segment {s} at dims {d.tolist()}: got "
                  f"{row[d]}, want {want[d]} +- {bound[d]} "
                  f"(denominator {denom})")


def pool_ok(row, want, bound):
    """NaN and +-Inf exactly where expected, finite values within bound."""
    return np.where(np.isnan(want), np.isnan(row),
                    np.where(np.isinf(want), row == want,
                             np.isfinite(row) & (np.abs(row - want) <= bound)))


# ------------------------------------------------------------------ batched


# The batched op's name for the single op's inputs in error messages.
BATCHED_NAMES = {"num_segments": "num_bags"}


@dataclasses.dataclass(eq=False)
class OtherBags:
    """A feature's bags given another way than its segment ids: `kind`
    'row_splits' (`splits`), or 'dense' / 'padded' (`ids` [rows, width],
    `weights` of its shape or [0], `num_bags`). `bad` names the input made
    invalid on purpose, or is None."""
    kind: str
    splits: np.ndarray = None
    ids: np.ndarray = None
    weights: np.ndarray = None
    num_bags: np.int64 = None
    bad: str = None


@dataclasses.dataclass(eq=False)
class BatchedCase:
    """One BatchedFusedDecodeAxpy call: feature f is FusedDecodeAxpy case
    cases[f] (its num_segments as int64, the batched op's num_bags dtype);
    bags[f] is None (its segment ids) or the OtherBags that replace them."""
    cases: list
    bags: list
    op: str = "BatchedFusedDecodeAxpy"

    def describe(self):
        parts = []
        for f, case in enumerate(self.cases):
            kind = "segment_ids" if self.bags[f] is None else repr(self.bags[f])
            parts.append(f"--- feature {f} ({kind}):\n{case.describe()}")
        return "\n".join(parts)


def other_bags(fdp, case):
    """The bags of a case with valid, sorted segment ids drawn as row
    splits, dense rows (bags of one length, ids in range) or padded rows
    (ids >= 0), sometimes with one input made bad; None otherwise."""
    x = case.inputs
    seg, ids, ns = x["segment_ids"], x["ids"], x["num_segments"]
    weights = x["weights"]
    if not (seg.ndim == 1 and ids.ndim == 1 and len(seg) == len(ids)
            and ns.ndim == 0 and 0 <= int(ns) <= 4096 and not unsorted(seg)
            and not bad_indices(seg, int(ns))):
        return None
    # Dense and padded ids carry the weights in their shape: only valid
    # weights can be moved there.
    matrix_ok = weights.ndim == 1 and weights.size in (0, ids.size)
    kind = fdp.ConsumeIntInRange(0, 2)
    problem = fdp.ConsumeIntInRange(0, 15)
    splits = np.searchsorted(seg.astype(np.int64), np.arange(int(ns) + 1))
    lengths = np.diff(splits)
    if kind == 1 and matrix_ok and int(ns) > 0 and np.all(lengths == lengths[0]):
        shape = (int(ns), int(lengths[0]))
        bags = OtherBags("dense", ids=ids.reshape(shape),
                         num_bags=_batched_inputs.ROWS_OF_BAGS,
                         weights=weights.reshape(shape) if weights.size else weights)
        if problem == 15:
            bags.num_bags = np.int64(shape[0] + 1)
            bags.bad = "num_bags"
        return bags
    if kind == 2 and matrix_ok and (ids.size == 0 or ids.min() >= 0):
        width = int(lengths.max(initial=0)) + fdp.ConsumeIntInRange(0, 2)
        matrix = np.full((int(ns), width), -1, ids.dtype)
        dense_weights = np.zeros((int(ns), width), np.float32)
        for b in range(int(ns)):
            places = np.sort(np.random.default_rng(b).choice(
                width, lengths[b], replace=False))
            matrix[b, places] = ids[splits[b]:splits[b + 1]]
            if weights.size:
                dense_weights[b, places] = weights[splits[b]:splits[b + 1]]
        bags = OtherBags("padded", ids=matrix, num_bags=np.int64(ns),
                         weights=dense_weights if weights.size else weights)
        last = int(seg[-1]) + 1 if seg.size else 0
        if problem == 15 and last > 0:
            bags.num_bags = np.int64(last - 1)
            bags.bad = "num_bags"
        elif problem == 14 and weights.size and width:
            bags.weights = dense_weights[:, :-1]
            bags.bad = "weights"
        return bags
    bags = OtherBags("row_splits", splits=splits.astype(seg.dtype))
    if problem == 15 and bags.splits.size:  # does not start at 0
        bags.splits[0] += 1
        bags.bad = "row_splits"
    elif problem == 14 and bags.splits.size:  # does not end at len(ids)
        bags.splits[-1] += 1
        bags.bad = "row_splits"
    elif problem == 13 and bags.splits.size >= 3:  # decreases
        bags.splits[1] = bags.splits[-1] + 1
        bags.bad = "row_splits"
    return bags


@atheris.instrument_func
def draw_batched(fdp):
    """1-4 pool cases (dtypes the batched op takes: the single op's dtype
    errors are its own), some with their bags given another way
    (other_bags), sometimes bad ones."""
    cases, bags = [], []
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        case = draw_pool(fdp)
        if expect(case).dtype_error:
            continue
        x = case.inputs
        x["num_segments"] = x["num_segments"].astype(np.int64)
        if not has_scales(case):
            # The batched op has no scales input for such a table: a bad one
            # cannot reach it.
            x["scales"] = np.zeros([0], np.float32)
        cases.append(case)
        bags.append(other_bags(fdp, case) if fdp.ConsumeBool() else None)
    if not cases:
        return draw_pool(fdp)
    return BatchedCase(cases, bags)


def feature_expectation(batched, f):
    """Feature f's expectation, in the batched op's input names."""
    exp = expect(batched.cases[f])
    rename = dict(BATCHED_NAMES)
    bags = batched.bags[f]
    if bags is not None and bags.kind == "row_splits":
        rename["segment_ids"] = "row_splits"
    invalid = tuple(rename.get(n, n) for n in exp.invalid)
    if bags is not None and bags.bad:
        invalid += (bags.bad,)
    return dataclasses.replace(
        exp, invalid=invalid,
        overflow=tuple(rename.get(n, n) for n in exp.overflow))


@atheris.instrument_func
def check_batched(batched, outcome):
    """The batched op must do what the loop of single-op calls does: name a
    bad feature and one of its bad inputs, or give each feature the single
    op's result, bit for bit (and within the numpy oracle's bound)."""
    exps = [feature_expectation(batched, f) for f in range(len(batched.cases))]
    bad = [f for f, e in enumerate(exps) if e.invalid or e.overflow]
    message = str(outcome) if isinstance(outcome, Exception) else ""
    if bad:
        named = [f for f in bad
                 if re.search(rf"feature {f}: ", message)
                 and names_input(message, exps[f].invalid + exps[f].overflow)]
        if not isinstance(outcome, tf.errors.InvalidArgumentError) or not named:
            raise Finding(f"invalid features {bad}: expected an "
                          f"InvalidArgumentError naming one of them and "
                          f"one of its bad inputs")
        STATS["errors_checked"] += 1
        return
    total = sum(e.alloc_bytes for e in exps)
    if total >= UNALLOCATABLE_BYTES:
        if isinstance(outcome, tf.errors.ResourceExhaustedError) or (
                isinstance(outcome, tf.errors.InvalidArgumentError)
                and names_input(message, ("num_bags",))):
            STATS["too_big_checked"] += 1
            return
        raise Finding(f"valid features needing {total} bytes: expected "
                      f"ResourceExhaustedError")
    if isinstance(outcome, Exception):
        raise Finding("valid call failed")
    if len(outcome) != len(batched.cases):
        raise Finding(f"{len(outcome)} outputs for {len(batched.cases)} "
                      f"features")
    for f, case in enumerate(batched.cases):
        check_outcome(case, exps[f], outcome[f])
        single = run(case)
        if isinstance(single, Exception) or single.shape != outcome[f].shape:
            raise Finding(f"feature {f}: FusedDecodeAxpy gives {single!r}")
        if single.shape.num_elements() and not np.array_equal(
                single.numpy(), outcome[f].numpy(), equal_nan=True):
            raise Finding(f"feature {f} differs from FusedDecodeAxpy's "
                          f"result for it")


def has_scales(case):
    """Whether the case's table has a scales input in the batched op."""
    return _batched_inputs.has_scales(np.dtype(case.inputs["table"].dtype).name,
                                      case.attrs.get("row_format", "plain"))


def run_batched(batched):
    """The batched op on the cases, laid out as the wrappers lay them out:
    exact [0] weights are left out (unweighted), other weights kept."""
    STATS["op_calls"][batched.op] = STATS["op_calls"].get(batched.op, 0) + 1
    features = []
    for case, bags in zip(batched.cases, batched.bags):
        x = case.inputs
        ids, weights = x["ids"], x["weights"]
        kind = "segment_ids" if bags is None else bags.kind
        if bags is None:
            splits, num_bags = x["segment_ids"], x["num_segments"]
        elif bags.kind == "row_splits":
            splits, num_bags = bags.splits, _batched_inputs.ROWS_OF_BAGS
        else:
            ids, weights = bags.ids, bags.weights
            splits, num_bags = None, bags.num_bags
        features.append(_batched_inputs.Feature(
            table=tf.constant(x["table"]), ids=tf.constant(ids), bag_kind=kind,
            row_format=case.attrs.get("row_format", "plain"),
            dim=case.attrs.get("dim", -1), combiner=case.combiner,
            scales=tf.constant(x["scales"]) if has_scales(case) else None,
            bag_splits=None if splits is None else tf.constant(splits),
            weights=None if weights.shape == (0,) else tf.constant(weights),
            num_bags=(num_bags if isinstance(num_bags, str)
                      else tf.constant(num_bags))))
        STATS["batched_bag_kinds"][kind] = STATS["batched_bag_kinds"].get(kind, 0) + 1
    try:
        return OPS.BatchedFusedDecodeAxpy(**_batched_inputs.layout(features),
                                          num_outputs=len(batched.cases))
    except (tf.errors.OpError, ValueError, TypeError) as e:
        return e


# ------------------------------------------------------------------ driver


def run(case):
    """Calls the raw op; returns its result tensor, or the exception."""
    STATS["op_calls"][case.op] = STATS["op_calls"].get(case.op, 0) + 1
    try:
        args = {name: tf.constant(value)
                for name, value in case.inputs.items()}
        if case.op == "CompressedEmbeddingLookup":
            return OPS.CompressedEmbeddingLookup(**args, **case.attrs)
        return OPS.FusedDecodeAxpy(**args, combiner=case.combiner,
                                   **case.attrs)
    except (tf.errors.OpError, ValueError, TypeError) as e:
        return e


def test_one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    case = fdp.PickValueInList([draw_lookup, draw_pool, draw_batched])(fdp)
    if isinstance(case, BatchedCase):
        outcome = run_batched(case)
        try:
            check_batched(case, outcome)
        except Finding as e:
            raise Finding(f"{e}\n--- outcome: {str(outcome)[:500]}\n"
                          f"{case.describe()}") from None
    else:
        check(case, run(case))
    STATS["runs"] += 1
    write_stats()


def main():
    write_stats(force=True)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

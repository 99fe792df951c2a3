"""Bounded runs of the raw-op fuzzer (tests/fuzz/fuzz_ops.py) on every kernel
row this CPU supports, and checks that the fuzzer's oracle is not vacuous.

Each row runs in its own process for TFCE_FUZZ_SECONDS (default 12) and must
exit 0, run at least MIN_RUNS_PER_SECOND inputs a second (libFuzzer's "Done N
runs"), and have checked both ops, results and errors (the fuzzer's own
counters), so a fuzzer that silently stops checking cannot pass. `pytest -s`
prints each row's runs and seconds.

The oracle tests call the fuzzer's `check` directly: it must accept the op's
real outcomes and flag corrupted results, invalid inputs that "succeed",
errors that do not name the bad input, and valid inputs that fail.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FUZZ_DIR)
import fuzz_ops  # noqa: E402  (needs FUZZ_DIR on the path)

SECONDS = int(os.environ.get("TFCE_FUZZ_SECONDS", "12"))
# This machine does ~1500 runs/s; the floor leaves room for a loaded CI box
# but not for a fuzzer that hangs or stops early.
MIN_RUNS_PER_SECOND = 30
@pytest.mark.parametrize("isa", tfce.supported_isas())
def test_bounded_fuzz_run(isa, tmp_path, record_property):
    stats_path = tmp_path / "stats.json"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    env = {**os.environ, "TFCE_ISA": isa, "TFCE_FUZZ_STATS": str(stats_path)}
    result = subprocess.run(
        [sys.executable, os.path.join(FUZZ_DIR, "fuzz_ops.py"),
         f"-max_total_time={SECONDS}", "-timeout=60",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, env=env, timeout=SECONDS + 300,
        check=False)
    log = result.stderr[-6000:]
    assert result.returncode == 0, f"fuzzer failed on {isa}:\n{log}"
    done = re.search(r"Done (\d+) runs in (\d+) second", result.stderr)
    assert done, f"no libFuzzer summary on {isa}:\n{log}"
    runs, seconds = int(done.group(1)), int(done.group(2))
    stats = json.loads(stats_path.read_text())
    summary = {"isa": isa, "runs": runs, "seconds": seconds,
               **{k: stats[k] for k in ("op_calls", "results_checked",
                                        "errors_checked", "elements_compared",
                                        "results_by_format")}}
    print(f"\nfuzz {json.dumps(summary)}")
    record_property("fuzz", json.dumps(summary))
    assert stats["isa"] == isa
    assert runs >= MIN_RUNS_PER_SECOND * SECONDS, summary
    assert set(stats["op_calls"]) == {"CompressedEmbeddingLookup",
                                      "FusedDecodeAxpy",
                                      "BatchedFusedDecodeAxpy"}, summary
    # The counters lag the run by up to a second: hence the slack. About
    # half the runs are valid calls, half invalid ones.
    assert stats["results_checked"] >= runs // 10, summary
    assert stats["errors_checked"] >= runs // 10, summary
    assert stats["elements_compared"] >= stats["results_checked"], summary
    # Valid calls on tables of every storage format were checked.
    assert set(stats["results_by_format"]) == set(quantization.FORMATS), stats


# ------------------------------------------------------------ the oracle


def attrs_of(fmt, dim=19):
    """The raw ops' table attrs of format fmt ({} for the plain ones)."""
    if fmt in quantization.ROWWISE_FORMATS:
        return {"row_format": quantization.op_row_format(fmt), "dim": dim}
    return {}


def lookup_case(table, scales, ids, attrs=None):
    return fuzz_ops.Case("CompressedEmbeddingLookup",
                         {"table": table, "scales": scales, "ids": ids},
                         attrs=attrs or {})


def pool_case(table, scales, ids, segment_ids, weights, num_segments,
              combiner="sum", attrs=None):
    return fuzz_ops.Case(
        "FusedDecodeAxpy",
        {"table": table, "scales": scales, "ids": ids,
         "segment_ids": segment_ids, "weights": weights,
         "num_segments": num_segments}, combiner, attrs or {})


def table_of(fmt, rows=5, dim=19):
    """(data, scales) of a [rows, dim] table in format fmt."""
    rng = np.random.default_rng(3)
    return quantization.encode(
        rng.standard_normal((rows, dim)).astype(np.float32) + 2, fmt)


def int8_table(rows=5, dim=19):
    return table_of("int8_split", rows, dim)


def valid_cases():
    cases = []
    for fmt in quantization.FORMATS:
        table, scales = table_of(fmt)
        cases.append(lookup_case(table, scales,
                                 np.array([[0, 4], [2, 2]], np.int32),
                                 attrs_of(fmt)))
        for combiner in fuzz_ops.COMBINERS:
            cases.append(pool_case(
                table, scales, np.array([0, 4, 1, 1, 3], np.int64),
                np.array([0, 0, 2, 2, 2], np.int32),
                np.array([0.5, -1.5, 2.0, 0.25, 1.0], np.float32),
                np.int64(4), combiner, attrs_of(fmt)))
    return cases


def invalid_cases():
    """{kind of bad input: (case, shape of a plausible result)}."""
    table, scales = int8_table()
    records, empty = table_of("int8")
    nibbles, _ = table_of("int4")
    ids = np.array([0, 1], np.int64)
    seg = np.array([0, 1], np.int64)
    none = np.zeros([0], np.float32)
    return {
        "uint8 table, plain": (lookup_case(records, empty, ids), (2, 23)),
        "int8 table, rowwise": (
            pool_case(table, none, ids, seg, none, np.int64(2),
                      attrs=attrs_of("int8")), (2, 19)),
        "rowwise dim left out": (
            lookup_case(nibbles, empty, ids, {"row_format": "int4_rowwise"}),
            (2, 19)),
        "plain with a dim": (
            lookup_case(table, scales, ids, {"dim": 19}), (2, 19)),
        "record width of another dim": (
            pool_case(nibbles, empty, ids, seg, none, np.int64(2),
                      attrs=attrs_of("int4", 21)), (2, 21)),
        "int4 records as int8": (
            lookup_case(nibbles, empty, ids, attrs_of("int8")), (2, 19)),
        "rowwise with scales": (
            lookup_case(records, np.ones([5], np.float32), ids,
                        attrs_of("int8")), (2, 19)),
        "id == V": (lookup_case(table, scales, np.array([5], np.int64)),
                    (1, 19)),
        "negative id": (pool_case(table, scales, np.array([0, -1], np.int32),
                                  seg, none, np.int32(2)), (2, 19)),
        "unsorted segment ids": (pool_case(table, scales, ids,
                                           np.array([1, 0], np.int64), none,
                                           np.int64(2)), (2, 19)),
        "segment id >= num_segments": (pool_case(table, scales, ids, seg, none,
                                                 np.int64(1)), (1, 19)),
        "short weights": (pool_case(table, scales, ids, seg,
                                    np.ones([1], np.float32), np.int64(2)),
                          (2, 19)),
        "short scales": (lookup_case(table, scales[:4], ids), (2, 19)),
    }


@pytest.mark.parametrize("case", valid_cases(),
                         ids=lambda c: f"{c.op}-{c.inputs['table'].dtype}-"
                                       f"{c.attrs.get('row_format', 'plain')}-"
                                       f"{c.combiner}")
def test_oracle_accepts_the_ops_result_and_flags_a_corrupted_one(case):
    out = fuzz_ops.run(case)
    fuzz_ops.check(case, out)
    values = out.numpy()
    flat = values.reshape(-1)
    corruptions = [lambda v: v + np.float32(1e-3) * (1 + abs(v)),
                   lambda v: np.float32(np.nan)]
    if case.op == "CompressedEmbeddingLookup":  # checked exactly: 1 ulp
        corruptions.append(lambda v: np.nextafter(v, np.float32(np.inf)))
    for corrupt in corruptions:
        bad = flat.copy()
        i = int(np.argmax(np.abs(flat)))
        bad[i] = corrupt(bad[i])
        with pytest.raises(fuzz_ops.Finding, match="mismatch"):
            fuzz_ops.check(case, tf.constant(bad.reshape(values.shape)))
    with pytest.raises(fuzz_ops.Finding, match="shape"):
        fuzz_ops.check(case, tf.constant(values[..., :-1]))
    if case.attrs.get("row_format") == "int4_rowwise":
        # The bias counted once more (per bag, or per element) is caught.
        bias = np.float32(np.ascontiguousarray(case.inputs["table"][:1, 2:4])
                          .view("<f2")[0, 0])
        with pytest.raises(fuzz_ops.Finding, match="mismatch"):
            fuzz_ops.check(case, tf.constant(values + bias))
    with pytest.raises(fuzz_ops.Finding, match="valid call failed"):
        fuzz_ops.check(case, tf.errors.InvalidArgumentError(
            None, None, "ids[0] = 0 is not in [0, 5)"))


@pytest.mark.parametrize("name", sorted(invalid_cases()))
def test_oracle_flags_an_invalid_input_that_succeeds(name):
    case, shape = invalid_cases()[name]
    outcome = fuzz_ops.run(case)
    assert isinstance(outcome, tf.errors.InvalidArgumentError), outcome
    fuzz_ops.check(case, outcome)
    with pytest.raises(fuzz_ops.Finding, match="invalid"):
        fuzz_ops.check(case, tf.zeros(shape))
    # An error that names another input is not enough.
    with pytest.raises(fuzz_ops.Finding, match="invalid"):
        fuzz_ops.check(case, tf.errors.InvalidArgumentError(
            None, None, "combiner is wrong"))


def test_oracle_flags_a_wrong_dtype_that_succeeds():
    table, scales = int8_table()
    case = lookup_case(table.astype(np.int16), scales,
                       np.array([0], np.int64))
    fuzz_ops.check(case, fuzz_ops.run(case))
    with pytest.raises(fuzz_ops.Finding, match="dtype"):
        fuzz_ops.check(case, tf.zeros((1, 19)))


# ------------------------------ the fuzzer's findings, as regression tests

EMPTY_F32 = np.zeros([0], np.float32)
REPRODUCERS = {
    # ids out of range of a [0, 2**63 - 1] table; the output [2, 2**63 - 1]
    # overflows int64 elements: TF's overflow error named no input.
    "overflow-message": lookup_case(
        np.zeros((0, (1 << 63) - 1), np.int8), EMPTY_F32,
        np.array([0, 0], np.int64)),
    # id 7 of a 3-row table, output [2**58, 2] (2**61 bytes): the output was
    # allocated before the ids were checked, so the error was
    # ResourceExhausted (after 10 s of retries with TF's oneDNN allocator).
    "alloc-before-validation": pool_case(
        np.ones((3, 2), np.int8), np.ones([3], np.float32),
        np.array([7], np.int64), np.array([0], np.int64), EMPTY_F32,
        np.int64(1 << 58)),
    # w * scale = 1e20 * 1e20 overflows float32: the SIMD rows gave NaN for
    # q == 0 (Inf * 0), the reference 1e20 * (0 * 1e20) = 0; now every row
    # folds the weight into the scale.
    "folded-scale-overflow": pool_case(
        np.array([[0, 1]], np.int8), np.array([1e20], np.float32),
        np.array([0], np.int64), np.array([0], np.int64),
        np.array([1e20], np.float32), np.int64(1)),
    # The same with the scale inline (int8 records; int4, whose float16
    # scale needs a larger weight to overflow, and whose bias adds on).
    "folded-scale-overflow-int8-rowwise": pool_case(
        np.array([list(np.float32(1e20).tobytes()) + [0, 1]], np.uint8),
        EMPTY_F32, np.array([0], np.int64), np.array([0], np.int64),
        np.array([1e20], np.float32), np.int64(1),
        attrs={"row_format": "int8_rowwise", "dim": 2}),
    "folded-scale-overflow-int4-rowwise": pool_case(
        np.array([list(np.array([65504, 1], "<f2").tobytes()) + [0x10]],
                 np.uint8),
        EMPTY_F32, np.array([0], np.int64), np.array([0], np.int64),
        np.array([1e35], np.float32), np.int64(1),
        attrs={"row_format": "int4_rowwise", "dim": 2}),
}


@pytest.mark.parametrize("tag", sorted(REPRODUCERS))
def test_fuzzer_finding_stays_fixed(tag):
    case = REPRODUCERS[tag]
    fuzz_ops.check(case, fuzz_ops.run(case))  # raises Finding on a regression


BATCHED_REPRODUCERS = {
    # Feature 0 ([2**63 - 1, 1] output) has an id past its table, and
    # feature 1's output pushed the sum of output elements past int64: the
    # overflow error named no feature, before the bad id was seen.
    "sum-of-outputs-overflow": fuzz_ops.BatchedCase([
        pool_case(np.ones((1, 1), np.int8), np.ones([1], np.float32),
                  np.array([0, 2], np.int64), np.array([0, 0], np.int64),
                  EMPTY_F32, np.int64((1 << 63) - 1)),
        pool_case(np.ones((3, 13), np.int8), np.ones([3], np.float32),
                  np.array([1], np.int64), np.array([1], np.int64),
                  EMPTY_F32, np.int64(9))], [None, None]),
}


@pytest.mark.parametrize("tag", sorted(BATCHED_REPRODUCERS))
def test_batched_fuzzer_finding_stays_fixed(tag):
    batched = BATCHED_REPRODUCERS[tag]
    fuzz_ops.check_batched(batched, fuzz_ops.run_batched(batched))


FOLDED_SCALE_CHILD = """
import json, sys
import numpy as np, tensorflow as tf
from tf_compressed_embedding import _loader
case = json.loads(sys.argv[1])
table = np.frombuffer(bytes.fromhex(case["table"]), case["dtype"]).reshape(1, -1)
out = _loader.ops().FusedDecodeAxpy(
    table=table, scales=np.array(case["scales"], np.float32),
    ids=tf.constant([0], tf.int64), segment_ids=tf.constant([0], tf.int64),
    weights=np.array(case["weights"], np.float32),
    num_segments=tf.constant(1, tf.int64), combiner="sum", **case["attrs"])
print(out.numpy().tobytes().hex())
"""


@pytest.mark.parametrize("tag", ["folded-scale-overflow",
                                 "folded-scale-overflow-int8-rowwise",
                                 "folded-scale-overflow-int4-rowwise"])
def test_folded_scale_overflow_is_the_same_on_every_row(tag):
    """The folded-scale cases give the same bits on every kernel row (the
    in-process test above sees only the active one)."""
    case = REPRODUCERS[tag]
    table = case.inputs["table"]
    arg = json.dumps({"table": table.tobytes().hex(), "dtype": table.dtype.name,
                      "scales": case.inputs["scales"].tolist(),
                      "weights": case.inputs["weights"].tolist(),
                      "attrs": case.attrs})
    results = set()
    for isa in tfce.supported_isas():
        done = subprocess.run(
            [sys.executable, "-c", FOLDED_SCALE_CHILD, arg],
            capture_output=True, text=True,
            env={**os.environ, "TFCE_ISA": isa}, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        results.add(done.stdout.strip().splitlines()[-1])
    assert len(results) == 1, results

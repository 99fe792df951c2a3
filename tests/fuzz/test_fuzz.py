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
                                        "errors_checked", "elements_compared")}}
    print(f"\nfuzz {json.dumps(summary)}")
    record_property("fuzz", json.dumps(summary))
    assert stats["isa"] == isa
    assert runs >= MIN_RUNS_PER_SECOND * SECONDS, summary
    assert set(stats["op_calls"]) == {"CompressedEmbeddingLookup",
                                      "FusedDecodeAxpy"}, summary
    # The counters lag the run by up to a second: hence the slack. About
    # half the runs are valid calls, half invalid ones.
    assert stats["results_checked"] >= runs // 10, summary
    assert stats["errors_checked"] >= runs // 10, summary
    assert stats["elements_compared"] >= stats["results_checked"], summary


# ------------------------------------------------------------ the oracle


def lookup_case(table, scales, ids):
    return fuzz_ops.Case("CompressedEmbeddingLookup",
                         {"table": table, "scales": scales, "ids": ids})


def pool_case(table, scales, ids, segment_ids, weights, num_segments,
              combiner="sum"):
    return fuzz_ops.Case(
        "FusedDecodeAxpy",
        {"table": table, "scales": scales, "ids": ids,
         "segment_ids": segment_ids, "weights": weights,
         "num_segments": num_segments}, combiner)


def int8_table(rows=5, dim=19):
    rng = np.random.default_rng(3)
    return tfce.quantization.encode(
        rng.standard_normal((rows, dim)).astype(np.float32), "int8")


def fp16_table(rows=5, dim=19):
    rng = np.random.default_rng(4)
    return tfce.quantization.encode(
        rng.standard_normal((rows, dim)).astype(np.float32), "fp16")


def valid_cases():
    cases = []
    for table, scales in (int8_table(), fp16_table()):
        cases.append(lookup_case(table, scales,
                                 np.array([[0, 4], [2, 2]], np.int32)))
        for combiner in fuzz_ops.COMBINERS:
            cases.append(pool_case(
                table, scales, np.array([0, 4, 1, 1, 3], np.int64),
                np.array([0, 0, 2, 2, 2], np.int32),
                np.array([0.5, -1.5, 2.0, 0.25, 1.0], np.float32),
                np.int64(4), combiner))
    return cases


def invalid_cases():
    """{kind of bad input: (case, shape of a plausible result)}."""
    table, scales = int8_table()
    ids = np.array([0, 1], np.int64)
    seg = np.array([0, 1], np.int64)
    none = np.zeros([0], np.float32)
    return {
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
}


@pytest.mark.parametrize("tag", sorted(REPRODUCERS))
def test_fuzzer_finding_stays_fixed(tag):
    case = REPRODUCERS[tag]
    fuzz_ops.check(case, fuzz_ops.run(case))  # raises Finding on a regression


def test_folded_scale_overflow_is_the_same_on_every_row():
    """The folded-scale case gives the same bits on every kernel row (the
    in-process test above sees only the active one)."""
    results = set()
    for isa in tfce.supported_isas():
        code = ("import numpy as np, tensorflow as tf\n"
                "from tf_compressed_embedding import _loader\n"
                "out = _loader.ops().FusedDecodeAxpy(\n"
                "    table=tf.constant([[0, 1]], tf.int8), scales=[1e20],\n"
                "    ids=tf.constant([0], tf.int64), segment_ids=tf.constant([0], tf.int64),\n"
                "    weights=[1e20], num_segments=tf.constant(1, tf.int64), combiner='sum')\n"
                "print(out.numpy().tobytes().hex())\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "TFCE_ISA": isa}, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        results.add(done.stdout.strip().splitlines()[-1])
    assert len(results) == 1, results

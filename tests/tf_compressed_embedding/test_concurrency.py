"""Many threads (8x the cores) calling the three ops and one loaded SavedModel at
once, as a server's request threads do, on every kernel row: results are
identical to a single-threaded run, errors stay errors, nothing crashes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import reference
import tf_compressed_embedding as tfce
from test_savedmodel import Recommender
from tf_compressed_embedding.ops import _with_max_threads
from repo_paths import SUPPORT

THREADS = 8 * (os.cpu_count() or 2)
CALLS_PER_THREAD = 200


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    rng = np.random.default_rng(5)
    model = Recommender(tfce.quantize(reference.random_table(rng, 300, 12), "int4"),
                        tfce.quantize(reference.random_table(rng, 500, 12), "int8"))
    path = str(tmp_path_factory.mktemp("concurrency") / "model")
    tf.saved_model.save(model, path, signatures={"serving_default": model.pooled})
    return path


# Every kernel row as the ops run by default, and the best row with every
# call split over the intra-op pool (one thread per core, chunks of a few
# ids), so that concurrent calls race on the pool threads standing by.
@pytest.mark.parametrize("isa,split", [(isa, "default") for isa in tfce.supported_isas()]
                         + [(tfce.active_isa(), "always")])
def test_threads_give_single_threaded_results(saved_model, isa, split):
    env = {**os.environ, "TFCE_ISA": isa}
    if split == "always":
        env["TFCE_MIN_PARALLEL_COST"] = "0"
    result = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "concurrency_worker.py"), saved_model,
         str(THREADS), str(CALLS_PER_THREAD)],
        capture_output=True, text=True, timeout=900, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(report)
    assert report["isa"] == isa
    assert report["unexpected"] == []
    assert report["mismatches"] == 0
    assert report["op_calls"] == THREADS * CALLS_PER_THREAD
    assert report["model_calls"] == THREADS * ((CALLS_PER_THREAD + 3) // 4)
    assert report["error_calls"] == THREADS * ((CALLS_PER_THREAD + 15) // 16)


SPLIT_CHILD = r"""
import os
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization
from tf_compressed_embedding.ops import _with_max_threads
rng = np.random.default_rng(5)
table = rng.standard_normal((5000, 12)).astype(np.float32)
ids = rng.integers(0, 5000, 512 * 80)
segment_ids = np.repeat(np.arange(512), 80)
weights = rng.uniform(0.5, 1.5, ids.size).astype(np.float32)
cap = os.environ.get("TFCE_TEST_MAX_THREADS")

def run(ct):
    @tf.function
    def both():
        pooled = tfce.fused_decode_axpy(ct, ids, segment_ids, weights, "mean")
        looked_up = tfce.compressed_embedding_lookup(ct, ids)
        if cap is not None:
            pooled = _with_max_threads(pooled, int(cap))
            looked_up = _with_max_threads(looked_up, int(cap))
        return pooled, looked_up
    return both()

results = []
for fmt in quantization.FORMATS:
    pooled, looked_up = run(tfce.quantize(table, fmt))
    results += [pooled.numpy().ravel(), looked_up.numpy().ravel()]
np.save(sys.argv[2], np.concatenate(results))
"""


@pytest.mark.parametrize("env", [
    {},  # the defaults: the batch is large enough to split
    {"TFCE_MIN_PARALLEL_COST": "0"},  # every call splits, smallest chunks
    {"TFCE_STANDBY_US": "0"},  # pool threads never wait for the next call
    {"TFCE_STANDBY_US": "100000"},  # they always do
    # every call would split, but the node caps its threads (the results
    # must not change; that the cap holds is not observable from here)
    {"TFCE_MIN_PARALLEL_COST": "0", "TFCE_TEST_MAX_THREADS": "1"},
    {"TFCE_MIN_PARALLEL_COST": "0", "TFCE_TEST_MAX_THREADS": "2"},
], ids=["default", "always-split", "no-standby", "long-standby", "max-1-thread",
        "max-2-threads"])
def test_results_do_not_depend_on_intra_op_threads(tmp_path, env):
    # Each bag (pooling) and each id (lookup) is computed by one thread, so
    # however the chunks fall to threads the bits are the same.
    results = []
    for threads in (1, 2, 3):
        path = str(tmp_path / f"threads{threads}.npy")
        run = subprocess.run([sys.executable, "-c", SPLIT_CHILD, str(threads),
                              path], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        results.append(np.load(path))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)


@pytest.mark.parametrize("op", ["fused_decode_axpy", "compressed_embedding_lookup"])
def test_negative_thread_cap_is_a_clear_error(op):
    ct = tfce.quantize(np.ones((10, 4), np.float32), "int8")

    @tf.function
    def run():
        if op == "fused_decode_axpy":
            out = tfce.fused_decode_axpy(ct, [1, 2], [0, 1], None, "sum")
        else:
            out = tfce.compressed_embedding_lookup(ct, [1, 2])
        return _with_max_threads(out, -1)

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"_tfce_max_threads must be >= 0 .*got -1"):
        run()

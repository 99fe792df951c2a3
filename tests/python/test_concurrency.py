"""Many threads (8x the cores) calling both ops and one loaded SavedModel at
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

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS = 8 * (os.cpu_count() or 2)
CALLS_PER_THREAD = 200


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    rng = np.random.default_rng(5)
    model = Recommender(tfce.quantize(reference.random_table(rng, 300, 12), "int8"),
                        tfce.quantize(reference.random_table(rng, 500, 12), "fp16"))
    path = str(tmp_path_factory.mktemp("concurrency") / "model")
    tf.saved_model.save(model, path, signatures={"serving_default": model.pooled})
    return path


@pytest.mark.parametrize("isa", tfce.supported_isas())
def test_threads_give_single_threaded_results(saved_model, isa):
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "concurrency_worker.py"), saved_model,
         str(THREADS), str(CALLS_PER_THREAD)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "TFCE_ISA": isa}, check=False)
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
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tf_compressed_embedding as tfce
rng = np.random.default_rng(5)
ct = tfce.quantize(rng.standard_normal((5000, 12)).astype(np.float32), "int8")
ids = rng.integers(0, 5000, 512 * 80)
segment_ids = np.repeat(np.arange(512), 80)
weights = rng.uniform(0.5, 1.5, ids.size).astype(np.float32)
pooled = tfce.fused_decode_axpy(ct, ids, segment_ids, weights, "mean").numpy()
looked_up = tfce.compressed_embedding_lookup(ct, ids).numpy()
np.save(sys.argv[2], np.concatenate([pooled.ravel(), looked_up.ravel()]))
"""


def test_results_do_not_depend_on_intra_op_threads(tmp_path):
    # Large enough for both ops to split the batch over the intra-op pool
    # (one block per thread): a bag is never split, so the bits are the same.
    results = []
    for threads in (1, 2, 3):
        path = str(tmp_path / f"threads{threads}.npy")
        run = subprocess.run([sys.executable, "-c", SPLIT_CHILD, str(threads),
                              path], capture_output=True, text=True,
                             timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        results.append(np.load(path))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)

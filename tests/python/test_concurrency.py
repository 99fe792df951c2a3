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

"""Run by test_concurrency.py in a fresh process (so the threads also race
on the library's first use): many threads call the ops and one loaded
SavedModel at once; every result must equal the single-threaded one, bit
for bit, and bad ids must fail the same way on every thread.

Usage: python concurrency_worker.py SAVED_MODEL THREADS CALLS_PER_THREAD
Prints one JSON line: {"isa", "threads", "op_calls", "model_calls",
"error_calls", "mismatches", "unexpected"}.
"""
import json
import sys
import threading

import numpy as np
import tensorflow as tf

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization


def cases(rng):
    """(name, function) pairs, each function deterministic in its inputs."""
    out = []
    tables, bags, bag_weights = [], [], []
    for fmt in quantization.FORMATS:
        for dim in (1, 12, 33, 64):
            ct = tfce.quantize(rng.standard_normal((997, dim)).astype(np.float32), fmt)
            ids = tf.constant(rng.integers(0, 997, size=300), tf.int64)
            segments = tf.constant(np.sort(rng.integers(0, 40, size=300)), tf.int64)
            weights = tf.constant(rng.standard_normal(300).astype(np.float32))
            ragged = tf.RaggedTensor.from_value_rowids(ids, segments, nrows=40)
            ragged_weights = tf.RaggedTensor.from_value_rowids(weights, segments,
                                                               nrows=40)
            tables.append(ct)
            # Half the features sparse, half ragged: both bag kinds.
            sparse = len(tables) % 2 == 0
            bags.append(ragged.to_sparse() if sparse else ragged)
            bag_weights.append(ragged_weights.to_sparse() if sparse
                               else ragged_weights)
            out.append((f"lookup/{fmt}/{dim}",
                        lambda ct=ct, ids=ids: tfce.compressed_embedding_lookup(ct, ids)))
            for combiner in ("sum", "mean", "sqrtn"):
                out.append((f"pool/{fmt}/{dim}/{combiner}",
                            lambda ct=ct, i=ids, s=segments, w=weights, c=combiner:
                            tfce.fused_decode_axpy(ct, i, s, w, c, num_segments=40)))
    # Every table in one batched call, its features' bags over the threads.
    out.append(("batched/concat", lambda: tfce.batched_embedding_lookup_sparse(
        tables, bags, bag_weights, combiners="sqrtn", concat=True)))
    out.append(("batched/apart", lambda: tf.concat(
        tfce.batched_embedding_lookup_sparse(tables, bags, combiners="mean"), 1)))
    return out


def main(path, threads, calls):
    rng = np.random.default_rng(3)
    model = tf.saved_model.load(path)
    model_inputs = {
        "ids": tf.constant(rng.integers(0, 300, size=500), tf.int64),
        "segment_ids": tf.constant(np.sort(rng.integers(0, 64, size=500)), tf.int64),
        "weights": tf.constant(rng.random(500).astype(np.float32)),
        "num_segments": tf.constant(64, tf.int64)}
    serve = model.signatures["serving_default"]
    op_cases = cases(rng)
    bad_ct = tfce.quantize(np.ones((10, 4), np.float32), "int8")
    barrier = threading.Barrier(threads)
    expected = {}
    results = {"op_calls": 0, "model_calls": 0, "error_calls": 0,
               "mismatches": 0, "unexpected": []}
    lock = threading.Lock()

    def check(name, value):
        value = value.numpy() if hasattr(value, "numpy") else value
        with lock:
            if name not in expected:  # the first result is the reference...
                expected[name] = value
            elif not np.array_equal(expected[name], value):
                results["mismatches"] += 1

    def worker(index):
        local = {"op_calls": 0, "model_calls": 0, "error_calls": 0}
        barrier.wait()  # all threads make their first call together
        try:
            for call in range(calls):
                name, fn = op_cases[(index + call) % len(op_cases)]
                check(name, fn())
                local["op_calls"] += 1
                if call % 4 == 0:
                    check("model", serve(**model_inputs)["pooled"])
                    local["model_calls"] += 1
                if call % 16 == 0:
                    try:
                        tfce.compressed_embedding_lookup(bad_ct, [3, 10])
                    except tf.errors.InvalidArgumentError as e:
                        check("error", np.frombuffer(e.message.encode(), np.uint8))
                        local["error_calls"] += 1
        except Exception as e:  # noqa: BLE001 - reported, and fails the test
            with lock:
                results["unexpected"].append(repr(e)[:500])
        with lock:
            for key, count in local.items():
                results[key] += count

    # ...and is itself compared with a single-threaded run afterwards.
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    threaded = dict(expected)
    expected.clear()
    for name, fn in op_cases:
        check(name, fn())
    check("model", serve(**model_inputs)["pooled"])
    for name in expected:
        if not np.array_equal(expected[name], threaded.get(name)):
            results["mismatches"] += 1
    print(json.dumps({"isa": tfce.active_isa(), "threads": threads, **results}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))

"""A module using compressed tables survives tf.saved_model save + load in a
fresh process, with identical outputs and the tables stored as variables."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization


class Recommender(tf.Module):
    """Two tables of any formats: `user` is looked up and pooled, `item`
    pooled by the sparse API."""

    def __init__(self, user, item):
        super().__init__()
        self.user = user
        self.item = item

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int64, name="user_id"),
        tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)])
    def score(self, user_id, item_ids):
        user = tfce.compressed_embedding_lookup(self.user, user_id)
        items = tfce.embedding_lookup_sparse(self.item, item_ids,
                                             combiner="mean")
        return tf.reduce_sum(user * items, axis=1)

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int64, name="ids"),
        tf.TensorSpec([None], tf.int64, name="segment_ids"),
        tf.TensorSpec([None], tf.float32, name="weights"),
        tf.TensorSpec([], tf.int64, name="num_segments")])
    def pooled(self, ids, segment_ids, weights, num_segments):
        return {"pooled": tfce.fused_decode_axpy(
            self.user, ids, segment_ids, weights, "sqrtn", num_segments)}


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_compressed_embedding  # registers the ops
    model = tf.saved_model.load(sys.argv[1])
    inputs = json.loads(sys.argv[2])
    items = tf.ragged.constant(inputs["items"], dtype=tf.int64)
    score = model.score(tf.constant(inputs["users"], tf.int64), items)
    pooled = model.signatures["serving_default"](
        ids=tf.constant(inputs["ids"], tf.int64),
        segment_ids=tf.constant(inputs["segs"], tf.int64),
        weights=tf.constant(inputs["w"], tf.float32),
        num_segments=tf.constant(3, tf.int64))["pooled"]
    print(json.dumps({"score": score.numpy().tolist(),
                      "pooled": pooled.numpy().tolist()}))
""")


class SavedModelTest(tf.test.TestCase, parameterized.TestCase):

    # Every format in both roles (int4 of an odd dim: its records do not
    # give it, the saved node's dim attr does).
    @parameterized.parameters(("int8", "fp16"), ("int4", "int8_split"),
                              ("fp16", "int4"), ("int8_split", "int8"))
    def test_round_trip_in_fresh_process(self, user_fmt, item_fmt):
        rng = np.random.default_rng(41)
        dim = 15
        model = Recommender(
            tfce.quantize(reference.random_table(rng, 300, dim), user_fmt),
            tfce.quantize(reference.random_table(rng, 500, dim), item_fmt))
        path = os.path.join(self.get_temp_dir(), "model")
        tf.saved_model.save(model, path, signatures={
            "serving_default": model.pooled})

        inputs = {"users": [0, 299, 7], "items": [[1, 2, 499], [], [5]],
                  "ids": [3, 4, 5, 299], "segs": [0, 0, 2, 2],
                  "w": [0.5, 1.0, 2.0, 1.5]}
        result = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT, path, json.dumps(inputs)],
            capture_output=True, text=True, timeout=300, check=False)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        loaded = json.loads(result.stdout.strip().splitlines()[-1])

        score = model.score(tf.constant(inputs["users"], tf.int64),
                            tf.ragged.constant(inputs["items"], tf.int64))
        pooled = model.pooled(tf.constant(inputs["ids"], tf.int64),
                              tf.constant(inputs["segs"], tf.int64),
                              tf.constant(inputs["w"]),
                              tf.constant(3, tf.int64))["pooled"]
        self.assertAllEqual(loaded["score"], score)
        self.assertAllEqual(loaded["pooled"], pooled)
        self.assertEqual(np.shape(loaded["pooled"]), (3, dim))
        # And both are the reference's, within the pooling bound.
        want, bound = reference.pool_table(
            model.user, inputs["ids"], inputs["segs"], inputs["w"], "sqrtn", 3)
        self.assertTrue(np.all(np.abs(np.array(loaded["pooled"]) - want)
                               <= bound))

        # Tables are stored compressed, as checkpoint variables: each
        # table's data in its format's dtype and layout.
        reader = tf.train.load_checkpoint(os.path.join(path, "variables",
                                                       "variables"))
        dtypes = reader.get_variable_to_dtype_map()
        shapes = reader.get_variable_to_shape_map()
        stored = sorted((dtypes[k].name, tuple(shapes[k])) for k in dtypes
                        if dtypes[k] in (tf.int8, tf.uint8, tf.float16))
        want_stored = sorted(
            (tf.as_dtype(quantization.storage_dtype(fmt)).name,
             quantization.data_shape(fmt, rows, dim))
            for fmt, rows in ((user_fmt, 300), (item_fmt, 500)))
        self.assertEqual(stored, want_stored)
        # No float32 table (only int8_split's scales are float32).
        self.assertEqual(
            sorted(tuple(shapes[k]) for k in dtypes if dtypes[k] == tf.float32
                   and shapes[k] != [0]),
            sorted((rows,) for fmt, rows in ((user_fmt, 300), (item_fmt, 500))
                   if fmt == "int8_split"))


if __name__ == "__main__":
    tf.test.main()

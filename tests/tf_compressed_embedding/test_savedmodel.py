"""A module using compressed tables survives tf.saved_model save + load in a
fresh process, with identical outputs and the tables stored as variables."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf

import reference
import tf_compressed_embedding as tfce


class Recommender(tf.Module):
    def __init__(self, table_int8, table_fp16):
        super().__init__()
        self.user = table_int8
        self.item = table_fp16

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


class SavedModelTest(tf.test.TestCase):

    def test_round_trip_in_fresh_process(self):
        rng = np.random.default_rng(41)
        model = Recommender(
            tfce.quantize(reference.random_table(rng, 300, 16), "int8"),
            tfce.quantize(reference.random_table(rng, 500, 16), "fp16"))
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

        # Tables are stored compressed, as checkpoint variables.
        reader = tf.train.load_checkpoint(os.path.join(path, "variables",
                                                       "variables"))
        dtypes = reader.get_variable_to_dtype_map()
        self.assertCountEqual(
            [d for d in dtypes.values() if d in (tf.int8, tf.float16)],
            [tf.int8, tf.float16])
        self.assertNotIn(tf.float32, [
            d for k, d in dtypes.items()
            if reader.get_variable_to_shape_map()[k][-1:] == [16]])


if __name__ == "__main__":
    tf.test.main()

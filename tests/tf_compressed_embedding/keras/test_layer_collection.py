"""CompressedEmbeddingCollection and quantize_embeddings(batch=True): pooled
layers that feed one Concatenate become one BatchedFusedDecodeAxpy call,
with the outputs of the layers it replaces (quantize_embeddings with
batch=False), bit for bit."""
import os

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tf_compressed_embedding.layers import (CompressedEmbedding,
                                            CompressedEmbeddingCollection,
                                            quantize_embeddings)

B, L = 6, 5


def pooled_model(seed=0):
    """Five pooled embeddings and a dense input, concatenated as
    [a, b, dense, c, d, e] (two runs of pooled layers), then a Dense head.
    Layer c is weighted, d ragged-free padded ids with mask_zero."""
    inputs = {name: keras.Input(shape=(L,), dtype="int64", name=name)
              for name in "abcde"}
    inputs["c_weights"] = keras.Input(shape=(L,), name="c_weights")
    inputs["dense"] = keras.Input(shape=(3,), name="dense")
    layers = {
        "a": CompressedEmbedding(40, 8, combiner="mean", name="emb_a"),
        "b": CompressedEmbedding(30, 4, combiner="sum", name="emb_b"),
        "c": CompressedEmbedding(20, 6, combiner="sqrtn", name="emb_c"),
        "d": CompressedEmbedding(25, 5, combiner="mean", mask_zero=True,
                                 name="emb_d"),
        "e": CompressedEmbedding(50, 3, combiner="sum", name="emb_e"),
    }
    pooled = {k: layers[k](inputs[k]) for k in "abde"}
    pooled["c"] = layers["c"](inputs["c"], weights=inputs["c_weights"])
    x = keras.layers.Concatenate(name="features")(
        [pooled["a"], pooled["b"], inputs["dense"], pooled["c"], pooled["d"],
         pooled["e"]])
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(x))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def feed(seed=1):
    rng = np.random.default_rng(seed)
    rows = {"a": 40, "b": 30, "c": 20, "d": 25, "e": 50}
    x = {k: rng.integers(-v, v, size=(B, L)) for k, v in rows.items()}
    x["d"] = rng.integers(0, 25, size=(B, L))
    x["d"][1] = 0  # an all-padding row (mask_zero): a zero bag
    x["c_weights"] = rng.uniform(0.5, 2, (B, L)).astype(np.float32)
    x["dense"] = rng.standard_normal((B, 3)).astype(np.float32)
    return x


def op_counts(model, x):
    @tf.function
    def run(x):
        return model(x)

    graph = run.get_concrete_function(
        {k: tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for k, v in x.items()}).graph
    types = [op.type for op in graph.get_operations()]
    return types.count("BatchedFusedDecodeAxpy"), types.count("FusedDecodeAxpy")


class CollectionTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.parameters("int8", "int4", "fp16", "int8_split")
    def test_quantize_embeddings_batches_the_concatenated_layers(self, mode):
        model, x = pooled_model(), feed()
        apart = quantize_embeddings(model, mode, batch=False)
        together = quantize_embeddings(model, mode)
        collections = [layer for layer in together.layers
                       if isinstance(layer, CompressedEmbeddingCollection)]
        self.assertEqual([[e.name for e in c.embeddings] for c in collections],
                         [["emb_a", "emb_b"], ["emb_c", "emb_d", "emb_e"]])
        self.assertFalse(any(isinstance(layer, CompressedEmbedding)
                             for layer in together.layers))
        self.assertEqual(op_counts(together, x), (2, 0))
        self.assertEqual(op_counts(apart, x), (0, 5))
        self.assertAllEqual(together(x), apart(x))
        # And the pooled features themselves, against the layers one by one.
        features = together.get_layer("features")
        probe = keras.Model(together.inputs, features.output)
        want = keras.Model(apart.inputs, apart.get_layer("features").output)
        self.assertAllEqual(probe(x), want(x))

    def test_saves_and_loads_as_a_keras_file(self):
        model, x = pooled_model(), feed()
        together = quantize_embeddings(model, "int8")
        path = os.path.join(self.get_temp_dir(), "model.keras")
        together.save(path)
        loaded = keras.models.load_model(path)
        self.assertEqual(op_counts(loaded, x), (2, 0))
        self.assertAllEqual(loaded(x), together(x))

    def test_a_lone_pooled_layer_and_float_layers_are_left_alone(self):
        ids = keras.Input(shape=(L,), dtype="int64", name="ids")
        other = keras.Input(shape=(L,), dtype="int64", name="other")
        a = CompressedEmbedding(40, 8, combiner="mean", name="emb_a")(ids)
        b = CompressedEmbedding(9, 4, combiner="sum", name="small")(other)
        model = keras.Model([ids, other], keras.layers.Concatenate()([a, b]))
        model.set_weights([np.ones(w.shape, np.float32) for w in model.get_weights()])
        # "small" stays float32 (min_rows): one quantized pooled layer, no run.
        converted = quantize_embeddings(model, "int8", min_rows=10)
        self.assertFalse(any(isinstance(layer, CompressedEmbeddingCollection)
                             for layer in converted.layers))
        self.assertEqual(converted.get_layer("emb_a").quantization_mode, "int8")

    def test_collection_arguments(self):
        pooled = CompressedEmbedding(10, 4, combiner="sum")
        pooled.build()
        pooled.quantize("int8")
        unpooled = CompressedEmbedding(10, 4)
        unpooled.build()
        unpooled.quantize("int8")
        float32 = CompressedEmbedding(10, 4, combiner="sum")
        with self.assertRaisesRegex(ValueError, "needs two or more layers, got 1"):
            CompressedEmbeddingCollection([pooled])
        for bad in (unpooled, float32, keras.layers.Dense(2)):
            with self.assertRaisesRegex(ValueError, "must be a quantized "
                                                    "CompressedEmbedding with a "
                                                    "combiner"):
                CompressedEmbeddingCollection([pooled, bad])
        collection = CompressedEmbeddingCollection([pooled, pooled], name="both")
        with self.assertRaisesRegex(ValueError, r"layer 'both': inputs must hold "
                                                r"one ids tensor per layer \(2\), "
                                                r"got 1"):
            collection([np.zeros((2, 3), np.int64)])
        with self.assertRaisesRegex(ValueError, r"weights must hold one entry "
                                                r"per layer \(2\), got 3"):
            collection([np.zeros((2, 3), np.int64)] * 2, weights=[None] * 3)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"feature 1 \('.*'\): ids\[.*\] = 12 .*is not "
                                    r"in \[0, 10\)"):
            collection([np.zeros((2, 3), np.int64), np.full((2, 3), 12)])

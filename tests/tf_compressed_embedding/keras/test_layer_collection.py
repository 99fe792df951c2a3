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
    return with_head(inputs, x, seed)


def with_head(inputs, features, seed):
    """The model of ``features`` under a Dense head, all weights random."""
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(features))
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


class NonzeroIds(keras.layers.Layer):
    """Passes ids on with the Keras mask ``ids != 0``: an upstream mask that
    Keras hands to the next layer's ``mask`` argument by itself."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, ids):
        return ids

    def compute_mask(self, ids, mask=None):
        return keras.ops.not_equal(ids, 0)


def masked_model(seed=0):
    """Six pooled embeddings concatenated as [a, b, m, n, c, d]: m gets a
    mask from an upstream layer, n an explicit ``mask`` argument (neither
    has mask_zero, so only the mask drops their 0 ids)."""
    inputs = {name: keras.Input(shape=(L,), dtype="int64", name=name)
              for name in "abmncd"}
    pooled = [
        CompressedEmbedding(40, 8, combiner="mean", name="emb_a")(inputs["a"]),
        CompressedEmbedding(30, 4, combiner="sum", name="emb_b")(inputs["b"]),
        CompressedEmbedding(20, 6, combiner="mean", name="emb_m")(
            NonzeroIds(name="nonzero_m")(inputs["m"])),
        CompressedEmbedding(25, 5, combiner="sum", name="emb_n")(
            inputs["n"], mask=keras.ops.not_equal(inputs["n"], 0)),
        CompressedEmbedding(35, 3, combiner="sqrtn", name="emb_c")(inputs["c"]),
        CompressedEmbedding(15, 2, combiner="sum", name="emb_d")(inputs["d"]),
    ]
    x = keras.layers.Concatenate(name="features")(pooled)
    return with_head(inputs, x, seed)


def masked_feed(seed=1):
    rng = np.random.default_rng(seed)
    rows = {"a": 40, "b": 30, "m": 20, "n": 25, "c": 35, "d": 15}
    x = {k: rng.integers(1, v, size=(B, L)) for k, v in rows.items()}
    for k in "mn":  # padding the masks drop; row 1 is all padding
        x[k][:, 3:] = 0
        x[k][1] = 0
    return x


def op_counts(model, x):
    @tf.function
    def run(x):
        return model(x)

    graph = run.get_concrete_function(
        {k: tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for k, v in x.items()}).graph
    types = [op.type for op in graph.get_operations()]
    return types.count("BatchedFusedDecodeAxpy"), types.count("FusedDecodeAxpy")


def collection_names(model):
    """The layer names each CompressedEmbeddingCollection of ``model``
    batches, in order."""
    return [[e.name for e in layer.embeddings] for layer in model.layers
            if isinstance(layer, CompressedEmbeddingCollection)]


class CollectionTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.parameters("int8", "int4", "fp16", "int8_split")
    def test_quantize_embeddings_batches_the_concatenated_layers(self, mode):
        model, x = pooled_model(), feed()
        apart = quantize_embeddings(model, mode, batch=False)
        together = quantize_embeddings(model, mode)
        self.assertEqual(collection_names(together),
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

    @parameterized.parameters("int8", "int4")
    def test_nested_functional_model_is_batched_inside(self, mode):
        # clone_model(recursive=True) clones the sub-model with the same
        # call_function: its Concatenate is batched inside it, and the
        # outer model's own run separately.
        sub = pooled_model()
        inputs = {name: keras.Input(shape=t.shape[1:], dtype=t.dtype, name=name)
                  for name, t in sub.input.items()}
        for name in "fg":
            inputs[name] = keras.Input(shape=(L,), dtype="int64", name=name)
        f = CompressedEmbedding(45, 3, combiner="mean", name="emb_f")(inputs["f"])
        g = CompressedEmbedding(35, 2, combiner="sum", name="emb_g")(inputs["g"])
        x = keras.layers.Concatenate(name="outer_features")(
            [sub({k: inputs[k] for k in sub.input}), f, g])
        model = keras.Model(inputs, keras.layers.Dense(1, name="top")(x))
        rng = np.random.default_rng(2)
        for layer in (model.get_layer("emb_f"), model.get_layer("emb_g"),
                      model.get_layer("top")):
            layer.set_weights([rng.standard_normal(w.shape).astype(np.float32)
                               for w in layer.get_weights()])
        x = feed()
        x["f"] = rng.integers(-45, 45, size=(B, L))
        x["g"] = rng.integers(-35, 35, size=(B, L))

        apart = quantize_embeddings(model, mode, batch=False)
        together = quantize_embeddings(model, mode)

        inner = [layer for layer in together.layers
                 if isinstance(layer, keras.Model)]
        self.assertLen(inner, 1)
        self.assertEqual(collection_names(inner[0]),
                         [["emb_a", "emb_b"], ["emb_c", "emb_d", "emb_e"]])
        self.assertEqual(collection_names(together), [["emb_f", "emb_g"]])
        for m in (together, inner[0]):
            self.assertFalse(any(isinstance(layer, CompressedEmbedding)
                                 for layer in m.layers))
        self.assertEqual(op_counts(together, x), (3, 0))
        self.assertEqual(op_counts(apart, x), (0, 7))
        self.assertAllEqual(together(x), apart(x))
        # The dense layers inside and outside the sub-model kept their
        # trained weights (equal outputs alone would not show it).
        for got, want in ((inner[0].get_layer("head"), sub.get_layer("head")),
                          (together.get_layer("top"), model.get_layer("top"))):
            for g_w, w_w in zip(got.get_weights(), want.get_weights()):
                self.assertAllEqual(g_w, w_w)

    @parameterized.parameters("int8", "int4")
    def test_masked_calls_are_not_batched(self, mode):
        # The collection pools ids without a mask, so a layer given one (as
        # an argument, or by Keras from an upstream layer) keeps its own call.
        model, x = masked_model(), masked_feed()
        apart = quantize_embeddings(model, mode, batch=False)
        together = quantize_embeddings(model, mode)
        self.assertEqual(collection_names(together),
                         [["emb_a", "emb_b"], ["emb_c", "emb_d"]])
        self.assertEqual(sorted(layer.name for layer in together.layers
                                if isinstance(layer, CompressedEmbedding)),
                         ["emb_m", "emb_n"])
        self.assertEqual(op_counts(together, x), (2, 2))
        self.assertAllEqual(together(x), apart(x))
        # The masks are honoured: emb_m's and emb_n's features are the numpy
        # pooling of their nonzero ids only (mean; sum).
        probe = keras.Model(together.inputs,
                            together.get_layer("features").output)
        features = np.asarray(probe(x))
        offset = 8 + 4
        for name, combiner in (("emb_m", "mean"), ("emb_n", "sum")):
            layer = together.get_layer(name)
            table = layer.dequantize()
            ids = x[name[-1]]
            want = np.zeros((B, layer.output_dim), np.float32)
            for b in range(B):
                real = ids[b][ids[b] != 0]
                if len(real):
                    want[b] = table[real].sum(axis=0)
                    if combiner == "mean":
                        want[b] /= len(real)
            self.assertAllClose(
                features[:, offset:offset + layer.output_dim], want,
                rtol=1e-5, atol=1e-6)
            offset += layer.output_dim

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

"""tf_compressed_embedding.layers.CompressedEmbedding against stock Keras and
stock TF: pooling of every input kind, lookups, training, quantize(),
.keras and SavedModel round trips, model conversion, bad inputs."""
import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import (CompressedEmbedding,
                                            UnsupportedQuantizationModeError,
                                            quantize_embeddings)

V, D, B, L = 50, 12, 7, 5
COMBINERS = ("sum", "mean", "sqrtn")
KINDS = ("padded_mask_zero", "padded_mask_arg", "ragged", "sparse")
EPS32 = np.finfo(np.float32).eps
# Root of the package under test, for the fresh processes.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfce.__file__)))


def random_bags(rng, kind):
    """Bags of ids (lists) with weights; bags 2 and B - 1 (the last, which a
    SparseTensor's indices never mention) are empty, bag 0 is full.

    With mask_zero (padded_mask_zero) 0 is padding, so real ids are >= 1;
    the other kinds use id 0 as an ordinary row.
    """
    low = 1 if kind == "padded_mask_zero" else 0
    bags, weights = [], []
    for b in range(B):
        n = (L if b == 0 else 0 if b in (2, B - 1)
             else int(rng.integers(1, L + 1)))
        ids = rng.integers(low, V, size=n)
        if b == 1:
            ids[0] = V - 1  # the last row
        if b == 3 and n >= 2:
            ids[1] = ids[0]  # a repeated id
        bags.append(ids.tolist())
        weights.append(
            rng.uniform(0.5, 1.5, size=n).astype(np.float32).tolist())
    return bags, weights


def sparse_bags(bags):
    """The bags as a tf.SparseTensor [B, L] of ids, row-major."""
    indices = [[b, j] for b, bag in enumerate(bags) for j in range(len(bag))]
    return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                           np.array(sum(bags, []), np.int64), [B, L])


class LayerInputs:
    """The call inputs of one input kind, built from bags. Every kind's
    weights are made from one flat [N] tensor of the real ids' weights in
    bag order, so its gradient can be compared across kinds."""

    def __init__(self, kind, bags, weights, rng):
        self.kind = kind
        self.bags = bags
        self.splits = np.cumsum([0] + [len(b) for b in bags])
        self.flat_weights = np.array(sum(weights, []), np.float32)
        self.positions = [(b, j) for b, bag in enumerate(bags)
                          for j in range(len(bag))]
        self.rng = rng

    def layer_kwargs(self):
        return {"mask_zero": self.kind == "padded_mask_zero"}

    def call_args(self, weight_values=None):
        """(inputs, kwargs) for layer(inputs, **kwargs)."""
        kwargs = {}
        if self.kind in ("padded_mask_zero", "padded_mask_arg"):
            # Padding holds 0 (mask_zero) or garbage ids (the mask says so).
            pad = 0 if self.kind == "padded_mask_zero" else -7
            dense = np.full((B, L), pad, np.int64)
            mask = np.zeros((B, L), bool)
            for b, bag in enumerate(self.bags):
                dense[b, :len(bag)] = bag
                mask[b, :len(bag)] = True
            if self.kind == "padded_mask_arg":
                kwargs["mask"] = tf.constant(mask)
            if weight_values is not None:
                # Padding weights are junk that must not count.
                junk = tf.constant(self.rng.uniform(5, 9, (B, L)), tf.float32)
                kwargs["weights"] = tf.tensor_scatter_nd_update(
                    junk, np.array(self.positions, np.int64).reshape(-1, 2),
                    weight_values)
            return tf.constant(dense), kwargs
        if self.kind == "ragged":
            ids = tf.RaggedTensor.from_row_splits(
                np.array(sum(self.bags, []), np.int64), self.splits)
            if weight_values is not None:
                kwargs["weights"] = tf.RaggedTensor.from_row_splits(
                    weight_values, self.splits)
            return ids, kwargs
        ids = sparse_bags(self.bags)
        if weight_values is not None:
            kwargs["weights"] = tf.SparseTensor(ids.indices, weight_values,
                                                ids.dense_shape)
        return ids, kwargs


def set_table(layer, table):
    layer.build()
    layer.embeddings.assign(table)


class PoolingTest(tf.test.TestCase, parameterized.TestCase):
    """Every input kind x combiner x weighting, float32 and compressed,
    against tf.nn.safe_embedding_lookup_sparse on the same table."""

    @parameterized.product(kind=KINDS, combiner=COMBINERS,
                           weighted=(False, True), mode=(None, "int8", "fp16"))
    def test_pooling_matches_tf_nn(self, kind, combiner, weighted, mode):
        rng = np.random.default_rng(7)
        bags, weights = random_bags(rng, kind)
        inputs = LayerInputs(kind, bags, weights, rng)
        table = rng.standard_normal((V, D)).astype(np.float32)
        layer = CompressedEmbedding(V, D, combiner=combiner,
                                    **inputs.layer_kwargs())
        set_table(layer, table)
        if mode is not None:
            layer.quantize(mode)
            table = quantization.decode(*quantization.encode(table, mode),
                                        mode)
        ref_table = tf.Variable(table)
        cotangent = tf.constant(rng.standard_normal((B, D)), tf.float32)
        w = tf.constant(inputs.flat_weights)

        with tf.GradientTape(persistent=True) as tape:
            tape.watch(w)
            ids, kwargs = inputs.call_args(w if weighted else None)
            got = layer(ids, **kwargs)
            got_loss = tf.reduce_sum(got * cotangent)
            sp_ids = sparse_bags(bags)
            sp_w = (tf.SparseTensor(sp_ids.indices, w, sp_ids.dense_shape)
                    if weighted else None)
            want = tf.nn.safe_embedding_lookup_sparse(ref_table, sp_ids, sp_w,
                                                      combiner=combiner)
            want_loss = tf.reduce_sum(want * cotangent)

        self.assertEqual(got.shape, (B, D))
        self.assertEqual(got.dtype, tf.float32)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assertAllEqual(tf.gather(got, [2, B - 1]), np.zeros((2, D)))

        if weighted:
            got_dw = tape.gradient(got_loss, w)
            self.assertIsNotNone(got_dw)
            self.assertAllClose(tf.convert_to_tensor(got_dw),
                                tf.convert_to_tensor(
                                    tape.gradient(want_loss, w)),
                                rtol=1e-4, atol=1e-5)
        if mode is None:
            got_dt = tape.gradient(got_loss, layer.embeddings)
            self.assertIsInstance(got_dt, tf.IndexedSlices)
            self.assertAllClose(tf.convert_to_tensor(got_dt),
                                tf.convert_to_tensor(
                                    tape.gradient(want_loss, ref_table)),
                                rtol=1e-5, atol=1e-6)
            self.assertLen(layer.trainable_weights, 1)
        else:
            self.assertEmpty(layer.trainable_weights)
            for variable in layer.weights:
                self.assertIsNone(tape.gradient(got_loss, variable))

    @parameterized.parameters(None, "int8")
    def test_padded_mean_is_keras_embedding_plus_masked_average(self, mode):
        rng = np.random.default_rng(3)
        bags, weights = random_bags(rng, "padded_mask_zero")
        inputs = LayerInputs("padded_mask_zero", bags, weights, rng)
        ids, _ = inputs.call_args()
        table = rng.standard_normal((V, D)).astype(np.float32)
        layer = CompressedEmbedding(V, D, mask_zero=True, combiner="mean")
        set_table(layer, table)
        if mode:
            layer.quantize(mode)
            table = layer.dequantize()
        embedding = keras.layers.Embedding(V, D, mask_zero=True)
        set_table(embedding, table)
        pooling = keras.layers.GlobalAveragePooling1D()
        cotangent = tf.constant(rng.standard_normal((B, D)), tf.float32)
        nonempty = [b for b in range(B) if bags[b]]
        with tf.GradientTape(persistent=True) as tape:
            got = layer(ids)
            want = pooling(embedding(ids))  # mask propagated by Keras
            got_loss = tf.reduce_sum(got * cotangent)
            # Keras' empty bag is 0/0 = NaN (ours is 0): leave it out.
            want_loss = tf.reduce_sum(tf.gather(want, nonempty)
                                      * tf.gather(cotangent, nonempty))
        self.assertIsNone(getattr(got, "_keras_mask", None))
        self.assertTrue(np.isnan(want[2]).all())
        self.assertAllEqual(got[2], np.zeros(D))
        self.assertAllClose(tf.gather(got, nonempty),
                            tf.gather(want, nonempty), rtol=1e-5, atol=1e-6)
        if mode is None:
            got_dt = tape.gradient(got_loss, layer.embeddings)
            want_dt = tape.gradient(want_loss, embedding.embeddings)
            self.assertIsInstance(got_dt, tf.IndexedSlices)
            self.assertIsInstance(want_dt, tf.IndexedSlices)
            got_dt = tf.convert_to_tensor(got_dt).numpy()
            want_dt = tf.convert_to_tensor(want_dt).numpy()
            # Keras before 3.15 sends its empty bag's 0/0 back into the
            # masked ids' rows as NaN (0 * NaN) though they are masked out;
            # the right gradient there, and ours, is 0.
            keras_nan = np.isnan(want_dt).any(axis=1)
            self.assertAllEqual(got_dt[keras_nan],
                                np.zeros_like(got_dt[keras_nan]))
            self.assertAllClose(got_dt[~keras_nan], want_dt[~keras_nan],
                                rtol=1e-5, atol=1e-6)

    def test_mask_and_mask_zero_combine(self):
        layer = CompressedEmbedding(V, D, mask_zero=True, combiner="sum")
        set_table(layer, np.random.default_rng(0).standard_normal(
            (V, D)).astype(np.float32))
        ids = tf.constant([[3, 0, 4], [5, 6, 0]], tf.int64)
        mask = tf.constant([[True, True, False], [False, True, True]])
        table = layer.embeddings.numpy()
        self.assertAllClose(layer(ids, mask=mask), [table[3], table[6]])

    def test_functional_mask_from_upstream_layer(self):
        # A Masking-style upstream mask reaches the pooling as `mask`.
        ids = keras.Input(shape=(4,), dtype="int64")
        pooled = CompressedEmbedding(V, D, combiner="mean")(
            ids, mask=keras.ops.not_equal(ids, -1))
        model = keras.Model(ids, pooled)
        layer = model.layers[-1]
        x = np.array([[1, 2, -1, -1], [-1, -1, -1, -1]])
        out = model(x)
        table = layer.embeddings.numpy()
        self.assertAllClose(out, [(table[1] + table[2]) / 2, np.zeros(D)])


class LookupTest(tf.test.TestCase, parameterized.TestCase):
    """combiner=None is keras.layers.Embedding."""

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(11)
        self.table = rng.standard_normal((V, D)).astype(np.float32)
        # Negative ids in [-V, 0) are rows V + id, as in Keras.
        self.ids = np.array([[[0, 4, -1], [V - 1, 0, 7]],
                             [[3, -V, 2], [0, 0, 0]]], np.int64)

    @parameterized.parameters(False, True)
    def test_equals_keras_embedding(self, mask_zero):
        layer = CompressedEmbedding(V, D, mask_zero=mask_zero)
        set_table(layer, self.table)
        embedding = keras.layers.Embedding(V, D, mask_zero=mask_zero)
        set_table(embedding, self.table)
        with tf.GradientTape(persistent=True) as tape:
            got = layer(self.ids)
            want = embedding(self.ids)
            loss_got = tf.reduce_sum(got * got)
            loss_want = tf.reduce_sum(want * want)
        self.assertEqual(got.shape, self.ids.shape + (D,))
        self.assertAllEqual(got, want)
        got_mask = layer.compute_mask(self.ids)
        want_mask = embedding.compute_mask(self.ids)
        if mask_zero:
            self.assertAllEqual(got_mask, want_mask)
            self.assertAllEqual(got._keras_mask, want._keras_mask)
        else:
            self.assertIsNone(got_mask)
            self.assertIsNone(want_mask)
        got_dt = tape.gradient(loss_got, layer.embeddings)
        want_dt = tape.gradient(loss_want, embedding.embeddings)
        self.assertIsInstance(got_dt, tf.IndexedSlices)
        self.assertAllClose(tf.convert_to_tensor(got_dt),
                            tf.convert_to_tensor(want_dt))

    def test_masked_sequence_model_matches_keras(self):
        # The mask flows to downstream layers exactly as Keras' does.
        def build(embedding_layer):
            ids = keras.Input(shape=(6,), dtype="int32")
            x = embedding_layer(ids)
            x = keras.layers.GlobalAveragePooling1D()(x)
            return keras.Model(ids, x)
        layer = CompressedEmbedding(V, D, mask_zero=True)
        embedding = keras.layers.Embedding(V, D, mask_zero=True)
        ours, stock = build(layer), build(embedding)
        embedding.embeddings.assign(layer.embeddings)
        x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9]], np.int32)
        self.assertAllClose(ours(x), stock(x), rtol=1e-6, atol=1e-7)

    def test_whole_number_float_ids_work_like_keras(self):
        layer = CompressedEmbedding(V, D)
        set_table(layer, self.table)
        embedding = keras.layers.Embedding(V, D)
        set_table(embedding, self.table)
        ids = self.ids.astype(np.float32)
        self.assertAllEqual(layer(ids), embedding(ids))

    @parameterized.parameters("int8", "fp16")
    def test_quantized_lookup_is_the_decoded_table(self, mode):
        layer = CompressedEmbedding(V, D)
        set_table(layer, self.table)
        layer.quantize(mode)
        decoded = quantization.decode(*quantization.encode(self.table, mode),
                                      mode)
        wrapped = np.where(self.ids < 0, self.ids + V, self.ids)
        self.assertAllEqual(layer(self.ids), decoded[wrapped])
        self.assertAllEqual(layer(self.ids.astype(np.int32)), decoded[wrapped])

    def test_graph_mode_and_dtype_policy(self):
        layer = CompressedEmbedding(V, D, dtype="mixed_bfloat16")
        set_table(layer, self.table)
        self.assertEqual(layer.embeddings.dtype, "float32")

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def lookup(ids):
            return layer(ids)
        out = lookup(tf.constant([[1, 2]], tf.int64))
        self.assertEqual(out.dtype, tf.bfloat16)
        self.assertAllClose(tf.cast(out, tf.float32), self.table[[[1, 2]]],
                            rtol=1e-2)
        layer.quantize("int8")
        self.assertEqual(layer(np.array([[1]])).dtype, tf.bfloat16)


def stock_and_ours(seed, vocab=40, dim=8):
    """Two functional models with identical initial weights: ids [B, 6] ->
    mean of non-padding rows -> Dense(1); stock Keras and
    CompressedEmbedding."""
    ids = keras.Input(shape=(6,), dtype="int64")
    x = keras.layers.Embedding(vocab, dim, mask_zero=True)(ids)
    x = keras.layers.GlobalAveragePooling1D()(x)
    stock = keras.Model(ids, keras.layers.Dense(1)(x))

    ids = keras.Input(shape=(6,), dtype="int64")
    x = CompressedEmbedding(vocab, dim, mask_zero=True, combiner="mean")(ids)
    ours = keras.Model(ids, keras.layers.Dense(1)(x))
    rng = np.random.default_rng(seed)
    weights = [rng.normal(0, 0.5, w.shape).astype(np.float32)
               for w in stock.get_weights()]
    stock.set_weights(weights)
    ours.set_weights(weights)
    return stock, ours


class TrainingTest(tf.test.TestCase):

    def test_fit_matches_stock_keras(self):
        rng = np.random.default_rng(5)
        stock, ours = stock_and_ours(1)
        lengths = rng.integers(1, 7, size=64)  # no empty bag: Keras' is NaN
        x = rng.integers(1, 40, size=(64, 6))
        x[np.arange(6)[None, :] >= lengths[:, None]] = 0
        y = rng.standard_normal((64, 1)).astype(np.float32)
        histories = []
        for model in (stock, ours):
            model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse",
                          jit_compile=False)
            histories.append(model.fit(x, y, batch_size=16, epochs=2,
                                       shuffle=False, verbose=0).history)
        self.assertLen(histories[1]["loss"], 2)
        self.assertLess(histories[1]["loss"][1], histories[1]["loss"][0])
        self.assertAllClose(histories[0]["loss"], histories[1]["loss"],
                            rtol=1e-5)
        for want, got in zip(stock.get_weights(), ours.get_weights()):
            self.assertAllClose(got, want, rtol=1e-4, atol=1e-6)

    def test_default_compile_does_not_use_xla(self):
        # jit_compile="auto" must not pick XLA, which lacks the ops.
        _, ours = stock_and_ours(2)
        ours.layers[1].quantize("int8")
        ours.compile(loss="mse")
        self.assertFalse(ours.jit_compile)
        out = ours.predict(np.ones((3, 6), np.int64), verbose=0)
        self.assertEqual(out.shape, (3, 1))


class QuantizeTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.parameters("int8", "fp16")
    def test_quantize_in_place(self, mode):
        rng = np.random.default_rng(2)
        table = rng.standard_normal((V, D)).astype(np.float32)
        table[5] = 0  # an all-zero row
        layer = CompressedEmbedding(V, D, combiner="sqrtn")
        set_table(layer, table)
        self.assertIsNone(layer.quantization_mode)
        float_table = weakref.ref(layer.embeddings.value)
        layer.quantize(mode)
        self.assertEqual(layer.quantization_mode, mode)
        gc.collect()
        self.assertIsNone(float_table())  # the float32 table is freed

        data, scales = quantization.encode(table, mode)
        self.assertEqual([v.name for v in layer.weights],
                         ["embeddings_data", "embeddings_scales"])
        self.assertEqual(layer.embeddings_data.dtype,
                         quantization.storage_dtype(mode).name)
        self.assertAllEqual(layer.embeddings_data.numpy(), data)
        self.assertAllEqual(layer.embeddings_scales.numpy(), scales)
        self.assertEqual(layer.embeddings_scales.shape,
                         quantization.scales_shape(mode, V))
        self.assertEmpty(layer.trainable_weights)
        self.assertAllEqual(layer.dequantize(),
                            quantization.decode(data, scales, mode))
        # No float32 copy of the table is kept.
        self.assertFalse(any(v.dtype == "float32" and len(v.shape) == 2
                             for v in layer.weights))
        with self.assertRaisesRegex(AttributeError, "keeps no float32 table"):
            layer.embeddings  # noqa: B018

        ids = tf.ragged.constant([[1, 5, 49], [], [7]], tf.int64)
        want = tfce.embedding_lookup_sparse(
            tfce.CompressedTable(data, scales, mode), ids, combiner="sqrtn")
        self.assertAllEqual(layer(ids), want)

    def test_quantize_twice_unknown_mode_and_unbuilt(self):
        layer = CompressedEmbedding(V, D)
        with self.assertRaisesRegex(ValueError, "not built"):
            layer.quantize("int8")
        layer.build()
        for mode in ("int4", "float16", None):
            with self.assertRaisesRegex(ValueError,
                                        "must be one of 'int8', 'fp16'"):
                layer.quantize(mode)
        self.assertIsNone(layer.quantization_mode)
        layer.quantize("fp16")
        with self.assertRaisesRegex(ValueError, "already quantized to 'fp16'"):
            layer.quantize("int8")
        with self.assertRaisesRegex(ValueError, "already quantized"):
            layer.quantize("fp16")

    def test_refused_table_leaves_layer_unchanged(self):
        layer = CompressedEmbedding(V, D)
        table = np.ones((V, D), np.float32)
        table[3, 4] = 1e5  # beyond float16
        set_table(layer, table)
        with self.assertRaisesRegex(ValueError, "float16 range"):
            layer.quantize("fp16")
        self.assertIsNone(layer.quantization_mode)
        self.assertAllEqual(layer.embeddings.numpy(), table)
        layer.quantize("int8")
        self.assertEqual(layer.quantization_mode, "int8")

    def test_model_quantize_reaches_the_layer(self):
        # keras.Model.quantize("int8") quantizes it in its own format, and
        # "int4" skips it with a warning instead of failing the model.
        ids = keras.Input(shape=(3,), dtype="int64")
        x = CompressedEmbedding(V, D, combiner="sum", name="emb")(ids)
        model = keras.Model(ids, keras.layers.Dense(2, name="dense")(x))
        table = model.get_layer("emb").embeddings.numpy()
        with self.assertWarnsRegex(UserWarning, "must be one of"):
            model.quantize("int4")
        self.assertIsNone(model.get_layer("emb").quantization_mode)
        self.assertEqual(model.get_layer("dense").quantization_mode, "int4")
        self.assertTrue(issubclass(UnsupportedQuantizationModeError,
                                   NotImplementedError))

        ids = keras.Input(shape=(3,), dtype="int64")
        x = CompressedEmbedding(V, D, combiner="sum", name="emb")(ids)
        model = keras.Model(ids, keras.layers.Dense(2, name="dense")(x))
        model.get_layer("emb").set_weights([table])
        model.quantize("int8")
        layer = model.get_layer("emb")
        self.assertEqual(layer.quantization_mode, "int8")
        self.assertAllEqual(layer.embeddings_data.numpy(),
                            quantization.encode(table, "int8")[0])
        self.assertEqual(model.predict(np.array([[1, 2, 3]]),
                                       verbose=0).shape, (1, 2))


def mixed_model(vocab=V):
    """Functional model over padded ids with three layers, to be quantized
    int8 / fp16 / left float32 by the tests."""
    ids = keras.Input(shape=(L,), dtype="int64", name="ids")
    a = CompressedEmbedding(vocab, D, mask_zero=True, combiner="mean",
                            name="pooled_int8")(ids)
    b = CompressedEmbedding(vocab, D, combiner="sqrtn",
                            name="pooled_fp32")(ids)
    c = CompressedEmbedding(vocab, D, name="rows_fp16")(ids)
    c = keras.layers.GlobalAveragePooling1D()(c)
    out = keras.layers.Dense(3)(keras.layers.Concatenate()([a, b, c]))
    model = keras.Model(ids, out)
    model.get_layer("pooled_int8").quantize("int8")
    model.get_layer("rows_fp16").quantize("fp16")
    return model


LOAD_SAVED_MODEL = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_compressed_embedding  # registers the ops
    model = tf.saved_model.load(sys.argv[1])
    ids = tf.constant(json.loads(sys.argv[2]), tf.int64)
    out = model.serve(ids)
    print(json.dumps({
        "out": out.numpy().tolist(),
        "variables": sorted([v.dtype.name, v.shape.as_list()]
                            for v in model.variables)}))
""")


class SerializationTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.ids = np.random.default_rng(8).integers(0, V, size=(6, L))
        self.ids[1, 2:] = 0
        self.ids[4] = 0  # an all-padding row

    def test_config_round_trip(self):
        layer = CompressedEmbedding(V, D, mask_zero=True, combiner="sqrtn",
                                    embeddings_initializer="normal",
                                    name="emb", dtype="mixed_bfloat16")
        layer.build()
        config = layer.get_config()
        self.assertEqual(config["quantization_mode"], None)
        clone = CompressedEmbedding.from_config(config)
        self.assertEqual(clone.get_config(), config)
        layer.quantize("int8")
        clone = CompressedEmbedding.from_config(layer.get_config())
        self.assertEqual(clone.quantization_mode, "int8")
        clone.build()
        self.assertEqual([v.dtype for v in clone.weights], ["int8", "float32"])
        self.assertEqual(
            keras.saving.get_registered_name(CompressedEmbedding),
            "tf_compressed_embedding>CompressedEmbedding")

    def test_constructor_weights(self):
        table = np.random.default_rng(0).standard_normal((V, D)).astype(
            np.float32)
        layer = CompressedEmbedding(V, D, weights=table)
        self.assertAllEqual(layer.embeddings.numpy(), table)
        data, scales = quantization.encode(table, "int8")
        layer = CompressedEmbedding(V, D, weights=[data, scales],
                                    quantization_mode="int8")
        self.assertAllEqual(layer(np.array([3])), [data[3] * scales[3]])

    def test_keras_file_round_trip(self):
        model = mixed_model()
        want = model(self.ids)
        # Ragged ids and per-id weights as model inputs.
        ragged_ids = keras.Input(shape=(None,), dtype="int64", ragged=True)
        ragged_w = keras.Input(shape=(None,), dtype="float32", ragged=True)
        ragged_layer = CompressedEmbedding(V, D, combiner="mean")
        ragged_model = keras.Model(
            [ragged_ids, ragged_w],
            ragged_layer(ragged_ids, weights=ragged_w))
        ragged_layer.quantize("int8")
        bags = [tf.ragged.constant([[1, 2], [], [49, 0, 3]], tf.int64),
                tf.ragged.constant([[0.5, 2.0], [], [1.0, 1.0, 3.0]])]
        ragged_want = ragged_model(bags)
        table = ragged_layer.dequantize()
        self.assertAllClose(ragged_want[2],
                            (table[49] + table[0] + 3 * table[3]) / 5,
                            rtol=1e-6, atol=1e-7)

        for m, path, x, expected in (
                (model, "mixed.keras", self.ids, want),
                (ragged_model, "ragged.keras", bags, ragged_want)):
            path = os.path.join(self.get_temp_dir(), path)
            m.save(path)
            loaded = keras.saving.load_model(path)
            self.assertAllEqual(loaded(x), expected)
        modes = {layer.name: layer.quantization_mode for layer in
                 keras.saving.load_model(os.path.join(
                     self.get_temp_dir(), "mixed.keras")).layers
                 if isinstance(layer, CompressedEmbedding)}
        self.assertEqual(modes, {"pooled_int8": "int8", "pooled_fp32": None,
                                 "rows_fp16": "fp16"})
        loaded = keras.saving.load_model(
            os.path.join(self.get_temp_dir(), "mixed.keras"))
        for name in ("pooled_int8", "rows_fp16"):
            for got, saved in zip(loaded.get_layer(name).weights,
                                  model.get_layer(name).weights):
                self.assertEqual(got.dtype, saved.dtype)
                self.assertAllEqual(got.numpy(), saved.numpy())

    def test_load_into_wrong_mode_is_clear(self):
        layer = CompressedEmbedding(V, D)
        layer.build()
        with self.assertRaisesRegex(ValueError, "expects 1 saved variable"):
            layer.load_own_variables({"0": np.zeros((V, D), np.int8),
                                      "1": np.zeros(V, np.float32)})
        with self.assertRaisesRegex(ValueError, "expected float32"):
            layer.load_own_variables({"0": np.zeros((V, D), np.int8)})

    def test_saved_model_export_loads_in_fresh_process(self):
        model = mixed_model()
        want = model(self.ids)
        path = os.path.join(self.get_temp_dir(), "exported")
        model.export(path, verbose=False)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run(
            [sys.executable, "-c", LOAD_SAVED_MODEL, path,
             json.dumps(self.ids.tolist())],
            capture_output=True, text=True, timeout=300, check=False, env=env)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        loaded = json.loads(result.stdout.strip().splitlines()[-1])
        self.assertAllEqual(np.array(loaded["out"], np.float32), want)
        # The quantized tables are stored compressed, with no float32 copy;
        # only the float32 layer's table is [V, D] float32.
        variables = loaded["variables"]
        self.assertIn(["int8", [V, D]], variables)
        self.assertIn(["float32", [V]], variables)
        self.assertIn(["float16", [V, D]], variables)
        self.assertIn(["float32", [0]], variables)
        self.assertEqual(variables.count(["float32", [V, D]]), 1)


def stock_model():
    """Functional model with two Keras Embeddings (a large and a small one)
    and a Dense head."""
    items = keras.Input(shape=(L,), dtype="int64", name="items")
    user = keras.Input(shape=(1,), dtype="int64", name="user")
    x = keras.layers.Embedding(V, D, mask_zero=True, name="item_emb")(items)
    x = keras.layers.GlobalAveragePooling1D()(x)
    u = keras.layers.Embedding(8, D, name="user_emb")(user)
    u = keras.layers.Flatten()(u)
    out = keras.layers.Dense(2, name="head")(
        keras.layers.Concatenate()([x, u]))
    model = keras.Model([items, user], out)
    rng = np.random.default_rng(4)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


class QuantizeEmbeddingsTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(9)
        items = rng.integers(1, V, size=(5, L))
        items[2, 3:] = 0
        self.x = [items, rng.integers(0, 8, size=(5, 1))]

    @parameterized.parameters("int8", "fp16")
    def test_functional_model(self, mode):
        model = stock_model()
        before = [w.copy() for w in model.get_weights()]
        converted = quantize_embeddings(model, mode, min_rows=10)

        item = converted.get_layer("item_emb")
        self.assertIsInstance(item, CompressedEmbedding)
        self.assertEqual(item.quantization_mode, mode)
        self.assertTrue(item.mask_zero)
        table = model.get_layer("item_emb").embeddings.numpy()
        data, scales = quantization.encode(table, mode)
        self.assertAllEqual(item.embeddings_data.numpy(), data)
        self.assertAllEqual(item.embeddings_scales.numpy(), scales)
        # Under min_rows: left a float32 Keras Embedding.
        self.assertIs(type(converted.get_layer("user_emb")),
                      keras.layers.Embedding)

        # The same as the stock model with the table replaced by its decoding.
        reference = stock_model()
        reference.get_layer("item_emb").embeddings.assign(
            quantization.decode(data, scales, mode))
        self.assertAllClose(converted(self.x), reference(self.x),
                            rtol=1e-5, atol=1e-5)
        # The source model is untouched.
        self.assertIs(type(model.get_layer("item_emb")),
                      keras.layers.Embedding)
        for got, want in zip(model.get_weights(), before):
            self.assertAllEqual(got, want)

        everything = quantize_embeddings(model, mode)
        self.assertIsInstance(everything.get_layer("user_emb"),
                              CompressedEmbedding)

    def test_sequential_with_compressed_layers(self):
        layer = CompressedEmbedding(V, D, combiner="sum")
        # Keras' default Input dtype (float32) holding whole-number ids.
        model = keras.Sequential([keras.Input((L,)), layer,
                                  keras.layers.Dense(1)])
        ids = self.x[0].astype(np.float32)
        table = layer.embeddings.numpy()
        converted = quantize_embeddings(model, "fp16")
        new_layer = converted.layers[0]
        self.assertEqual(new_layer.quantization_mode, "fp16")
        self.assertEqual(new_layer.combiner, "sum")
        self.assertAllEqual(new_layer.dequantize(), table.astype(np.float16))
        self.assertAllClose(converted(ids), model(ids), rtol=1e-2, atol=1e-2)
        # An already-quantized layer is copied as it is.
        again = quantize_embeddings(converted, "int8")
        self.assertEqual(again.layers[0].quantization_mode, "fp16")
        self.assertAllEqual(again(ids), converted(ids))

    def test_model_keras_quantized_itself(self):
        model = stock_model()
        model.quantize("int8")  # Embeddings and the Dense head, Keras' way
        keras_item = model.get_layer("item_emb")
        self.assertEqual(keras_item.quantization_mode, "int8")
        converted = quantize_embeddings(model, "int8")
        item = converted.get_layer("item_emb")
        self.assertIsInstance(item, CompressedEmbedding)
        self.assertEqual(item.quantization_mode, "int8")
        # Keras' int8 values are kept exactly; scales are the inverses.
        self.assertAllEqual(item.embeddings_data.numpy(),
                            keras_item.embeddings.numpy())
        inverse = keras_item.embeddings_scale.numpy()
        self.assertAllClose(item.embeddings_scales.numpy() * inverse,
                            np.ones(V), rtol=2 * EPS32, atol=0)
        self.assertEqual(converted.get_layer("head").quantization_mode, "int8")

        # Rows: Keras' q / s against the layer's q * (1 / s).
        ids = np.arange(V).reshape(5, 10)
        got, want = item(ids).numpy(), keras_item(ids).numpy()
        self.assertAllClose(got, want, rtol=4 * EPS32, atol=0)
        self.assertAllClose(converted(self.x), model(self.x),
                            rtol=1e-5, atol=1e-6)
        # mode="fp16" keeps Keras' int8 table int8 (no float32 round trip).
        fp16 = quantize_embeddings(model, "fp16")
        self.assertEqual(fp16.get_layer("item_emb").quantization_mode, "int8")

    def test_refusals(self):
        model = stock_model()
        with self.assertRaisesRegex(ValueError, "format must be one of"):
            quantize_embeddings(model, "int4")
        with self.assertRaisesRegex(ValueError, "min_rows"):
            quantize_embeddings(model, "int8", min_rows=-1)
        with self.assertRaisesRegex(TypeError, "keras.Model"):
            quantize_embeddings(CompressedEmbedding(V, D), "int8")

        class Subclassed(keras.Model):
            def __init__(self):
                super().__init__()
                self.emb = keras.layers.Embedding(V, D)

            def call(self, ids):
                return self.emb(ids)
        subclassed = Subclassed()
        subclassed(np.zeros((1, 2), np.int64))
        with self.assertRaisesRegex(ValueError, "subclassed"):
            quantize_embeddings(subclassed, "int8")

        int4 = stock_model()
        int4.get_layer("item_emb").quantize("int4")
        with self.assertRaisesRegex(ValueError, "'int4'.*no exact"):
            quantize_embeddings(int4, "int8")
        nan = stock_model()
        table = nan.get_layer("item_emb").embeddings.numpy()
        table[7, 1] = np.nan
        nan.get_layer("item_emb").embeddings.assign(table)
        with self.assertRaisesRegex(ValueError, "non-finite.*row 7"):
            quantize_embeddings(nan, "int8")


def out_of_range(bad_id):
    """The error of tf.gather ("indices[i] = 50 is not in [0, 50)") and of
    the ops ("ids[i] = 50 (in segment 0) is not in [0, 50)")."""
    return rf"\[[\d,]+\] = {bad_id} (\(in segment \d+\) )?is not in \[0, {V}\)"


class BadInputTest(tf.test.TestCase, parameterized.TestCase):

    def layer(self, mode, **kwargs):
        layer = CompressedEmbedding(V, D, **kwargs)
        layer.build()
        if mode:
            layer.quantize(mode)
        return layer

    @parameterized.product(mode=(None, "int8", "fp16"),
                           combiner=(None, "mean"))
    def test_ids_out_of_range(self, mode, combiner):
        layer = self.layer(mode, combiner=combiner)
        for bad in (V, -V - 3):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        out_of_range(bad)):
                layer(np.array([[1, bad]]))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def graph(ids):
            return layer(ids)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    out_of_range(V)):
            graph(tf.constant([[V]], tf.int64))
        if combiner:
            ragged = tf.ragged.constant([[1], [V + 1]], tf.int64)
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        out_of_range(V + 1)):
                layer(ragged)

    @parameterized.parameters(None, "int8")
    def test_wrong_id_dtypes(self, mode):
        layer = self.layer(mode)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "ids must be whole numbers"):
            layer(np.array([[1.0, 2.5]], np.float32))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "whole numbers"):
            layer(np.array([[np.nan]], np.float32))
        with self.assertRaisesRegex(TypeError, "ids must be integers"):
            layer(tf.constant([["a"]]))
        pooled = self.layer(mode, combiner="sum")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "whole numbers"):
            pooled(tf.ragged.constant([[1.5]], tf.float32))

    def test_weights_without_combiner(self):
        layer = self.layer(None)
        with self.assertRaisesRegex(ValueError, "`weights` need a combiner"):
            layer(np.array([[1]]), weights=np.array([[1.0]], np.float32))

    def test_bad_pooled_inputs(self):
        layer = self.layer(None, combiner="mean")
        with self.assertRaisesRegex(ValueError, r"\[batch, length\]"):
            layer(np.zeros((2, 3, 4), np.int64))
        with self.assertRaisesRegex(ValueError, "`mask` is for dense"):
            layer(tf.ragged.constant([[1]], tf.int64),
                  mask=tf.constant([[True]]))
        with self.assertRaisesRegex(TypeError, "must be a RaggedTensor"):
            layer(tf.ragged.constant([[1]], tf.int64),
                  weights=tf.constant([[1.0]]))
        with self.assertRaisesRegex(TypeError, "floating point"):
            layer(np.array([[1, 2]]), weights=np.array([[1, 2]]))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "shape of the ids"):
            layer(np.array([[1, 2]]), weights=np.ones((1, 3), np.float32))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "row lengths"):
            layer(tf.ragged.constant([[1, 2], [3]], tf.int64),
                  weights=tf.ragged.constant([[1.0], [2.0, 3.0]]))

    def test_bad_constructor_arguments(self):
        with self.assertRaisesRegex(NotImplementedError, "LoRA"):
            CompressedEmbedding(V, D, lora_rank=4)
        with self.assertRaisesRegex(ValueError, "combiner"):
            CompressedEmbedding(V, D, combiner="max")
        with self.assertRaisesRegex(ValueError, "input_dim"):
            CompressedEmbedding(0, D)
        with self.assertRaisesRegex(ValueError, "output_dim"):
            CompressedEmbedding(V, 2.5)
        with self.assertRaisesRegex(ValueError, "must be one of"):
            CompressedEmbedding(V, D, quantization_mode="int4")
        with self.assertRaisesRegex(NotImplementedError,
                                    "quantization_config"):
            CompressedEmbedding(V, D, quantization_config="int8")


if __name__ == "__main__":
    tf.test.main()

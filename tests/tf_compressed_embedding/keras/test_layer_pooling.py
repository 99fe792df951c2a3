"""tf_compressed_embedding.layers.CompressedEmbedding against stock Keras and
stock TF: pooling of every input kind, lookups, training."""

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import CompressedEmbedding
from layer_testing import B, D, L, MODES, V, set_table


COMBINERS = ("sum", "mean", "sqrtn")
KINDS = ("padded_mask_zero", "padded_mask_arg", "ragged", "sparse")


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


class PoolingTest(tf.test.TestCase, parameterized.TestCase):
    """Every input kind x combiner x weighting, float32 and compressed,
    against tf.nn.safe_embedding_lookup_sparse on the same table."""

    @parameterized.product(kind=KINDS, combiner=COMBINERS,
                           weighted=(False, True), mode=(None, *MODES))
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
                                        mode, D)
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

    @parameterized.parameters(None, *MODES)
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

    def test_upstream_mask_reaches_a_weighted_call(self):
        # With two tensor arguments Keras passes the ids' mask as
        # `inputs_mask`, not `mask`; the padding must still be dropped.
        class NotMinusOne(keras.layers.Layer):
            def __init__(self):
                super().__init__()
                self.supports_masking = True

            def call(self, ids):
                return ids

            def compute_mask(self, ids, mask=None):
                return keras.ops.not_equal(ids, -1)

        ids = keras.Input(shape=(3,), dtype="int64")
        weights = keras.Input(shape=(3,), dtype="float32")
        pooled = CompressedEmbedding(V, D, combiner="sum")(
            NotMinusOne()(ids), weights=weights)
        model = keras.Model([ids, weights], pooled)
        table = model.layers[-1].embeddings.numpy()
        x = np.array([[1, -1, 2], [-1, -1, -1]])
        w = np.array([[2.0, 7.0, 0.5], [1.0, 1.0, 1.0]], np.float32)
        self.assertAllClose(model([x, w]),
                            [2.0 * table[1] + 0.5 * table[2], np.zeros(D)],
                            rtol=1e-5, atol=1e-6)


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
            # Keras keeps a tensor's mask in this attribute.
            self.assertAllEqual(got._keras_mask, want._keras_mask)  # noqa: SLF001
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

    @parameterized.parameters(*MODES)
    def test_quantized_lookup_is_the_decoded_table(self, mode):
        layer = CompressedEmbedding(V, D)
        set_table(layer, self.table)
        layer.quantize(mode)
        decoded = quantization.decode(*quantization.encode(self.table, mode),
                                      mode, D)
        wrapped = np.where(self.ids < 0, self.ids + V, self.ids)
        self.assertAllEqual(layer(self.ids), decoded[wrapped])
        self.assertAllEqual(layer(self.ids.astype(np.int32)), decoded[wrapped])

    @parameterized.parameters(*MODES)
    def test_graph_mode_and_dtype_policy(self, mode):
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
        layer.quantize(mode)
        # A function traced on the float32 table must be traced again.
        lookup = tf.function(layer.call, input_signature=[
            tf.TensorSpec([None, None], tf.int64)])
        out = lookup(tf.constant([[1, 2]], tf.int64))
        self.assertEqual(out.dtype, tf.bfloat16)
        self.assertAllEqual(out, tf.cast(layer.dequantize()[[[1, 2]]],
                                         tf.bfloat16))


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


class TrainingTest(tf.test.TestCase, parameterized.TestCase):

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

    @parameterized.parameters(*MODES)
    def test_default_compile_does_not_use_xla(self, mode):
        # jit_compile="auto" must not pick XLA, which lacks the ops.
        _, ours = stock_and_ours(2)
        ours.layers[1].quantize(mode)
        ours.compile(loss="mse")
        self.assertFalse(ours.jit_compile)
        out = ours.predict(np.ones((3, 6), np.int64), verbose=0)
        self.assertEqual(out.shape, (3, 1))


class DimTest(tf.test.TestCase, parameterized.TestCase):
    """Dims whose rows are no whole number of bytes, vectors or cache lines
    (int4's odd dims leave a high nibble unused)."""

    @parameterized.product(mode=MODES, dim=(1, 7, 33))
    def test_lookup_and_pooling_are_the_decoded_table(self, mode, dim):
        rng = np.random.default_rng(dim)
        table = rng.standard_normal((V, dim)).astype(np.float32)
        rows = CompressedEmbedding(V, dim)
        pooled = CompressedEmbedding(V, dim, combiner="sum")
        for layer in (rows, pooled):
            set_table(layer, table)
            layer.quantize(mode)
        decoded = quantization.decode(*quantization.encode(table, mode),
                                      mode, dim)
        ids = rng.integers(0, V, (4, 6))
        weights = rng.uniform(0.5, 2.0, (4, 6)).astype(np.float32)
        self.assertAllEqual(rows(ids), decoded[ids])
        want = (decoded[ids].astype(np.float64) * weights[..., None]).sum(1)
        self.assertAllClose(pooled(ids, weights=weights), want,
                            rtol=1e-5, atol=1e-5)

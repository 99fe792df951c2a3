"""CompressedEmbedding.quantize() in place, and quantize_embeddings() (model
conversion) against stock Keras."""
import gc
import weakref

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from keras.quantizers import Int4QuantizationConfig

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization
from tf_compressed_embedding.keras import keras_int4_to_tfce, keras_int8_to_tfce
from tf_compressed_embedding.layers import (CompressedEmbedding,
                                            UnsupportedQuantizationModeError,
                                            quantize_embeddings)
from layer_testing import (D, EPS32, KERAS_INT4_BLOCKS, L, MODES,
                           NO_INT4_BLOCKS, V, set_table)

UNKNOWN_MODE = f"must be one of {', '.join(repr(m) for m in MODES)}"


class QuantizeTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.parameters(*MODES)
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
        self.assertEqual(layer.embeddings_data.shape,
                         quantization.data_shape(mode, V, D))
        self.assertAllEqual(layer.embeddings_data.numpy(), data)
        self.assertAllEqual(layer.embeddings_scales.numpy(), scales)
        self.assertEqual(layer.embeddings_scales.shape,
                         quantization.scales_shape(mode, V))
        self.assertEmpty(layer.trainable_weights)
        decoded = quantization.decode(data, scales, mode, D)
        self.assertAllEqual(layer.dequantize(), decoded)
        # Within the format's error of the float32 table.
        bound = quantization.max_decode_error(mode, np.abs(table).max(axis=1))
        self.assertTrue((np.abs(decoded - table) <= bound[:, None]).all())
        # No float32 copy of the table is kept.
        self.assertFalse(any(v.dtype == "float32" and len(v.shape) == 2
                             for v in layer.weights))
        with self.assertRaisesRegex(AttributeError, "keeps no float32 table"):
            layer.embeddings  # noqa: B018

        ids = tf.ragged.constant([[1, 5, 49], [], [7]], tf.int64)
        want = tfce.embedding_lookup_sparse(
            tfce.CompressedTable(data, scales, mode, dim=D), ids,
            combiner="sqrtn")
        self.assertAllEqual(layer(ids), want)
        # And numpy on the decoded table (float64, then float32 rounding).
        self.assertAllClose(layer(ids), [
            decoded[[1, 5, 49]].sum(0) / np.sqrt(3), np.zeros(D), decoded[7]],
            rtol=1e-6, atol=1e-6)

    def test_quantize_twice_unknown_mode_and_unbuilt(self):
        layer = CompressedEmbedding(V, D)
        with self.assertRaisesRegex(ValueError, "not built"):
            layer.quantize("int8")
        layer.build()
        for mode in ("int2", "float16", "float8", "int8_rowwise", None):
            with self.assertRaisesRegex(ValueError, UNKNOWN_MODE):
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
        table[3, 4] = 2e6  # beyond int4's float16 scale (range / 15)
        layer.embeddings.assign(table)
        with self.assertRaisesRegex(ValueError, "row 3 .*float16 scale"):
            layer.quantize("int4")
        self.assertIsNone(layer.quantization_mode)
        self.assertAllEqual(layer.embeddings.numpy(), table)
        layer.quantize("int8")
        self.assertEqual(layer.quantization_mode, "int8")

    def test_keras_configs(self):
        # Keras' configs without a custom quantizer are taken (int4's
        # default block_size, 128, is a whole row here); a custom quantizer,
        # another mode's config, or int4 groups narrower than a row are not.
        layer = CompressedEmbedding(V, D)
        layer.build()
        custom = keras.quantizers.Int8QuantizationConfig(
            weight_quantizer=keras.quantizers.AbsMaxQuantizer(axis=0))
        refused = [("int8", custom, "no custom quantization config"),
                   ("int8", Int4QuantizationConfig(), "no custom quantization")]
        taken = [("int8", keras.quantizers.Int8QuantizationConfig()),
                 ("int4", Int4QuantizationConfig())]
        if KERAS_INT4_BLOCKS:
            refused.append(("int4", Int4QuantizationConfig(block_size=D - 1),
                            f"block_size={D - 1} would split the {D} values"))
            taken += [("int4", Int4QuantizationConfig(block_size=-1)),
                      ("int4", Int4QuantizationConfig(block_size=D))]
        for mode, config, match in refused:
            with self.assertRaisesRegex(ValueError, match):
                layer.quantize(mode, config=config)
        self.assertIsNone(layer.quantization_mode)
        for mode, config in taken:
            layer = CompressedEmbedding(V, D)
            layer.build()
            layer.quantize(mode, config=config)
            self.assertEqual(layer.quantization_mode, mode)

    @parameterized.parameters("int8", "int4")
    def test_model_quantize_reaches_the_layer(self, mode):
        # keras.Model.quantize("int8" / "int4") quantizes it in the format
        # of that name, and a Keras mode it lacks ("float8") skips it with
        # a warning instead of failing the model.
        ids = keras.Input(shape=(3,), dtype="int64")
        x = CompressedEmbedding(V, D, combiner="sum", name="emb")(ids)
        model = keras.Model(ids, keras.layers.Dense(2, name="dense")(x))
        table = model.get_layer("emb").embeddings.numpy()
        with self.assertWarnsRegex(UserWarning, UNKNOWN_MODE):
            model.quantize("float8")
        self.assertIsNone(model.get_layer("emb").quantization_mode)
        self.assertEqual(model.get_layer("dense").quantization_mode, "float8")
        self.assertTrue(issubclass(UnsupportedQuantizationModeError,
                                   NotImplementedError))

        ids = keras.Input(shape=(3,), dtype="int64")
        x = CompressedEmbedding(V, D, combiner="sum", name="emb")(ids)
        model = keras.Model(ids, keras.layers.Dense(2, name="dense")(x))
        model.get_layer("emb").set_weights([table])
        model.quantize(mode)
        layer = model.get_layer("emb")
        self.assertEqual(layer.quantization_mode, mode)
        self.assertEqual(model.get_layer("dense").quantization_mode, mode)
        self.assertAllEqual(layer.embeddings_data.numpy(),
                            quantization.encode(table, mode)[0])
        x = np.array([[1, 2, 3]])
        dense = model.get_layer("dense")
        self.assertAllClose(model.predict(x, verbose=0),
                            dense(layer.dequantize()[x].sum(1)),
                            rtol=1e-5, atol=1e-6)


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


def unpack_levels(records, dim):
    """The int4 levels [V, dim] of int4 records (low nibble first)."""
    values = records[:, quantization.RECORD_HEADER_BYTES:]
    levels = np.empty((len(records), 2 * values.shape[1]), np.int16)
    levels[:, 0::2], levels[:, 1::2] = values & 0x0F, values >> 4
    return levels[:, :dim]


def int4_meta(records):
    """(scale, bias) float32 [V] of int4 records."""
    header = np.ascontiguousarray(records[:, :quantization.RECORD_HEADER_BYTES])
    meta = header.view("<f2").astype(np.float32)
    return meta[:, 0], meta[:, 1]


class QuantizeEmbeddingsTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(9)
        items = rng.integers(1, V, size=(5, L))
        items[2, 3:] = 0
        self.x = [items, rng.integers(0, 8, size=(5, 1))]

    @parameterized.parameters(*MODES)
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
            quantization.decode(data, scales, mode, D))
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
        again = quantize_embeddings(converted, "int4")
        self.assertEqual(again.layers[0].quantization_mode, "fp16")
        self.assertAllEqual(again(ids), converted(ids))

    def test_model_keras_quantized_itself_to_int8(self):
        model = stock_model()
        model.quantize("int8")  # Embeddings and the Dense head, Keras' way
        keras_item = model.get_layer("item_emb")
        self.assertEqual(keras_item.quantization_mode, "int8")
        values = keras_item.embeddings.numpy()
        inverse = keras_item.embeddings_scale.numpy()
        converted = quantize_embeddings(model, "int8")
        item = converted.get_layer("item_emb")
        self.assertIsInstance(item, CompressedEmbedding)
        self.assertEqual(item.quantization_mode, "int8")
        # Keras' int8 values are kept exactly, after their row's scale, the
        # inverse of Keras'.
        records = item.embeddings_data.numpy()
        header = quantization.RECORD_HEADER_BYTES
        self.assertAllEqual(records[:, header:].view(np.int8), values)
        scales = np.ascontiguousarray(records[:, :header]).view("<f4")[:, 0]
        self.assertAllClose(scales * inverse, np.ones(V), rtol=2 * EPS32, atol=0)
        self.assertEqual(converted.get_layer("head").quantization_mode, "int8")

        # Rows: Keras' q / s against the layer's q * (1 / s).
        ids = np.arange(V).reshape(5, 10)
        got, want = item(ids).numpy(), keras_item(ids).numpy()
        self.assertAllClose(got, want, rtol=4 * EPS32, atol=0)
        self.assertAllClose(converted(self.x), model(self.x),
                            rtol=1e-5, atol=1e-6)
        # "int8_split": the same values and scales, split; the same decoding.
        split = quantize_embeddings(model, "int8_split").get_layer("item_emb")
        self.assertEqual(split.quantization_mode, "int8_split")
        self.assertAllEqual(split.embeddings_data.numpy(), values)
        self.assertAllEqual(split.embeddings_scales.numpy(), scales)
        self.assertAllEqual(split(ids), got)
        # mode="fp16" keeps Keras' int8 table int8 (no float32 round trip).
        fp16 = quantize_embeddings(model, "fp16")
        self.assertEqual(fp16.get_layer("item_emb").quantization_mode, "int8")
        self.assertAllEqual(fp16.get_layer("item_emb")(ids), got)
        # mode="int4" is smaller: Keras' decoded table, encoded.
        int4 = quantize_embeddings(model, "int4").get_layer("item_emb")
        self.assertEqual(int4.quantization_mode, "int4")
        self.assertAllEqual(int4.embeddings_data.numpy(), quantization.encode(
            values.astype(np.float32) / inverse[:, None], "int4")[0])

    @parameterized.parameters(
        # Keras 3.15's default (block_size 128: one group of a row of D), a
        # block as wide as a row, and per-channel (Keras 3.13's only way).
        None, D, -1)
    def test_model_keras_quantized_itself_to_int4(self, block_size):
        if block_size is not None and not KERAS_INT4_BLOCKS:
            self.skipTest(NO_INT4_BLOCKS)
        model = stock_model()
        config = (None if block_size is None
                  else Int4QuantizationConfig(block_size=block_size))
        model.get_layer("item_emb").quantize("int4", config=config)
        keras_item = model.get_layer("item_emb")
        self.assertEqual(keras_item.quantization_mode, "int4")
        # The small user table stays a float32 Keras Embedding.
        converted = quantize_embeddings(model, "int4", min_rows=10)
        item = converted.get_layer("item_emb")
        self.assertIsInstance(item, CompressedEmbedding)
        self.assertEqual(item.quantization_mode, "int4")
        records = item.embeddings_data.numpy()
        self.assertEqual(records.shape, quantization.data_shape("int4", V, D))
        # Keras' levels, shifted to [0, 15].
        self.assertAllEqual(unpack_levels(records, D),
                            keras_item.embeddings.numpy().astype(np.int16) + 8)

        ids = np.arange(V).reshape(5, 10)
        got, want = item(ids).numpy(), keras_item(ids).numpy()
        self.assertAllEqual(got, item.dequantize()[ids])
        scale, bias = int4_meta(records)
        # Within the float16 rounding of scale and bias (see
        # keras_int4_to_tfce), plus float32 rounding.
        bound = (2.0 ** -11 * (15 * scale + np.abs(bias)) + 1e-30)[ids][..., None]
        err = np.abs(got - want)
        self.assertTrue((err <= bound + 4 * EPS32 * np.abs(want)).all(),
                        (err - bound).max())
        self.assertGreater(err.max(), 0)  # float16 rounding is seen
        if block_size == -1 or not KERAS_INT4_BLOCKS:
            # Per-channel rows are multiples of the rounded scale: exact
            # zeros where Keras has them.
            self.assertAllEqual(got == 0, want == 0)
        # A larger mode keeps it int4.
        for mode in ("int8", "fp16", "int8_split"):
            other = quantize_embeddings(model, mode).get_layer("item_emb")
            self.assertEqual(other.quantization_mode, "int4")
            self.assertAllEqual(other.embeddings_data.numpy(), records)
        self.assertAllClose(converted(self.x), model(self.x),
                            rtol=1e-3, atol=1e-3)

    def test_keras_int4_groups_narrower_than_a_row_are_refused(self):
        if not KERAS_INT4_BLOCKS:
            self.skipTest(NO_INT4_BLOCKS)
        model = stock_model()
        model.get_layer("item_emb").quantize(
            "int4", config=Int4QuantizationConfig(block_size=4))
        with self.assertRaisesRegex(ValueError, "3 groups per row.*"
                                    "block_size=-1"):
            quantize_embeddings(model, "int4")

    def test_keras_layout_functions(self):
        values = np.array([[127, -127, 0], [0, 0, 0]], np.int8)
        inverse = np.array([127 / 2.0, 127 / 1e-7], np.float32)
        data, scales = keras_int8_to_tfce(values, inverse)
        self.assertAllClose(quantization.decode(data, scales, "int8"),
                            [[2, -2, 0], [0, 0, 0]], rtol=2 * EPS32, atol=0)
        self.assertEqual(scales.shape, (0,))
        data, scales = keras_int8_to_tfce(values, inverse, format="int8_split")
        self.assertAllEqual(data, values)
        # 1 / Keras' scale; an all-zero row gets scale 0, as encoded rows.
        self.assertAllEqual(scales, [np.float32(1) / inverse[0], 0])
        for bad, match in (
                ((values.astype(np.int16), inverse), "int8 matrix"),
                ((values, inverse[:1]), r"shape \[2\]"),
                ((np.array([[-128, 0, 0], [0, 0, 0]], np.int8), inverse),
                 "-128 at row 0"),
                ((values, np.array([1.0, 0.0], np.float32)), "row 1 is 0.0")):
            with self.assertRaisesRegex(ValueError, match):
                keras_int8_to_tfce(*bad)
        with self.assertRaisesRegex(ValueError, "'int8' or 'int8_split'"):
            keras_int8_to_tfce(values, inverse, format="int4")

        levels = np.array([[-8, 7, 0], [1, -1, 3]], np.int8)
        inverse = np.array([7 / 2.0, 7.0], np.float32)
        data, _ = keras_int4_to_tfce(levels, inverse)
        # Per-channel: multiples of the float16 scale 1 / s, exactly.
        step = (1 / inverse).astype(np.float16).astype(np.float32)
        self.assertAllEqual(quantization.decode(data, np.zeros(0), "int4", 3),
                            levels * step[:, None])
        self.assertAllClose(step, [2 / 7, 1 / 7], rtol=2.0 ** -11)
        zero = np.array([[-8], [0]], np.int8)
        data, _ = keras_int4_to_tfce(levels, [[0.5], [0.25]], zero)
        self.assertAllClose(quantization.decode(data, np.zeros(0), "int4", 3),
                            [[0, 7.5, 4], [0.25, -0.25, 0.75]], rtol=1e-3)
        for args, match in (
                ((levels.astype(np.int16), [1.0, 1.0]), "int8 matrix"),
                ((np.array([[8, 0, 0], [0, 0, 0]], np.int8), [1.0, 1.0]),
                 r"\[-8, 7\], got \[0, 8\]"),
                ((levels, [1.0]), r"shape \[2\]"),
                ((levels, [1.0, np.nan]), "row 1 is nan"),
                ((levels, [[1.0], [1.0]], np.zeros((2, 2), np.int8)),
                 "must both have shape"),
                ((levels, [[1.0, 1.0], [1.0, 1.0]], np.zeros((2, 2), np.int8)),
                 "2 groups per row"),
                ((levels, [[1.0], [1e6]], zero), "row 1 is beyond")):
            with self.assertRaisesRegex(ValueError, match):
                keras_int4_to_tfce(*args)

    def test_refusals(self):
        model = stock_model()
        with self.assertRaisesRegex(ValueError, "format must be one of"):
            quantize_embeddings(model, "int2")
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

        nan = stock_model()
        table = nan.get_layer("item_emb").embeddings.numpy()
        table[7, 1] = np.nan
        nan.get_layer("item_emb").embeddings.assign(table)
        for mode in MODES:
            with self.assertRaisesRegex(ValueError, "non-finite.*row 7"):
                quantize_embeddings(nan, mode)

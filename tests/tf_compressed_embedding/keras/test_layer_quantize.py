"""CompressedEmbedding.quantize() in place, and quantize_embeddings() (model
conversion) against stock Keras."""
import gc
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
from layer_testing import D, EPS32, L, V, set_table


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

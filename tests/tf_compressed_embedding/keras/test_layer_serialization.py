"""CompressedEmbedding through .keras files and SavedModels, float32 and
quantized."""
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import CompressedEmbedding
from layer_testing import D, L, MODES, V


# Root of the package under test, for the fresh processes.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfce.__file__)))


# The quantized layers of mixed_model, and their modes.
MIXED_MODES = {"pooled_int8": "int8", "rows_fp16": "fp16", "pooled_int4": "int4",
               "rows_int4": "int4", "pooled_int8_split": "int8_split"}


def mixed_model(vocab=V):
    """Functional model over padded ids with a layer in every mode (rows and
    pooled) and one left float32."""
    ids = keras.Input(shape=(L,), dtype="int64", name="ids")
    pooled = [CompressedEmbedding(vocab, D, mask_zero=True, combiner="mean",
                                  name="pooled_int8")(ids),
              CompressedEmbedding(vocab, D, combiner="sqrtn",
                                  name="pooled_fp32")(ids),
              CompressedEmbedding(vocab, D, combiner="sum",
                                  name="pooled_int4")(ids),
              CompressedEmbedding(vocab, D, mask_zero=True, combiner="sqrtn",
                                  name="pooled_int8_split")(ids)]
    for name in ("rows_fp16", "rows_int4"):
        rows = CompressedEmbedding(vocab, D, name=name)(ids)
        pooled.append(keras.layers.GlobalAveragePooling1D()(rows))
    out = keras.layers.Dense(3)(keras.layers.Concatenate()(pooled))
    model = keras.Model(ids, out)
    for name, mode in MIXED_MODES.items():
        model.get_layer(name).quantize(mode)
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


class SerializationTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.ids = np.random.default_rng(8).integers(0, V, size=(6, L))
        self.ids[1, 2:] = 0
        self.ids[4] = 0  # an all-padding row

    @parameterized.parameters(*MODES)
    def test_config_round_trip(self, mode):
        layer = CompressedEmbedding(V, D, mask_zero=True, combiner="sqrtn",
                                    embeddings_initializer="normal",
                                    name="emb", dtype="mixed_bfloat16")
        layer.build()
        config = layer.get_config()
        self.assertEqual(config["quantization_mode"], None)
        clone = CompressedEmbedding.from_config(config)
        self.assertEqual(clone.get_config(), config)
        layer.quantize(mode)
        config = layer.get_config()
        self.assertEqual(config["quantization_mode"], mode)
        clone = CompressedEmbedding.from_config(config)
        self.assertEqual(clone.quantization_mode, mode)
        self.assertEqual(clone.get_config(), config)
        clone.build()
        self.assertEqual(
            [(v.dtype, tuple(v.shape)) for v in clone.weights],
            [(quantization.storage_dtype(mode).name,
              quantization.data_shape(mode, V, D)),
             ("float32", quantization.scales_shape(mode, V))])
        clone.set_weights(layer.get_weights())
        ids = np.array([[1, 2, 0], [49, 3, 3]])
        self.assertAllEqual(clone(ids), layer(ids))
        self.assertEqual(
            keras.saving.get_registered_name(CompressedEmbedding),
            "tf_compressed_embedding>CompressedEmbedding")

    @parameterized.parameters(*MODES)
    def test_constructor_weights(self, mode):
        table = np.random.default_rng(0).standard_normal((V, D)).astype(
            np.float32)
        layer = CompressedEmbedding(V, D, weights=table)
        self.assertAllEqual(layer.embeddings.numpy(), table)
        data, scales = quantization.encode(table, mode)
        layer = CompressedEmbedding(V, D, weights=[data, scales],
                                    quantization_mode=mode)
        decoded = quantization.decode(data, scales, mode, D)
        self.assertAllEqual(layer(np.array([3, -1])), decoded[[3, V - 1]])

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
        self.assertEqual(modes, {**MIXED_MODES, "pooled_fp32": None})
        loaded = keras.saving.load_model(
            os.path.join(self.get_temp_dir(), "mixed.keras"))
        for name in MIXED_MODES:
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
        for mode in MIXED_MODES.values():
            self.assertIn([quantization.storage_dtype(mode).name,
                           list(quantization.data_shape(mode, V, D))], variables)
            self.assertIn(["float32", list(quantization.scales_shape(mode, V))],
                          variables)
        self.assertEqual(variables.count(["float32", [V, D]]), 1)

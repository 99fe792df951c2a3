"""A .keras file (and its model.export() SavedModel) written by version 0.1.0
still loads and gives bit-identical outputs.

0.1.0's "int8" layers stored int8 [V, D] values and float32 [V] scales (the
layout now called "int8_split"). Loading them gives "int8" layers holding the
same values and scales packed as records (see load_own_variables): the
decoded tables are the same bits, and the kernels pool a record's
q * (w * scale) as they pooled the split layout's, so the outputs must be
the same bits on every kernel row. The file, its feeds, its tables and the
outputs 0.1.0 computed per row are in tests/data/legacy_keras_0.1.0, written
by tests/support/legacy_keras.py; each row runs in a fresh process with
TFCE_ISA set, and a row the host lacks, or that the writing host lacked, is
skipped and says so.
"""
import os
import zipfile

import keras
import legacy_keras
import numpy as np
import pytest
from repo_paths import TESTS

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import CompressedEmbedding

LEGACY = os.path.join(TESTS, "data", "legacy_keras_0.1.0")


@pytest.mark.parametrize("isa", ["scalar", "sse", "avx2", "avx512"])
def test_legacy_keras_file_agrees_bit_for_bit(isa):
    if isa not in tfce.supported_isas():
        pytest.skip(f"this CPU has no {isa} kernels")
    recorded = os.path.join(LEGACY, f"outputs_{isa}.npz")
    if not os.path.exists(recorded):
        pytest.skip(f"the host that wrote {LEGACY} had no {isa} kernels")
    got = legacy_keras.run_outputs(LEGACY, isa)
    with np.load(recorded) as want:
        assert sorted(got) == sorted(want.files)
        for key in want.files:
            assert got[key].dtype == want[key].dtype, key
            np.testing.assert_array_equal(got[key], want[key], err_msg=key,
                                          strict=True)


def test_legacy_int8_layers_load_as_int8_records():
    model = keras.saving.load_model(os.path.join(LEGACY, "model.keras"))
    modes = {}
    with np.load(os.path.join(LEGACY, "tables.npz")) as tables:
        for name, (_, mode, _) in legacy_keras.LAYERS.items():
            layer = model.get_layer(name)
            assert isinstance(layer, CompressedEmbedding)
            modes[name] = layer.quantization_mode
            if mode is None:
                assert name not in tables.files
                continue
            # The same decoded table, bit for bit, in the current layout.
            np.testing.assert_array_equal(layer.dequantize(), tables[name],
                                          strict=True)
            rows, dim = tables[name].shape
            assert layer.embeddings_data.shape == quantization.data_shape(
                mode, rows, dim)
            assert layer.embeddings_data.dtype == quantization.storage_dtype(mode)
            assert layer.embeddings_scales.shape == quantization.scales_shape(
                mode, rows)
    assert modes == {name: mode for name, (_, mode, _)
                     in legacy_keras.LAYERS.items()}
    # Saved again, it is an ordinary file of the current version.
    assert model.get_layer("mean_int8").get_config()["quantization_mode"] == "int8"


def test_legacy_weights_file_loads_into_a_model_built_now(tmp_path):
    # model.load_weights() of 0.1.0's weights (the .weights.h5 inside the
    # .keras file) into the same model built and quantized with the current
    # code: its "int8" layers take the split layout too. This process runs
    # the default kernel row.
    with zipfile.ZipFile(os.path.join(LEGACY, "model.keras")) as archive:
        archive.extract("model.weights.h5", tmp_path)
    model = legacy_keras.build_model(np.random.default_rng(0))
    model.load_weights(os.path.join(tmp_path, "model.weights.h5"))
    recorded = os.path.join(LEGACY, f"outputs_{tfce.active_isa()}.npz")
    if not os.path.exists(recorded):
        pytest.skip(f"the host that wrote {LEGACY} had no "
                    f"{tfce.active_isa()} kernels")
    outputs = model(legacy_keras.load_feeds(LEGACY))
    with np.load(recorded) as want:
        for name, got in outputs.items():
            np.testing.assert_array_equal(np.asarray(got), want[f"keras|{name}"],
                                          err_msg=name, strict=True)

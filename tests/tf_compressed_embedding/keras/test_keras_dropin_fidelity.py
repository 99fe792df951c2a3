"""The cases Keras 3's own tests of keras.layers.Embedding check (their
embedding_test.py: sparse and ragged ids, masking, quantization modes and
policies, the errors of quantize), run against CompressedEmbedding and
compared with keras.layers.Embedding holding the same (decoded) table."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import (CompressedEmbedding,
                                            UnsupportedQuantizationModeError)
from layer_testing import KERAS_INT4_BLOCKS, MODES, NO_INT4_BLOCKS

V, D = 10, 3


def pair(mode, mask_zero=False):
    """(ours, Keras' Embedding) holding the same table (ours decoded)."""
    rng = np.random.default_rng(0)
    ours = CompressedEmbedding(V, D, mask_zero=mask_zero)
    ours.build()
    ours.set_weights([rng.normal(size=(V, D)).astype(np.float32)])
    if mode:
        ours.quantize(mode)
    stock = keras.layers.Embedding(V, D, mask_zero=mask_zero)
    stock.build()
    stock.set_weights([ours.dequantize()])
    return ours, stock


@pytest.mark.parametrize("mode", [None, *MODES])
def test_sparse_ids_without_combiner(mode):
    ours, stock = pair(mode)
    ids = tf.SparseTensor([[0, 0], [1, 1], [1, 2]],
                          tf.constant([1, 2, -3], tf.int64), [2, 3])
    got, want = ours(ids), stock(ids)
    assert isinstance(got, tf.Tensor) and got.shape == want.shape == (2, 3, D)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", [None, *MODES])
def test_ragged_ids_without_combiner(mode):
    ours, stock = pair(mode)
    ids = tf.ragged.constant([[1, 2, -1], [], [9]], tf.int64)
    got, want = ours(ids), stock(ids)
    assert isinstance(got, tf.RaggedTensor)
    np.testing.assert_array_equal(got.row_splits, want.row_splits)
    np.testing.assert_allclose(got.flat_values, want.flat_values, rtol=1e-6)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_ragged_functional_model_without_combiner(mode):
    ours, stock = pair(mode)
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    for layer in (ours, stock):
        inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
        model = keras.Model(inp, layer(inp))
        out = model(ids)
        assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_allclose(
        keras.Model(inp, ours(inp))(ids).flat_values,
        stock(ids).flat_values, rtol=1e-6)


@pytest.mark.parametrize("mode", [None, *MODES])
def test_mask_zero(mode):
    ours, stock = pair(mode, mask_zero=True)
    ids = np.array([[1, 0, 2], [0, 0, 3]])
    np.testing.assert_array_equal(ours.compute_mask(ids),
                                  stock.compute_mask(ids))
    np.testing.assert_allclose(ours(ids), stock(ids), rtol=1e-6)


@pytest.mark.parametrize("policy,mode", [
    ("int8_from_float32", "int8"), ("int4_from_float32", "int4"),
    # Keras 3.15's int4 names carry a block size; a row is one block here.
    ("int4/128_from_float32", "int4"), ("int4/-1_from_mixed_bfloat16", "int4")])
def test_keras_quantized_policy_builds_a_compressed_layer(policy, mode):
    if "/" in policy and not KERAS_INT4_BLOCKS:
        pytest.skip(NO_INT4_BLOCKS)
    # What the config of a layer Keras quantized carries.
    stock = keras.layers.Embedding(V, D, dtype=policy)
    stock.build()
    ours = CompressedEmbedding(V, D, dtype=policy)
    ours.build()
    assert ours.quantization_mode == stock.quantization_mode == mode
    assert ours.dtype_policy.name == policy.split("_from_")[1]
    assert not ours.trainable_weights
    assert [(w.dtype, tuple(w.shape)) for w in ours.weights] == [
        ("uint8", quantization.data_shape(mode, V, D)), ("float32", (0,))]
    restored = CompressedEmbedding.from_config(ours.get_config())
    restored.build()
    assert restored.quantization_mode == mode


def test_keras_quantized_policy_of_another_mode_is_refused():
    with pytest.raises(UnsupportedQuantizationModeError,
                       match="must be one of 'int4', 'int8', 'fp16', "
                             "'int8_split', got 'float8'"):
        CompressedEmbedding(V, D, dtype="float8_from_float32")
    with pytest.raises(ValueError, match="contradicts"):
        CompressedEmbedding(V, D, dtype="int8_from_float32",
                            quantization_mode="fp16")


def test_quantize_errors_as_keras_gives_them():
    ours, stock = pair(None)
    unbuilt = CompressedEmbedding(V, D)
    for mode in MODES:
        with pytest.raises(ValueError, match="not built"):
            unbuilt.quantize(mode)
    with pytest.raises(ValueError):
        stock.quantize("int4x")
    with pytest.raises(UnsupportedQuantizationModeError,
                       match="got 'int4x'"):
        ours.quantize("int4x")
    with pytest.raises(ValueError, match="got None"):
        ours.quantize()
    ours.quantize("int8")
    with pytest.raises(ValueError, match="already quantized to 'int8'"):
        ours.quantize("int8")


def test_sparse_positions_without_an_id_as_keras_gives_them():
    # Keras' own sparse case, on a table whose row 0 is not zero, so the
    # value at a position without an id is seen.
    table = np.array([[5.0, -5.0], [2.0, 2.0], [3.0, 3.0]], np.float32)
    ids = tf.SparseTensor([[0, 0], [1, 2]], tf.constant([2, 1], tf.int64),
                          [2, 3])
    stock = keras.layers.Embedding(3, 2, weights=table)
    for mode in (None, *MODES):
        ours = CompressedEmbedding(3, 2, weights=table)
        if mode:
            ours.quantize(mode)
        np.testing.assert_allclose(ours(ids), stock(ids), atol=0.03)


def test_constructor_weights_and_constraint():
    ones = np.ones((3, 4), np.float32)
    for weights in (ones, [ones]):
        ours = CompressedEmbedding(3, 4, weights=weights)
        stock = keras.layers.Embedding(3, 4, weights=weights)
        np.testing.assert_array_equal(ours.embeddings.numpy(),
                                      stock.embeddings.numpy())
    ours = CompressedEmbedding(3, 2, embeddings_constraint="non_neg")
    ours.build()
    assert isinstance(ours.embeddings.constraint, keras.constraints.NonNeg)


def test_compute_mask_without_mask_zero():
    ours, stock = pair(None)
    ids = np.array([2, 1, 0])
    assert ours.compute_mask(ids) is None
    assert stock.compute_mask(ids) is None


@pytest.mark.parametrize("mode", MODES)
def test_setting_a_quantized_dtype_policy_quantizes(mode):
    # Keras: `layer.dtype_policy = "int8_from_float32"` on a built layer
    # quantizes it. Our "fp16" and "int8_split" modes have no Keras policy
    # name, so only int8 and int4 are reachable this way; the others stay on
    # quantize().
    ours, _ = pair(None)
    ids = np.array([[1, 2], [3, 9]])
    if mode in ("int8", "int4"):
        table = ours.embeddings.numpy()
        ours.dtype_policy = f"{mode}_from_float32"
        assert ours.quantization_mode == mode
        assert [w.dtype for w in ours.weights] == ["uint8", "float32"]
        decoded = quantization.decode(*quantization.encode(table, mode), mode, D)
        np.testing.assert_array_equal(ours.dequantize(), decoded)
        np.testing.assert_array_equal(ours(ids), decoded[ids])
    else:
        with pytest.raises(ValueError):
            ours.dtype_policy = f"{mode}_from_float32"


def test_lora_is_refused_with_what_to_do():
    ours, stock = pair(None)
    stock.enable_lora(2)  # Keras' own layer takes it
    with pytest.raises(NotImplementedError, match="quantize_embeddings"):
        ours.enable_lora(2)
    with pytest.raises(NotImplementedError, match="quantize_embeddings"):
        CompressedEmbedding(V, D, lora_rank=2)

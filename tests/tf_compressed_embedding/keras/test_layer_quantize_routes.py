"""Quantizing a trained model: by every documented route, and after the
model's functions were traced on the float32 table (a prior predict / fit /
tf.function), every way of running it computes on the compressed table or
fails loudly — never silently in float32.

The reference is numpy: the layer's decoded table pooled by hand and the
Dense layer applied, so the expected output is the quantized model's, and
it differs from the float32 model's by more than the tolerance (checked, so
a float32 answer fails the test).
"""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_compressed_embedding  # noqa: F401  (registers the ops)
from tf_compressed_embedding import quantization
from tf_compressed_embedding.layers import CompressedEmbedding

VOCAB, DIM, BAG = 64, 8, 5
TOL = 1e-5  # float32 summation order; the formats' error is far larger


def build(combiner):
    ids = keras.Input(shape=(BAG,), dtype="int64")
    emb = CompressedEmbedding(VOCAB, DIM, combiner=combiner,
                              embeddings_initializer="normal",
                              name="table")
    pooled = emb(ids)
    if combiner is None:
        pooled = keras.layers.Flatten()(pooled)
    model = keras.Model(ids, keras.layers.Dense(
        1, kernel_initializer="ones", name="head")(pooled))
    model.compile("adam", "mse")
    return model, emb


def expected(model, emb, x):
    """The model's output computed with numpy on the layer's decoded table."""
    rows = emb.dequantize()[x]  # [B, L, D]
    pooled = {None: lambda: rows.reshape(len(x), -1),
              "sum": lambda: rows.sum(axis=1),
              "mean": lambda: rows.mean(axis=1)}[emb.combiner]()
    kernel, bias = model.get_layer("head").get_weights()
    return pooled @ kernel + bias


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, size=(32, BAG)).astype(np.int64)
    return x, rng.normal(size=(32, 1)).astype(np.float32)


def quantize(route, model, emb, mode):
    if route == "layer":
        emb.quantize(mode)
    else:
        # Only the table: Keras would quantize the Dense head too.
        model.quantize(mode, filters="table")


def trained_then_quantized(route, mode, combiner, warm):
    """A model whose functions were traced on float32, then quantized.

    Returns (model, layer, x, float32 output before quantizing)."""
    model, emb = build(combiner)
    x, y = data()
    if warm in ("fit", "both"):
        model.fit(x, y, epochs=1, verbose=0)
    before = model.predict(x, verbose=0)
    if warm in ("evaluate", "both"):
        model.evaluate(x, y, verbose=0)
    quantize(route, model, emb, mode)
    assert emb.quantization_mode == mode
    want = expected(model, emb, x)
    # The test can tell the two apart: quantization moved the output.
    assert np.abs(before - want).max() > 5 * TOL
    return model, emb, x, want


# model.quantize reaches the layer with Keras' mode names only.
ROUTES = [("layer", "int8", "mean"), ("layer", "fp16", "sum"),
          ("layer", "int8", None), ("model", "int8", "mean"),
          ("layer", "int4", "sum"), ("layer", "int4", None),
          ("model", "int4", "mean"), ("layer", "int8_split", "mean")]


@pytest.mark.parametrize("route,mode,combiner", ROUTES)
@pytest.mark.parametrize("warm", ["predict", "fit", "both"])
def test_predict_and_evaluate_run_on_the_compressed_table(route, mode,
                                                          combiner, warm):
    model, _, x, want = trained_then_quantized(route, mode, combiner, warm)
    np.testing.assert_allclose(model.predict(x, verbose=0), want, atol=TOL)
    y = np.zeros((len(x), 1), np.float32)
    loss = model.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(loss, np.mean(want ** 2), rtol=1e-5)
    np.testing.assert_allclose(model(x).numpy(), want, atol=TOL)


@pytest.mark.parametrize("route", ["layer", "model"])
def test_the_float32_table_is_freed_and_a_stale_trace_fails_loudly(route):
    model, emb = build("mean")
    x, _ = data()
    float_table = emb.embeddings
    stale = tf.function(lambda ids: model(ids))
    stale(x)  # traced on the float32 table
    quantize(route, model, emb, "int8")
    # Emptied: its memory is gone although `float_table` and the trace
    # still hold the variable.
    assert tf.shape(float_table.value).numpy().tolist() == [0, DIM]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[0\] = \d+ is not in \[0, 0\)"):
        stale(x)
    fresh = tf.function(lambda ids: model(ids))
    np.testing.assert_allclose(fresh(x).numpy(), expected(model, emb, x),
                               atol=TOL)


# fp16 moves a mean by too little to tell from float32 (see
# trained_then_quantized): it is saved pooling with "sum".
SAVE_ROUTES = [("layer", "int8", "mean"), ("model", "int8", "mean"),
               ("model", "int4", "mean"), ("layer", "fp16", "sum"),
               ("layer", "int8_split", None)]


@pytest.mark.parametrize("route,mode,combiner", SAVE_ROUTES)
def test_keras_file_after_prior_fit(route, mode, combiner, tmp_path):
    model, emb, x, want = trained_then_quantized(route, mode, combiner, "both")
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("table").quantization_mode == mode
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, atol=TOL)


@pytest.mark.parametrize("route,mode,combiner", SAVE_ROUTES)
def test_export_after_prior_fit(route, mode, combiner, tmp_path):
    model, emb, x, want = trained_then_quantized(route, mode, combiner, "both")
    path = os.path.join(tmp_path, "exported")
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(served.serve(x).numpy(), want, atol=TOL)
    # The export holds the compressed table, not a float32 one.
    shapes = {(v.dtype.name, tuple(v.shape)) for v in served.variables}
    assert (quantization.storage_dtype(mode).name,
            quantization.data_shape(mode, VOCAB, DIM)) in shapes
    assert ("float32", (VOCAB, DIM)) not in shapes

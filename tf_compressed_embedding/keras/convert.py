"""Converting trained Keras models to compressed embeddings: a copy of a
model with its tables compressed, and Keras' own int8 Embedding layout in
the ``"int8"`` format."""
from __future__ import annotations

import keras
import numpy as np

from tf_compressed_embedding import quantization
from tf_compressed_embedding.keras._keras_api import float_policy, to_numpy
from tf_compressed_embedding.keras.layer import CompressedEmbedding


def quantize_embeddings(model: keras.Model, mode: str,
                        min_rows: int = 0) -> keras.Model:
    """Returns a copy of ``model`` with its embedding tables compressed.

    Every ``keras.layers.Embedding`` (the class itself; subclasses such as
    ``ReversibleEmbedding`` behave differently and are copied unchanged) and
    every float32 ``CompressedEmbedding`` with at least ``min_rows`` rows
    becomes a ``CompressedEmbedding`` in ``mode`` with the same name, mask
    behaviour and trained values:

    - a float32 table is encoded with ``tf_compressed_embedding.quantization``;
    - an Embedding that Keras itself quantized to int8
      (``layer.quantize("int8")`` / ``model.quantize("int8")``) keeps its int8
      values exactly, and its per-row scales are converted (Keras stores the
      inverse ``127 / max|row|`` and divides; the result stores
      ``1 / that`` and multiplies), so nothing goes back through float32. It
      becomes an ``"int8"`` layer whatever ``mode`` is: decoding it to fp16
      would double its memory and add no accuracy.

    Every other layer (and a ``CompressedEmbedding`` that is already
    quantized, or a table under ``min_rows``) is a fresh copy with the
    source's weights, nested Sequential/Functional models included. The
    source model is not modified. The copy is not compiled.

    Args:
      model: a built Functional or Sequential ``keras.Model``.
      mode: ``"int8"`` or ``"fp16"``.
      min_rows: tables with fewer rows stay as they are.

    Returns:
      A new ``keras.Model``.

    Raises:
      ValueError: unknown mode, negative ``min_rows``, a subclassed model,
        an unbuilt embedding, a table that cannot be encoded (NaN/Inf, fp16
        overflow), or an Embedding in a Keras quantization mode other than
        int8 (or int8 with LoRA enabled).
      TypeError: ``model`` is not a ``keras.Model``.
    """
    quantization.check_format(mode)
    if (isinstance(min_rows, bool)
            or not isinstance(min_rows, (int, np.integer)) or min_rows < 0):
        raise ValueError(f"min_rows must be a non-negative integer, got "
                         f"{min_rows!r}")
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got "
                        f"{type(model).__name__}")

    copies = []  # (source, copy) whose weights are copied once built

    def clone(layer):
        if _is_table(layer) and layer.input_dim >= min_rows:
            return _compressed_copy(layer, mode)
        new = layer.__class__.from_config(layer.get_config())
        # Functional graphs also hold stateless ops (e.g. a mask's
        # NotEqual); only layers have weights to copy.
        if isinstance(layer, keras.layers.Layer):
            copies.append((layer, new))
        return new

    def _is_table(layer):
        if type(layer) is keras.layers.Embedding:
            return True
        return (isinstance(layer, CompressedEmbedding)
                and layer.quantization_mode is None)

    try:
        converted = keras.models.clone_model(model, clone_function=clone,
                                             recursive=True)
    except ValueError as e:
        if "only supported for Sequential" in str(e):
            raise ValueError(
                f"quantize_embeddings needs a Functional or Sequential model; "
                f"{type(model).__name__} is subclassed: build it with "
                f"CompressedEmbedding layers and call quantize() on "
                f"them instead") from e
        raise
    # Layers are built while the copy is wired up; only then can they take
    # the source's weights.
    for source, new in copies:
        new.set_weights(source.get_weights())
    return converted


def _compressed_copy(layer, mode):
    """A built CompressedEmbedding holding ``layer``'s table in ``mode``."""
    if not layer.built:
        raise ValueError(f"embedding layer {layer.name!r} is not built: "
                         f"convert a trained (built) model")
    keras_mode = layer.quantization_mode
    if isinstance(layer, CompressedEmbedding) or keras_mode is None:
        # .embeddings of a keras Embedding with LoRA is the merged table.
        table = to_numpy(layer.embeddings)
        data, scales = quantization.encode(table, mode)
    elif keras_mode == "int8":
        if layer.lora_enabled:
            raise ValueError(
                f"Embedding {layer.name!r} is Keras int8 with LoRA enabled: "
                f"merge the LoRA weights into a float32 table first")
        mode = "int8"
        data, scales = keras_int8_to_tfce(
            to_numpy(layer.embeddings),
            to_numpy(layer.embeddings_scale), layer.name)
    else:
        raise ValueError(
            f"Embedding {layer.name!r} is quantized by Keras to "
            f"{keras_mode!r}, which has no exact compressed equivalent; "
            f"convert the float32 model (only Keras int8 converts directly)")
    config = layer.get_config()
    new = CompressedEmbedding(
        input_dim=layer.input_dim, output_dim=layer.output_dim,
        embeddings_initializer=config.get("embeddings_initializer"),
        embeddings_regularizer=config.get("embeddings_regularizer"),
        activity_regularizer=config.get("activity_regularizer"),
        embeddings_constraint=config.get("embeddings_constraint"),
        mask_zero=layer.mask_zero,
        combiner=getattr(layer, "combiner", None),
        quantization_mode=mode,
        name=layer.name, trainable=layer.trainable,
        dtype=float_policy(layer.dtype_policy))
    new.build()
    new.set_weights([data, scales])
    return new


def keras_int8_to_tfce(values: np.ndarray, inverse_scales: np.ndarray,
                       name: str = "embedding") -> tuple[np.ndarray, np.ndarray]:
    """Converts Keras' int8 Embedding layout to the ``"int8"`` format.

    Keras stores ``q = round(x * s)`` with ``s = 127 / (max|row| + eps)`` and
    decodes ``q / s``; the format stores the same ``q`` with ``1 / s`` and
    decodes ``q * (1 / s)``, equal to Keras' values within float32 rounding
    (one rounding of the reciprocal, one of the product).

    Args:
      values: int8 ``[V, D]`` (Keras' ``layer.embeddings`` in int8 mode).
      inverse_scales: float ``[V]`` (Keras' ``layer.embeddings_scale``).
      name: the layer, for error messages.

    Returns:
      (data int8 ``[V, D]``, scales float32 ``[V]``).
    """
    values = np.asarray(values)
    inverse_scales = np.asarray(inverse_scales)
    if values.dtype != np.int8 or values.ndim != 2:
        raise ValueError(f"{name}: Keras int8 embeddings must be an int8 "
                         f"matrix, got {values.dtype}{list(values.shape)}")
    if inverse_scales.shape != (values.shape[0],):
        raise ValueError(f"{name}: Keras int8 scales must have shape "
                         f"[{values.shape[0]}] (one per row), got "
                         f"{list(inverse_scales.shape)}")
    if values.size and values.min() < -quantization.INT8_MAX:
        # -128 does not occur in Keras' [-127, 127] range; the ops take it,
        # but the format (and its error bound) does not.
        row = int(np.argwhere(values < -quantization.INT8_MAX)[0][0])
        raise ValueError(f"{name}: int8 value -128 at row {row} is outside "
                         f"the format's range [-127, 127]")
    inverse_scales = inverse_scales.astype(np.float32)
    bad = ~(np.isfinite(inverse_scales) & (inverse_scales > 0))
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{name}: Keras int8 scale of row {row} is "
                         f"{inverse_scales[row]}; scales must be finite and "
                         f"positive")
    with np.errstate(over="ignore", under="ignore"):
        scales = (np.float32(1) / inverse_scales).astype(np.float32)
    # Rows Keras stored as all zeros get scale 0, as the format encodes them.
    scales[~values.any(axis=1)] = 0
    return values.copy(), scales

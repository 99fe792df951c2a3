"""Converting trained Keras models to compressed embeddings: a copy of a
model with its tables compressed, and Keras' own quantized Embedding layouts
(int8, int4) in the formats ``"int8"`` and ``"int4"``."""
from __future__ import annotations

import keras
import numpy as np

from tf_compressed_embedding import quantization
from tf_compressed_embedding.keras import _layouts
from tf_compressed_embedding.keras._keras_api import float_policy, keras_mask, to_numpy
from tf_compressed_embedding.keras.collection import \
    CompressedEmbeddingCollection
from tf_compressed_embedding.keras.layer import CompressedEmbedding


def quantize_embeddings(model: keras.Model, mode: str,
                        min_rows: int = 0, batch: bool = True) -> keras.Model:
    """Returns a copy of ``model`` with its embedding tables compressed.

    Every ``keras.layers.Embedding`` (the class itself; subclasses such as
    ``ReversibleEmbedding`` behave differently and are copied unchanged) and
    every float32 ``CompressedEmbedding`` with at least ``min_rows`` rows
    becomes a ``CompressedEmbedding`` in ``mode`` with the same name, mask
    behaviour and trained values:

    - a float32 table is encoded with ``tf_compressed_embedding.quantization``;
    - an Embedding that Keras itself quantized keeps its quantized values
      (:func:`keras_int8_to_tfce`, :func:`keras_int4_to_tfce`), so nothing
      goes back through float32: Keras int8 becomes ``"int8"`` (or
      ``"int8_split"`` when that is ``mode``), its scales inverted (Keras
      stores ``127 / max|row|`` and divides, the formats multiply); Keras
      int4 becomes ``"int4"``, its levels shifted to ``[0, 15]`` and its
      scale and zero point made a float16 scale and bias. A ``mode`` that
      would take more memory (fp16 for either; int8, int8_split for int4)
      is not applied: it would add no accuracy. ``mode="int4"`` on a Keras int8
      layer encodes the table Keras decodes (``q / s``) as int4.

    Every other layer (and a ``CompressedEmbedding`` that is already
    quantized, or a table under ``min_rows``) is a fresh copy with the
    source's weights, nested Sequential/Functional models included. The
    source model is not modified. The copy is not compiled.

    With ``batch`` (the default), two or more quantized pooling layers
    (``combiner`` set, called without a mask) whose outputs are side by
    side among a ``Concatenate``'s inputs (on the last axis) are pooled by
    one :class:`CompressedEmbeddingCollection`: one op call for all of
    them, the same values.

    Args:
      model: a built Functional or Sequential ``keras.Model``.
      mode: ``"int8"``, ``"int4"``, ``"fp16"`` or ``"int8_split"``.
      min_rows: tables with fewer rows stay as they are.
      batch: merge pooled layers that feed one ``Concatenate``.

    Returns:
      A new ``keras.Model``.

    Raises:
      ValueError: unknown mode, negative ``min_rows``, a subclassed model,
        an unbuilt embedding, a table that cannot be encoded (NaN/Inf, fp16
        overflow), or an Embedding in a Keras quantization mode other than
        int8 and int4, int4 with several groups per row (a ``block_size``
        under ``output_dim``), or with LoRA enabled.
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
        converted = keras.models.clone_model(
            model, clone_function=clone, recursive=True,
            # A Sequential model lists its layers (none is called while
            # it is cloned, and it has no Concatenate to merge into).
            call_function=(_BatchingCalls() if batch and not isinstance(
                model, keras.Sequential) else None))
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


class _BatchingCalls:
    """clone_model's call_function: remembers the pooled outputs of
    quantized CompressedEmbedding layers, and calls a Concatenate of two or
    more of them side by side on one CompressedEmbeddingCollection of their
    layers instead (their own calls are then unused, and not in the model).
    """

    def __init__(self):
        self.pooled = {}  # id(output) -> (layer, ids, weights)

    def __call__(self, layer, *args, **kwargs):
        if isinstance(layer, keras.layers.Concatenate) and args:
            merged = self._merged(layer, args[0])
            if merged is not None:
                if len(merged) == 1:  # a Concatenate of one input
                    return merged[0]
                return layer(merged, *args[1:], **kwargs)
        out = layer(*args, **kwargs)
        # A mask reaches the layer as a call argument or, from an upstream
        # layer, on its ids (Keras passes that on itself, so it is not in
        # kwargs); the collection reads neither, so masked calls stay apart.
        if (isinstance(layer, CompressedEmbedding) and layer.combiner is not None
                and layer.quantization_mode is not None and len(args) == 1
                and set(kwargs) <= {"weights"}
                and keras_mask(args[0]) is None):
            self.pooled[id(out)] = (layer, args[0], kwargs.get("weights"))
        return out

    def _merged(self, concatenate, tensors):
        """The Concatenate's inputs with each run of two or more pooled
        outputs replaced by one collection's output; None if there is none."""
        if (not isinstance(tensors, (list, tuple))
                or concatenate.axis not in (-1, 1)):
            return None
        result, run, merged = [], [], 0
        for tensor in list(tensors) + [None]:
            if tensor is not None and id(tensor) in self.pooled:
                run.append(tensor)
                continue
            if len(run) >= 2:
                layers, ids, weights = zip(*(self.pooled[id(t)] for t in run))
                suffix = f"_{merged}" if merged else ""
                result.append(CompressedEmbeddingCollection(
                    list(layers), name=f"{concatenate.name}_collection{suffix}")(
                        list(ids), weights=list(weights)))
                merged += 1
            else:
                result.extend(run)
            run = []
            if tensor is not None:
                result.append(tensor)
        return result if merged else None


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
    elif keras_mode in ("int8", "int4"):
        mode, (data, scales) = _from_keras_quantized(layer, keras_mode, mode)
    else:
        raise ValueError(
            f"Embedding {layer.name!r} is quantized by Keras to "
            f"{keras_mode!r}, which has no exact compressed equivalent; "
            f"convert the float32 model (Keras int8 and int4 convert "
            f"directly)")
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


def _from_keras_quantized(layer, keras_mode, mode):
    """(format, (data, scales)) of a layer Keras quantized (see
    quantize_embeddings for which format)."""
    if layer.lora_enabled:
        raise ValueError(
            f"Embedding {layer.name!r} is Keras {keras_mode} with LoRA "
            f"enabled: merge the LoRA weights into a float32 table first")
    scale = to_numpy(layer.embeddings_scale)
    if keras_mode == "int4":
        # Grouped int4 (Keras 3.15's default) has a zero point per group.
        zero = getattr(layer, "embeddings_zero", None)
        return "int4", keras_int4_to_tfce(
            to_numpy(layer.embeddings), scale,
            None if zero is None else to_numpy(zero), layer.name)
    values = to_numpy(layer.embeddings)
    if mode == "int4":
        # Smaller than int8: encode the table Keras decodes (q / s).
        table = values.astype(np.float32) / scale.astype(np.float32)[:, None]
        return "int4", quantization.encode(table, "int4")
    fmt = "int8_split" if mode == "int8_split" else "int8"
    return fmt, keras_int8_to_tfce(values, scale, layer.name, fmt)


def keras_int8_to_tfce(values: np.ndarray, inverse_scales: np.ndarray,
                       name: str = "embedding", format: str = "int8",  # noqa: A002
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Converts Keras' int8 Embedding layout to the ``"int8"`` format (or
    ``"int8_split"``).

    Keras stores ``q = round(x * s)`` with ``s = 127 / (max|row| + eps)`` and
    decodes ``q / s``; the format stores the same ``q`` with ``1 / s`` and
    decodes ``q * (1 / s)``, equal to Keras' values within float32 rounding
    (one rounding of the reciprocal, one of the product).

    Args:
      values: int8 ``[V, D]`` (Keras' ``layer.embeddings`` in int8 mode).
      inverse_scales: float ``[V]`` (Keras' ``layer.embeddings_scale``).
      name: the layer, for error messages.
      format: ``"int8"`` (records) or ``"int8_split"``.

    Returns:
      (data, scales) of ``format``: ``"int8"``: uint8 records ``[V, 4 + D]``
      and float32 ``[0]``; ``"int8_split"``: int8 ``[V, D]`` and float32
      ``[V]``.
    """
    if format not in ("int8", "int8_split"):
        raise ValueError(f"format must be 'int8' or 'int8_split', got "
                         f"{format!r}")
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
    if format == "int8":
        return (_layouts.int8_records(values, scales),
                np.zeros(quantization.scales_shape("int8", len(values)), np.float32))
    return values.copy(), scales


def keras_int4_to_tfce(values: np.ndarray, scale: np.ndarray,
                       zero: np.ndarray | None = None,
                       name: str = "embedding") -> tuple[np.ndarray, np.ndarray]:
    """Converts Keras' int4 Embedding layout to the ``"int4"`` format.

    Keras keeps levels ``q`` in ``[-8, 7]`` (packed two to a byte; its
    ``layer.embeddings`` unpacks them) and decodes them per row in one of two
    ways: ``q / s`` with ``s = 7 / max|row|`` (per-channel: ``block_size``
    -1, and the only way in Keras 3.13), or ``(q - z) * s`` with a scale
    ``s`` and an integer zero point ``z`` per group of ``block_size`` values
    (asymmetric; Keras 3.15's default, ``block_size`` 128; one group per row
    when ``block_size`` is at least D). The format keeps the levels as ``q + 8`` in ``[0, 15]``
    and stores float16 ``scale = 1 / s`` and ``bias = -8 * scale``
    (per-channel: the values are exact multiples of the rounded scale) or
    ``scale = s`` and ``bias = (-8 - z) * s``. Keras' values are kept within
    the float16 rounding of scale and bias: ``|error| <= 2**-11 (15 scale +
    |bias|)``, under 1.5% of a step ``scale`` (for float16 normals). Rows of several
    groups have no per-row equivalent and are refused.

    Args:
      values: int8 ``[V, D]`` levels in ``[-8, 7]`` (Keras' ``layer.embeddings``
        in int4 mode).
      scale: float ``[V]`` (per-channel: Keras' inverse scale ``s``) or
        ``[V, groups]`` (with ``zero``).
      zero: None (per-channel), or the integer zero points ``[V, groups]``.
      name: the layer, for error messages.

    Returns:
      (uint8 records ``[V, 4 + ceil(D / 2)]``, float32 scales ``[0]``).
    """
    values = np.asarray(values)
    scale = np.asarray(scale, np.float64)
    if values.dtype != np.int8 or values.ndim != 2:
        raise ValueError(f"{name}: Keras int4 embeddings must be an int8 "
                         f"matrix [V, D], got {values.dtype}{list(values.shape)}")
    rows, dim = values.shape
    if values.size and (values.min() < -8 or values.max() > 7):
        raise ValueError(f"{name}: Keras int4 levels must be in [-8, 7], got "
                         f"[{values.min()}, {values.max()}]")
    if zero is None:
        if scale.shape != (rows,):
            raise ValueError(f"{name}: Keras per-channel int4 scales must have "
                             f"shape [{rows}], got {list(scale.shape)}")
        bad = ~(np.isfinite(scale) & (scale > 0))
    else:
        zero = np.asarray(zero)
        if scale.shape != zero.shape or scale.ndim != 2 or scale.shape[0] != rows:
            raise ValueError(
                f"{name}: Keras int4 scales and zero points must both have "
                f"shape [{rows}, groups], got {list(scale.shape)} and "
                f"{list(zero.shape)}")
        if scale.shape[1] != 1:
            raise ValueError(
                f"{name}: Keras int4 with {scale.shape[1]} groups per row "
                f"(block_size under output_dim={dim}) has no equivalent: the "
                f"int4 format has one scale and bias per row. Convert the "
                f"float32 model, or quantize it in Keras with "
                f"Int4QuantizationConfig(block_size=-1) (or a block_size of "
                f"at least {dim})")
        scale, zero = scale[:, 0], zero[:, 0].astype(np.float64)
        bad = ~(np.isfinite(scale) & (scale > 0))
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{name}: Keras int4 scale of row {row} is "
                         f"{scale[row]}; scales must be finite and positive")
    with np.errstate(over="ignore"):
        if zero is None:
            step = (1 / scale).astype(np.float16)
            bias = (np.float32(-8) * step.astype(np.float32)).astype(np.float16)
        else:
            step = scale.astype(np.float16)
            bias = ((-8 - zero) * scale).astype(np.float16)
    bad = ~(np.isfinite(step) & np.isfinite(bias))
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{name}: the Keras int4 scale of row {row} is beyond "
                         f"what the format's float16 scale and bias can hold")
    return (_layouts.int4_records(values.astype(np.int16) + 8, step, bias),
            np.zeros(quantization.scales_shape("int4", rows), np.float32))

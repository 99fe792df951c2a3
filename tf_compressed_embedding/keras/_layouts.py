"""Rowwise records built from values already quantized (numpy only).

`quantization` encodes float tables; the layer and `convert` also receive
tables that are quantized already: a 0.1.0 file's ``int8_split`` values and
scales, and Keras' own int8 and int4 Embedding layouts. These pack such
values into the records of the ``int8`` and ``int4`` formats as
``quantization``'s module docstring defines them, unchanged (no rounding
again); the tests check them against ``quantization.decode``.
"""
import numpy as np

from tf_compressed_embedding import quantization

_HEADER = quantization.RECORD_HEADER_BYTES


def int8_records(values, scales):
    """``int8`` records uint8 ``[V, 4 + D]`` holding int8 ``values [V, D]``
    and float32 ``scales [V]`` as they are: ``decode`` gives ``values *
    scales`` bit for bit, as ``int8_split`` does for the same arrays."""
    values = np.asarray(values)
    scales = np.asarray(scales)
    if (values.dtype != np.int8 or values.ndim != 2
            or scales.dtype != np.float32 or scales.shape != values.shape[:1]):
        raise ValueError(
            f"int8 values [V, D] and float32 scales [V] expected, got "
            f"{values.dtype}{list(values.shape)} and "
            f"{scales.dtype}{list(scales.shape)}")
    data = np.empty((values.shape[0], quantization.record_bytes(
        "int8", values.shape[1])), np.uint8)
    data[:, :_HEADER] = scales.astype("<f4")[:, None].view(np.uint8)
    data[:, _HEADER:] = values.view(np.uint8)
    return data


def int4_records(levels, scale, bias):
    """``int4`` records uint8 ``[V, 4 + ceil(D/2)]`` of ``levels`` (integers
    in ``[0, 15]``, ``[V, D]``) with float16 ``scale`` and ``bias`` ``[V]``:
    ``decode`` gives ``levels * scale + bias``."""
    levels = np.asarray(levels)
    scale = np.asarray(scale)
    bias = np.asarray(bias)
    if (levels.ndim != 2 or scale.dtype != np.float16 or bias.dtype != np.float16
            or scale.shape != levels.shape[:1] or bias.shape != scale.shape):
        raise ValueError(
            f"int4 levels [V, D] with float16 scale and bias [V] expected, "
            f"got {levels.dtype}{list(levels.shape)}, "
            f"{scale.dtype}{list(scale.shape)} and {bias.dtype}{list(bias.shape)}")
    if levels.size and (levels.min() < 0 or levels.max() > quantization.INT4_MAX):
        raise ValueError(f"int4 levels must be in [0, {quantization.INT4_MAX}], "
                         f"got [{levels.min()}, {levels.max()}]")
    rows, dim = levels.shape
    levels = levels.astype(np.uint8)
    if dim % 2:  # an odd dim's last high nibble is 0
        levels = np.pad(levels, ((0, 0), (0, 1)))
    data = np.empty((rows, quantization.record_bytes("int4", dim)), np.uint8)
    data[:, 0:2] = scale.astype("<f2")[:, None].view(np.uint8)
    data[:, 2:4] = bias.astype("<f2")[:, None].view(np.uint8)
    data[:, _HEADER:] = levels[:, 0::2] | (levels[:, 1::2] << 4)
    return data


def is_int8_split(values, rows, dim):
    """Whether ``values`` (the arrays a layer saved) are an ``int8_split``
    table of ``rows`` x ``dim``: int8 ``[rows, dim]`` and float32 ``[rows]``."""
    return (len(values) == 2
            and values[0].dtype == np.int8 and values[0].shape == (rows, dim)
            and values[1].dtype == np.float32 and values[1].shape == (rows,))

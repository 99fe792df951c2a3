"""`CompressedTable`: an embedding table stored as INT8 + scales, or FP16."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_compressed_embedding import quantization


class CompressedTable(tf.Module):
    """An embedding table kept compressed in memory.

    The table lives in two non-trainable ``tf.Variable``s, so a module that
    holds it saves the compressed bytes in its checkpoint (never as graph
    constants) and ``tf.function``s read it without copies.

    Attributes:
      data: ``tf.Variable`` ``[V, D]``, int8 (format ``"int8"``) or float16
        (format ``"fp16"``).
      scales: ``tf.Variable`` float32 ``[V]`` for ``"int8"``, ``[0]`` for
        ``"fp16"``.
      format: ``"int8"`` or ``"fp16"``.

    Compressed tables are not trainable: train the float32 table, then
    quantize it with :func:`quantize`.
    """

    def __init__(self, data, scales, format, name=None):  # noqa: A002
        super().__init__(name=name)
        quantization.check_format(format)
        data = np.asarray(data)
        scales = np.asarray(scales, np.float32)
        expected = quantization.storage_dtype(format)
        if data.dtype != expected or data.ndim != 2:
            raise ValueError(
                f"data for format {format!r} must be a {expected} matrix "
                f"[rows, dim], got {data.dtype} of shape {data.shape}")
        want_scales = quantization.scales_shape(format, data.shape[0])
        if scales.shape != want_scales:
            raise ValueError(
                f"scales for format {format!r} with {data.shape[0]} rows must "
                f"have shape {want_scales}, got {scales.shape}")
        self._format = format
        with self.name_scope:
            self.data = tf.Variable(data, trainable=False, name="data")
            self.scales = tf.Variable(scales, trainable=False, name="scales")

    @property
    def format(self) -> str:
        """The storage format, ``"int8"`` or ``"fp16"``."""
        return self._format

    @property
    def dtype(self):
        """The ``tf.DType`` of the stored rows (``tf.int8`` or ``tf.float16``)."""
        return self.data.dtype

    @property
    def shape(self):
        """``tf.TensorShape([V, D])``."""
        return self.data.shape

    @property
    def nbytes(self) -> int:
        """Bytes of table memory: the rows plus the per-row scales."""
        rows, dim = self.shape
        return rows * dim * self.dtype.size + self.scales.shape[0] * 4

    @property
    def trainable(self):
        """Always False: compressed tables cannot be trained."""
        return False

    @trainable.setter
    def trainable(self, value):
        if value:
            raise ValueError(
                "a CompressedTable is not trainable: train the float32 table "
                "and quantize it afterwards with tfce.quantize()")

    def dequantize(self) -> np.ndarray:
        """The decoded float32 table as a numpy array ``[V, D]``."""
        return quantization.decode(self.data.numpy(), self.scales.numpy(),
                                   self._format)

    def __repr__(self):
        rows, dim = self.shape
        return (f"CompressedTable(format={self._format!r}, shape=[{rows}, "
                f"{dim}], nbytes={self.nbytes})")


def quantize(table, format: str,  # noqa: A002
             name: str | None = None) -> CompressedTable:
    """Compresses a float table.

    Args:
      table: a float ``[V, D]`` numpy array, ``tf.Tensor`` or ``tf.Variable``.
      format: ``"int8"`` (one float32 scale per row) or ``"fp16"``.
      name: optional name of the resulting module.

    Returns:
      A :class:`CompressedTable`.

    Raises:
      ValueError: unknown format, table not rank 2, non-finite values, or
        values beyond the float16 range for ``"fp16"``.
    """
    quantization.check_format(format)
    if isinstance(table, (tf.Tensor, tf.Variable)):
        table = table.numpy()
    data, scales = quantization.encode(table, format)
    return CompressedTable(data, scales, format, name=name)

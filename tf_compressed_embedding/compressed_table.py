"""`CompressedTable`: an embedding table stored in one of the formats of
`quantization` (int4, int8, fp16, int8_split)."""
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
      data: ``tf.Variable``: uint8 records ``[V, R]`` for the rowwise
        formats ``"int8"`` and ``"int4"`` (R bytes per row, scale inline),
        float16 ``[V, D]`` for ``"fp16"``, int8 ``[V, D]`` for
        ``"int8_split"``.
      scales: ``tf.Variable`` float32 ``[V]`` for ``"int8_split"``, ``[0]``
        for the others.
      format: the format's name (``quantization.FORMATS``).

    Compressed tables are not trainable: train the float32 table, then
    quantize it with :func:`quantize`.
    """

    def __init__(self, data, scales, format, dim=None, name=None):  # noqa: A002
        """``dim`` (D) is needed for ``"int4"`` only, whose records do not
        give it; the other formats' data imply it."""
        super().__init__(name=name)
        quantization.check_format(format)
        data = np.asarray(data)
        scales = np.asarray(scales, np.float32)
        expected = quantization.storage_dtype(format)
        if data.dtype != expected or data.ndim != 2:
            raise ValueError(
                f"data for format {format!r} must be a {expected} matrix, "
                f"got {data.dtype} of shape {data.shape}")
        if dim is None:
            if format == "int4":
                raise ValueError("an int4 CompressedTable needs its dim: "
                                 "records of dims 2k - 1 and 2k are the same size")
            dim = (data.shape[1] - quantization.RECORD_HEADER_BYTES
                   if format == "int8" else data.shape[1])
        want = quantization.data_shape(format, data.shape[0], dim)
        if data.shape != want:
            raise ValueError(
                f"data for format {format!r} of dim {dim} must have shape "
                f"{want}, got {data.shape}")
        want_scales = quantization.scales_shape(format, data.shape[0])
        if scales.shape != want_scales:
            raise ValueError(
                f"scales for format {format!r} with {data.shape[0]} rows must "
                f"have shape {want_scales}, got {scales.shape}")
        self._format = format
        self._dim = int(dim)
        with self.name_scope:
            self.data = tf.Variable(data, trainable=False, name="data")
            self.scales = tf.Variable(scales, trainable=False, name="scales")

    @property
    def format(self) -> str:
        """The storage format's name (``quantization.FORMATS``)."""
        return self._format

    @property
    def dim(self) -> int:
        """D, the width of a decoded row."""
        return self._dim

    @property
    def dtype(self):
        """The ``tf.DType`` of ``data`` (uint8 records, float16 or int8)."""
        return self.data.dtype

    @property
    def shape(self):
        """``tf.TensorShape([V, D])``: the shape of the decoded table."""
        return tf.TensorShape([self.data.shape[0], self._dim])

    @property
    def nbytes(self) -> int:
        """Bytes of table memory: the stored rows plus any separate scales."""
        rows, width = self.data.shape
        return rows * width * self.dtype.size + self.scales.shape[0] * 4

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
                                   self._format, self._dim)

    def __repr__(self):
        rows, dim = self.shape
        return (f"CompressedTable(format={self._format!r}, shape=[{rows}, "
                f"{dim}], nbytes={self.nbytes})")


def quantize(table, format: str,  # noqa: A002
             name: str | None = None) -> CompressedTable:
    """Compresses a float table.

    Args:
      table: a float ``[V, D]`` numpy array, ``tf.Tensor`` or ``tf.Variable``.
      format: ``"int8"`` (int8 values with their row's float32 scale
        inline), ``"int4"`` (two values per byte, a float16 scale and bias
        per row), ``"fp16"``, or ``"int8_split"`` (int8 with a separate
        scales array, the layout of version 0.1.0).
      name: optional name of the resulting module.

    Returns:
      A :class:`CompressedTable`.

    Raises:
      ValueError: unknown format, table not rank 2, non-finite values, or
        values beyond the float16 range for ``"fp16"`` (or scales and biases
        beyond it for ``"int4"``).
    """
    quantization.check_format(format)
    if isinstance(table, (tf.Tensor, tf.Variable)):
        table = table.numpy()
    data, scales = quantization.encode(table, format)
    dim = np.shape(table)[1]
    return CompressedTable(data, scales, format, dim=dim, name=name)

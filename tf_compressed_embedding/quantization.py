"""The storage formats, defined once (numpy only).

Used by `CompressedTable`, the Keras layer, the export tool and the tests.

- ``int8``: ``data`` int8 ``[V, D]``, ``scales`` float32 ``[V]``.
  ``scale = max|row| / 127``; ``q = clip(round_half_even(x / scale), -127, 127)``;
  an all-zero row has scale 0 and q 0. Decoded value: ``q * scale``.
- ``fp16``: ``data`` float16 ``[V, D]``, ``scales`` float32 ``[0]``. Values
  beyond +-65504 are an error, never Inf.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

FORMATS = ("int8", "fp16")
INT8_MAX = 127
FP16_MAX = 65504.0

# Rows are encoded in chunks so temporaries stay small for large tables.
_CHUNK_ROWS = 1 << 16


def check_format(fmt: str) -> str:
    """Returns ``fmt`` if it names a storage format, else raises ValueError."""
    if fmt not in FORMATS:
        raise ValueError(
            f"format must be one of {', '.join(repr(f) for f in FORMATS)}, "
            f"got {fmt!r}")
    return fmt


def _as_float_table(table):
    table = np.asarray(table)
    if table.ndim != 2:
        raise ValueError(
            f"table must be rank 2 [rows, dim], got shape {table.shape} "
            f"(rank {table.ndim}); for rows of shape [d1, d2, ...] quantize "
            f"table.reshape(rows, -1) and reshape the looked-up rows back")
    if table.dtype.name == "bfloat16":
        # ml_dtypes' bfloat16 (what TF's numpy() gives) is not a numpy
        # floating type; every bfloat16 value is exact in float32.
        return table.astype(np.float32)
    if not np.issubdtype(table.dtype, np.floating):
        raise TypeError(f"table must hold floating-point values, got dtype "
                        f"{table.dtype}")
    return table


def _check_finite(table, row_offset):
    bad = ~np.isfinite(table)
    count = int(bad.sum())
    if count:
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"table has {count} non-finite value(s) (NaN or Inf), the first "
            f"at row {row + row_offset}, column {col}; only finite tables can "
            f"be quantized")


def encode_int8(table: npt.ArrayLike, row_offset: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes a float table as (int8 data [V, D], float32 scales [V]).

    ``row_offset`` is added to row numbers in error messages (for tables
    encoded in chunks).
    """
    table = _as_float_table(table)
    _check_finite(table, row_offset)
    rows, dim = table.shape
    data = np.empty((rows, dim), np.int8)
    scales = np.empty((rows,), np.float32)
    for start in range(0, rows, _CHUNK_ROWS):
        with np.errstate(over="ignore"):  # reported just below
            x = table[start:start + _CHUNK_ROWS].astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("table has values beyond the float32 range")
        amax = np.abs(x).max(axis=1) if dim else np.zeros(len(x), np.float32)
        scale = (amax / np.float32(INT8_MAX)).astype(np.float32)
        # A row whose scale underflows to 0 (or is all zero) encodes as zeros.
        safe = np.where(scale > 0, scale, np.float32(1))[:, None]
        q = np.rint(x / safe)  # rint rounds half to even
        q = np.where(scale[:, None] > 0, q, 0)
        data[start:start + len(x)] = np.clip(q, -INT8_MAX, INT8_MAX)
        scales[start:start + len(x)] = scale
    return data, scales


def encode_fp16(table: npt.ArrayLike, row_offset: int = 0) -> np.ndarray:
    """Encodes a float table as float16 data [V, D] (``row_offset``: as for
    :func:`encode_int8`)."""
    table = _as_float_table(table)
    _check_finite(table, row_offset)
    if table.size:
        amax = np.abs(table).max()
        if amax > FP16_MAX:
            row, col = np.unravel_index(np.abs(table).argmax(), table.shape)
            raise ValueError(
                f"table has values beyond the float16 range [-{FP16_MAX:g}, "
                f"{FP16_MAX:g}]: |x| = {amax:g} at row {row + row_offset}, "
                f"column {col}; "
                f"use the 'int8' format, or rescale the table")
    return table.astype(np.float16)


def encode(table: npt.ArrayLike, fmt: str, row_offset: int = 0
           ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes ``table`` in format ``fmt``; returns (data, scales)."""
    if check_format(fmt) == "int8":
        return encode_int8(table, row_offset)
    data = encode_fp16(table, row_offset)
    return data, np.zeros(scales_shape(fmt, data.shape[0]), np.float32)


def decode(data: npt.ArrayLike, scales: npt.ArrayLike,
           fmt: str) -> np.ndarray:
    """The reference decoder: float32 [V, D] from (data, scales)."""
    data = np.asarray(data)
    if check_format(fmt) == "int8":
        return data.astype(np.float32) * np.asarray(scales, np.float32)[:, None]
    return data.astype(np.float32)


def scales_shape(fmt: str, rows: int) -> tuple[int]:
    """The shape of ``scales`` in format ``fmt`` for a table of ``rows`` rows."""
    return (rows,) if check_format(fmt) == "int8" else (0,)


def storage_dtype(fmt: str) -> np.dtype:
    """The numpy dtype of ``data`` in format ``fmt``."""
    return np.dtype(np.int8) if check_format(fmt) == "int8" else np.dtype(np.float16)


def max_decode_error(fmt: str, row_max_abs: npt.ArrayLike) -> np.ndarray:
    """The largest |decode(encode(x)) - x| in a row whose largest |x| is
    ``row_max_abs`` (an array or scalar): half a quantization step, ``scale /
    2 = max|row| / 254`` for int8; half a unit in the last place of a float16
    normal (``max|row| * 2**-11``) for fp16."""
    row_max_abs = np.asarray(row_max_abs, np.float64)
    if check_format(fmt) == "int8":
        return row_max_abs / (2 * INT8_MAX)
    return row_max_abs * 2.0 ** -11


FLOAT32_EPS = float(np.finfo(np.float32).eps)


def pooled_error_bound(magnitude: npt.ArrayLike,
                       count: npt.ArrayLike,
                       denominator: npt.ArrayLike) -> np.ndarray:
    """The bound on a pooled output element's float32 error, against the
    exact pooling of the decoded rows (what the kernels guarantee).

    ``magnitude`` is ``sum_i |w_i x_i|`` over the ``count`` terms of the
    bag, ``denominator`` the combiner's (1, ``sum w`` or ``sqrt(sum w**2)``).
    The kernels fold an int8 row's weight into its scale and accumulate in
    float32 in any order, with FMAs, then divide once: each term is within
    two roundings of ``w_i x_i``, and each of the ``count`` adds, the final
    add of two partial sums and the divide round once, so
    ``|got - want| <= (2 count + 4) eps32 magnitude / |denominator|``
    (the C++ tests use the same bound, tests/cc). Flush-to-zero of tiny
    terms is not covered (the fuzzer adds it).
    """
    magnitude = np.asarray(magnitude, np.float64)
    return ((2 * np.asarray(count, np.float64) + 4) * FLOAT32_EPS
            * magnitude / np.abs(np.asarray(denominator, np.float64)))

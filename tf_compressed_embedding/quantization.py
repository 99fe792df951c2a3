"""The storage formats, defined once (numpy only).

Used by `CompressedTable`, the Keras layer, the export tool and the tests.
``data`` holds the stored rows, ``scales`` a separate per-row scale array
(empty unless the format has one). Each stored row of a rowwise format is one
record: its metadata first, then its values, at a stride of
:func:`record_bytes` (no padding: kernels load records unaligned, and padding
would cost int4 tables of dim 12 a fifth of their memory).

- ``int8`` (rowwise): ``data`` uint8 ``[V, 4 + D]``; bytes 0-3 of a record are
  the row's float32 scale (little-endian), bytes 4.. its D int8 values.
  ``scale = max|row| / 127``; ``q = clip(round_half_even(x / scale), -127,
  127)``; an all-zero row has scale 0 and q 0. Decoded value: ``q * scale``.
  One cache line per row where the split layout needs two.
- ``int4`` (rowwise): ``data`` uint8 ``[V, 4 + ceil(D / 2)]``; bytes 0-1 the
  row's float16 scale, 2-3 its float16 bias, then the values two to a byte,
  element 2j in the low nibble of byte j and 2j+1 in the high one (an odd
  D's last high nibble is 0). ``q in [0, 15]``; decoded value: ``float32(q *
  scale) + bias`` in float32, scale and bias widened from float16. The range
  ``[bias, bias + 15 scale]`` is chosen per row to minimise the row's squared
  error (the greedy search of Guan et al. 2019, see :func:`int4_row_ranges`),
  or is the row's min/max with ``search=False``.
- ``fp16``: ``data`` float16 ``[V, D]``. Values beyond +-65504 are an error,
  never Inf.
- ``int8_split`` (the first int8 layout, version 0.1.0's ``int8``): ``data``
  int8 ``[V, D]``, ``scales`` float32 ``[V]``; values as ``int8``'s. Models
  exported with it keep loading, bit for bit.

Every format but ``int8_split`` has ``scales`` of shape ``[0]``.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Smallest first: the order `--dtype auto` tries them in.
FORMATS = ("int4", "int8", "fp16", "int8_split")
ROWWISE_FORMATS = ("int4", "int8")
INT8_MAX = 127
INT4_MAX = 15
FP16_MAX = 65504.0
# Half the spacing of float16 subnormals: their rounding error.
_FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25
# Bytes of a rowwise record before its values.
RECORD_HEADER_BYTES = 4

# The greedy int4 range search: the range moves in steps of 1/INT4_SEARCH_BINS
# of the row's full range, and gives up at most INT4_SEARCH_MAX_CLIP of it
# (FBGEMM's defaults for embedding_bag_4bit_prepack(optimized_qparams=True)).
INT4_SEARCH_BINS = 200
INT4_SEARCH_MAX_CLIP = 0.16

# Rows are encoded in chunks so temporaries stay small for large tables.
_CHUNK_ROWS = 1 << 16
# Elements per chunk of the int4 search, whose temporaries are many.
_SEARCH_CHUNK_ELEMENTS = 1 << 16


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


def _int8_rows(table, row_offset):
    """(q int8 [V, D], scales float32 [V]): the int8 values of both int8 layouts."""
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


def encode_int8_split(table: npt.ArrayLike, row_offset: int = 0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes a float table as ``int8_split``: (int8 data [V, D], float32
    scales [V]).

    ``row_offset`` is added to row numbers in error messages (for tables
    encoded in chunks).
    """
    return _int8_rows(table, row_offset)


def encode_int8(table: npt.ArrayLike, row_offset: int = 0) -> np.ndarray:
    """Encodes a float table as ``int8`` records: uint8 [V, 4 + D]
    (``row_offset``: as for :func:`encode_int8_split`)."""
    q, scales = _int8_rows(table, row_offset)
    data = np.empty((q.shape[0], record_bytes("int8", q.shape[1])), np.uint8)
    data[:, :RECORD_HEADER_BYTES] = scales.astype("<f4")[:, None].view(np.uint8)
    data[:, RECORD_HEADER_BYTES:] = q.view(np.uint8)
    return data


def _int4_loss(x, lo, hi):
    """Per-row squared error of quantizing rows x [R, D] to 16 levels over
    [lo, hi] (float32 arithmetic, as the search's candidates)."""
    scale = (hi - lo) / np.float32(INT4_MAX)
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    q = np.clip(np.rint((x - lo[:, None]) / safe), 0, INT4_MAX)
    err = q * scale[:, None] + lo[:, None] - x
    return np.einsum("ij,ij->i", err, err)


def int4_row_ranges(x: np.ndarray, search: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The quantization range [lo, hi] of each row of float32 ``x`` [R, D].

    Without ``search``, the row's min and max. With it, the greedy search of
    Guan et al. 2019 ("Post-training 4-bit quantization on embedding tables"):
    starting from [min, max], each step moves whichever end lowers the row's
    squared error more, by 1/INT4_SEARCH_BINS of the full range, until
    INT4_SEARCH_MAX_CLIP of the range is given up; the range with the least
    error seen on the way is kept. Outliers are clipped when that makes the
    other values' steps finer by more than it costs.
    """
    lo = x.min(axis=1) if x.shape[1] else np.zeros(len(x), np.float32)
    hi = x.max(axis=1) if x.shape[1] else np.zeros(len(x), np.float32)
    if not search or x.shape[1] < 2:
        return lo, hi
    step = (hi - lo) / np.float32(INT4_SEARCH_BINS)
    steps = INT4_SEARCH_BINS - int(INT4_SEARCH_BINS * (1 - INT4_SEARCH_MAX_CLIP))
    best_lo, best_hi = lo.copy(), hi.copy()
    best = _int4_loss(x, lo, hi)
    for _ in range(steps):
        up, down = lo + step, hi - step
        loss_up, loss_down = _int4_loss(x, up, hi), _int4_loss(x, lo, down)
        move_lo = loss_up < loss_down
        lo = np.where(move_lo, up, lo)
        hi = np.where(move_lo, hi, down)
        loss = np.where(move_lo, loss_up, loss_down)
        better = loss < best
        best = np.where(better, loss, best)
        best_lo = np.where(better, lo, best_lo)
        best_hi = np.where(better, hi, best_hi)
    return best_lo, best_hi


def encode_int4(table: npt.ArrayLike, row_offset: int = 0,
                search: bool = True) -> np.ndarray:
    """Encodes a float table as ``int4`` records: uint8 [V, 4 + ceil(D/2)].

    ``search``: choose each row's range by the greedy error search (the
    default) or take its min/max (:func:`int4_row_ranges`). ``row_offset``:
    as for :func:`encode_int8_split`. Raises ValueError for rows whose bias or
    scale is beyond the float16 range.
    """
    table = _as_float_table(table)
    _check_finite(table, row_offset)
    rows, dim = table.shape
    data = np.zeros((rows, record_bytes("int4", dim)), np.uint8)
    chunk = max(1, _SEARCH_CHUNK_ELEMENTS // max(dim, 1))
    for start in range(0, rows, chunk):
        with np.errstate(over="ignore"):
            x = table[start:start + chunk].astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("table has values beyond the float32 range")
        lo, hi = int4_row_ranges(x, search)
        with np.errstate(over="ignore"):
            scale16 = ((hi - lo) / np.float32(INT4_MAX)).astype(np.float16)
            bias16 = lo.astype(np.float16)
        bad = ~(np.isfinite(scale16) & np.isfinite(bias16))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"row {start + row + row_offset} has values beyond what int4's "
                f"float16 scale and bias can hold (min {lo[row]:g}, max "
                f"{hi[row]:g}; |bias| and (max - min) / 15 must be at most "
                f"{FP16_MAX:g}); use the 'int8' format, or rescale the table")
        # Values are rounded against the stored (float16) scale and bias, so
        # decode(encode(x)) is the nearest level the kernels will produce.
        scale, bias = scale16.astype(np.float32), bias16.astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1))[:, None]
        q = np.clip(np.rint((x - bias[:, None]) / safe), 0, INT4_MAX)
        q = np.where(scale[:, None] > 0, q, 0).astype(np.uint8)
        if dim % 2:
            q = np.pad(q, ((0, 0), (0, 1)))
        record = data[start:start + len(x)]
        record[:, 0:2] = scale16.astype("<f2")[:, None].view(np.uint8)
        record[:, 2:4] = bias16.astype("<f2")[:, None].view(np.uint8)
        record[:, RECORD_HEADER_BYTES:] = q[:, 0::2] | (q[:, 1::2] << 4)
    return data


def encode_fp16(table: npt.ArrayLike, row_offset: int = 0) -> np.ndarray:
    """Encodes a float table as float16 data [V, D] (``row_offset``: as for
    :func:`encode_int8_split`)."""
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
    check_format(fmt)
    if fmt == "int8_split":
        return encode_int8_split(table, row_offset)
    if fmt == "int8":
        data = encode_int8(table, row_offset)
    elif fmt == "int4":
        data = encode_int4(table, row_offset)
    else:
        data = encode_fp16(table, row_offset)
    return data, np.zeros(scales_shape(fmt, data.shape[0]), np.float32)


def _record_dim(fmt: str, data: np.ndarray, dim: int | None) -> int:
    if dim is None:
        if fmt == "int4":
            raise ValueError("decoding an int4 table needs its dim: records of "
                             "dims 2k - 1 and 2k have the same size")
        dim = data.shape[1] - RECORD_HEADER_BYTES
    if data.ndim != 2 or data.shape[1] != record_bytes(fmt, dim):
        raise ValueError(
            f"{fmt} data of dim {dim} must have shape [rows, "
            f"{record_bytes(fmt, dim)}], got {data.shape}")
    return dim


def decode(data: npt.ArrayLike, scales: npt.ArrayLike, fmt: str,
           dim: int | None = None) -> np.ndarray:
    """The reference decoder: float32 [V, D] from (data, scales).

    ``dim`` is D; it is needed for ``int4`` only (the others' data imply it).
    """
    data = np.asarray(data)
    check_format(fmt)
    if fmt == "int8_split":
        return data.astype(np.float32) * np.asarray(scales, np.float32)[:, None]
    if fmt == "fp16":
        return data.astype(np.float32)
    dim = _record_dim(fmt, data, dim)
    header = np.ascontiguousarray(data[:, :RECORD_HEADER_BYTES])
    values = data[:, RECORD_HEADER_BYTES:]
    if fmt == "int8":
        scale = header.view("<f4")[:, 0].astype(np.float32)
        return values.view(np.int8).astype(np.float32) * scale[:, None]
    meta = header.view("<f2").astype(np.float32)
    q = np.empty((len(data), 2 * values.shape[1]), np.float32)
    q[:, 0::2], q[:, 1::2] = values & 0x0F, values >> 4
    return q[:, :dim] * meta[:, 0:1] + meta[:, 1:2]


def record_bytes(fmt: str, dim: int) -> int:
    """Bytes of one stored row of a ``dim``-wide table in format ``fmt``
    (values and inline metadata; ``int8_split``'s scales are not included)."""
    check_format(fmt)
    if fmt == "int8":
        return RECORD_HEADER_BYTES + dim
    if fmt == "int4":
        return RECORD_HEADER_BYTES + (dim + 1) // 2
    return dim * (2 if fmt == "fp16" else 1)


def row_bytes(fmt: str, dim: int) -> int:
    """All bytes one row costs in format ``fmt``, with a split scale."""
    return record_bytes(fmt, dim) + (4 if fmt == "int8_split" else 0)


def data_shape(fmt: str, rows: int, dim: int) -> tuple[int, int]:
    """The shape of ``data`` for a [rows, dim] table in format ``fmt``."""
    if check_format(fmt) in ROWWISE_FORMATS:
        return rows, record_bytes(fmt, dim)
    return rows, dim


def scales_shape(fmt: str, rows: int) -> tuple[int]:
    """The shape of ``scales`` in format ``fmt`` for a table of ``rows`` rows."""
    return (rows,) if check_format(fmt) == "int8_split" else (0,)


def storage_dtype(fmt: str) -> np.dtype:
    """The numpy dtype of ``data`` in format ``fmt``."""
    check_format(fmt)
    return np.dtype({"int8_split": np.int8, "fp16": np.float16}.get(fmt, np.uint8))


def op_row_format(fmt: str) -> str:
    """The ops' ``row_format`` attribute for format ``fmt``: ``"plain"``
    for the layouts the table dtype alone names (int8_split, fp16)."""
    check_format(fmt)
    return f"{fmt}_rowwise" if fmt in ROWWISE_FORMATS else "plain"


def max_decode_error(fmt: str, row_max_abs: npt.ArrayLike) -> np.ndarray:
    """The largest |decode(encode(x)) - x| in a row whose largest |x| is
    ``row_max_abs`` (an array or scalar).

    int8 (both layouts): half a quantization step, ``scale / 2 = max|row| /
    254``. fp16: half a unit in the last place of a float16 normal
    (``max|row| * 2**-11``), or of a subnormal (``2**-25``) for values
    under float16's smallest normal. int4: half a step of a range at most 2
    max|row| wide, plus what the range search may clip (INT4_SEARCH_MAX_CLIP
    of that range), plus the float16 rounding of the scale (times 15) and
    the bias, each relative or, for subnormals, ``2**-25``.
    """
    row_max_abs = np.asarray(row_max_abs, np.float64)
    check_format(fmt)
    if fmt in ("int8", "int8_split"):
        return row_max_abs / (2 * INT8_MAX)
    if fmt == "int4":
        half_step = 2 * row_max_abs / (2 * INT4_MAX)
        clipped = INT4_SEARCH_MAX_CLIP * 2 * row_max_abs
        return (half_step + clipped + 3 * row_max_abs * 2.0 ** -11
                + (INT4_MAX + 1) * _FP16_SUBNORMAL_HALF_ULP)
    return row_max_abs * 2.0 ** -11 + _FP16_SUBNORMAL_HALF_ULP


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

"""The storage formats against an element-by-element float64 reading of the
format definition (quantization.py's docstring), the stored bytes against an
independent packing, and the encoder's refusals."""
import re
import struct

import numpy as np
import pytest

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization

FORMATS = quantization.FORMATS


def slow_int8(table):
    """The int8 definition (both layouts), one element at a time: (q int8
    [V, D], scales float32 [V])."""
    data = np.zeros(table.shape, np.int8)
    scales = np.zeros(table.shape[0], np.float32)
    for r, row in enumerate(table.astype(np.float32)):
        scale = np.float32(np.abs(row).max() / np.float32(127)) if row.size else 0
        scales[r] = scale
        for d, x in enumerate(row):
            q = 0 if scale == 0 else round(float(np.float32(x / scale)))  # half-even
            data[r, d] = max(-127, min(127, q))
    return data, scales


def pack_int8_record(scale, q):
    """One int8 record: the float32 scale little-endian, then the values."""
    return struct.pack("<f", scale) + struct.pack(f"{len(q)}b", *q)


def pack_int4_record(scale, bias, q):
    """One int4 record: float16 scale and bias little-endian, then values
    2j and 2j + 1 in the low and high nibble of byte j (0 past the end)."""
    q = list(q) + [0] * (len(q) % 2)
    return struct.pack("<ee", scale, bias) + bytes(
        lo | hi << 4 for lo, hi in zip(q[0::2], q[1::2]))


def rows_of(data):
    return [bytes(row) for row in np.asarray(data, np.uint8)]


def random_rows(rng, rows, dim):
    """Rows of very different magnitudes, some with outliers."""
    table = rng.standard_t(3, (rows, dim)) * rng.uniform(1e-3, 100, (rows, 1))
    return table.astype(np.float32)


# --------------------------------------------------------------------- int8


def test_int8_matches_definition():
    rng = np.random.default_rng(51)
    table = (rng.standard_normal((40, 13)) * rng.uniform(0.01, 100, (40, 1))
             ).astype(np.float32)
    table[3] = 0.0  # all-zero row: scale 0, q 0
    table[4, :] = 0.5  # constant row
    data, scales = quantization.encode_int8_split(table)
    want_data, want_scales = slow_int8(table)
    np.testing.assert_array_equal(data, want_data)
    np.testing.assert_array_equal(scales, want_scales)
    assert scales[3] == 0 and not data[3].any()
    # Each row's largest magnitude maps to +-127, and the error is at most
    # half a step.
    assert (np.abs(data[np.arange(40) != 3]).max(axis=1) == 127).all()
    err = np.abs(quantization.decode(data, scales, "int8_split") - table)
    assert (err <= scales[:, None] * 0.5 * (1 + 1e-6)).all()
    # The records hold the same values and scales, packed.
    records = quantization.encode_int8(table)
    assert records.dtype == np.uint8 and records.shape == (40, 4 + 13)
    assert rows_of(records) == [pack_int8_record(s, q)
                                for s, q in zip(want_scales, want_data)]


def test_int8_rowwise_decodes_exactly_as_int8_split():
    rng = np.random.default_rng(53)
    for dim in (1, 7, 64):
        table = random_rows(rng, 300, dim)
        table[5] = 0.0
        records = quantization.encode_int8(table)
        q, scales = quantization.encode_int8_split(table)
        # Same q and scale, bit for bit, in the record.
        np.testing.assert_array_equal(records[:, 4:].view(np.int8), q)
        np.testing.assert_array_equal(
            np.ascontiguousarray(records[:, :4]).view("<f4")[:, 0], scales)
        rowwise = quantization.decode(records, [], "int8")
        split = quantization.decode(q, scales, "int8_split")
        assert rowwise.dtype == split.dtype == np.float32
        np.testing.assert_array_equal(rowwise.view(np.uint32),
                                      split.view(np.uint32))


def test_int8_rounds_half_to_even():
    # max 127 -> scale 1: x / scale lands exactly on .5 ties.
    table = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5]], np.float32)
    data, scales = quantization.encode_int8_split(table)
    assert scales[0] == 1.0
    np.testing.assert_array_equal(data[0], [127, 0, 2, 2, 0, -2])
    assert rows_of(quantization.encode_int8(table)) == [
        pack_int8_record(1.0, [127, 0, 2, 2, 0, -2])]


# --------------------------------------------------------------------- int4


def test_int4_record_layout_by_hand():
    # Rows whose min/max grid is exact in float16, so the range search
    # keeps it (no other range has zero error).
    table = np.array([[0, 15, 1, 2, 3],            # scale 1, bias 0
                      [-1, -0.5, 6.5, 6.5, -1],    # scale 0.5, bias -1
                      [2, 2, 2, 2, 2],             # constant: scale 0
                      [-30, 0, 0, 0, 0]],          # scale 2, bias -30
                     np.float32)
    data = quantization.encode_int4(table)
    assert data.dtype == np.uint8 and data.shape == (4, 4 + 3)
    assert rows_of(data) == [
        bytes([0x00, 0x3C, 0x00, 0x00, 0xF0, 0x21, 0x03]),
        bytes([0x00, 0x38, 0x00, 0xBC, 0x10, 0xFF, 0x00]),
        bytes([0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00]),
        bytes([0x00, 0x40, 0x80, 0xCF, 0xF0, 0xFF, 0x0F]),
    ]
    # The same bytes from the independent packing.
    assert rows_of(data) == [
        pack_int4_record(1.0, 0.0, [0, 15, 1, 2, 3]),
        pack_int4_record(0.5, -1.0, [0, 1, 15, 15, 0]),
        pack_int4_record(0.0, 2.0, [0, 0, 0, 0, 0]),
        pack_int4_record(2.0, -30.0, [0, 15, 15, 15, 15])]
    np.testing.assert_array_equal(quantization.decode(data, [], "int4", 5),
                                  table)
    # Even D: no padding nibble.
    even = quantization.encode_int4(table[:, :4])
    assert rows_of(even)[0] == bytes([0x00, 0x3C, 0x00, 0x00, 0xF0, 0x21])


@pytest.mark.parametrize("search", [True, False])
@pytest.mark.parametrize("dim", [1, 2, 5, 12, 33])
def test_int4_matches_definition(dim, search):
    """Every record against the definition: given the record's float16
    scale and bias, q = clip(round_half_even((x - bias) / scale), 0, 15),
    packed independently; and the range without search is min/max."""
    rng = np.random.default_rng(54 + dim)
    table = random_rows(rng, 200, dim)
    table[7] = 0.0
    table[8] = -3.25
    data = quantization.encode_int4(table, search=search)
    assert data.shape == (200, 4 + (dim + 1) // 2)
    records = rows_of(data)
    for r, x in enumerate(table):
        scale, bias = struct.unpack("<ee", records[r][:4])
        if not search:
            assert bias == np.float16(x.min())
            assert scale == np.float16((np.float32(x.max()) - x.min())
                                       / np.float32(15))
        if scale > 0:
            q = np.clip(np.rint((x - np.float32(bias)) / np.float32(scale)),
                        0, 15).astype(int)
        else:
            q = np.zeros(dim, int)
        assert records[r] == pack_int4_record(scale, bias, q), r
    # The constant rows: scale 0, the value as the bias.
    assert records[7] == pack_int4_record(0.0, 0.0, [0] * dim)
    assert records[8] == pack_int4_record(0.0, -3.25, [0] * dim)


def int4_squared_error(x, lo, hi):
    """float64 squared error of each row of x quantized to the 16 levels
    lo + q (hi - lo) / 15 (nearest level: an independent quantizer)."""
    x, lo, hi = (np.asarray(a, np.float64) for a in (x, lo, hi))
    step = (hi - lo) / 15
    safe = np.where(step > 0, step, 1)[:, None]
    q = np.clip(np.rint((x - lo[:, None]) / safe), 0, 15)
    return (((q * step[:, None] + lo[:, None]) - x) ** 2).sum(axis=1)


def test_int4_search_never_worse_than_min_max():
    rng = np.random.default_rng(55)
    for dim in (2, 3, 8, 12, 64, 200):
        x = random_rows(rng, 500, dim)
        x[:50, 0] *= 40  # outliers: what the search clips
        lo, hi = quantization.int4_row_ranges(x, search=True)
        lo0, hi0 = quantization.int4_row_ranges(x, search=False)
        np.testing.assert_array_equal(lo0, x.min(axis=1))
        np.testing.assert_array_equal(hi0, x.max(axis=1))
        # The search starts from [min, max] and only narrows it, by at most
        # INT4_SEARCH_MAX_CLIP of it (float32 steps: a little slack).
        width = hi0.astype(np.float64) - lo0
        assert (lo >= lo0).all() and (hi <= hi0).all()
        assert ((width - (hi - lo.astype(np.float64)))
                <= (quantization.INT4_SEARCH_MAX_CLIP + 1e-5) * width).all()
        # It keeps the best range it saw: never worse than min/max (scored
        # in float32 by the encoder, in float64 here: a relative slack).
        searched = int4_squared_error(x, lo, hi)
        min_max = int4_squared_error(x, lo0, hi0)
        assert (searched <= min_max * (1 + 1e-4) + 1e-30).all()
        # And it does clip outliers: better on most of those rows (rows of
        # 2 values are exact on [min, max]).
        if dim >= 8:
            assert (searched[:50] < min_max[:50]).mean() > 0.9, dim


def test_int4_stored_search_never_worse_than_min_max_but_for_float16():
    """End to end (scale and bias rounded to float16, values rounded to the
    stored levels) the searched range can lose to min/max by what float16
    rounding moves the levels: per element at most 15 half-ulps of the
    scale plus one of the bias, for each of the two encodings (the search
    scores its candidates before the rounding)."""
    rng = np.random.default_rng(56)
    for dim in (2, 5, 12, 64):
        x = random_rows(rng, 2000, dim)
        errors, slack = [], 0
        for search in (True, False):
            data = quantization.encode_int4(x, search=search)
            decoded = quantization.decode(data, [], "int4", dim)
            errors.append(np.sqrt(((decoded.astype(np.float64) - x) ** 2)
                                  .sum(axis=1)))
            meta = np.ascontiguousarray(data[:, :4]).view("<f2")
            half_ulp = (np.spacing(np.abs(meta)).astype(np.float64) / 2)
            slack = slack + np.sqrt(dim) * (15 * half_ulp[:, 0] + half_ulp[:, 1]
                                            + 16 * 2.0**-24 * np.abs(x).max(1))
        searched, min_max = errors
        assert (searched <= min_max + slack).all(), dim
        if dim >= 12:
            assert (searched < min_max).mean() > 0.5, dim


def test_int4_refuses_scale_or_bias_beyond_float16():
    ok = np.array([[-65504.0, -65504.0 + 15 * 65504.0 * 0.999]], np.float32)
    quantization.encode_int4(ok, search=False)  # at the edge: fine
    for row, what in [([0.0, 1e6], "max 1e+06"),           # scale 66667
                      ([-7e4, -6.99e4], "min -70000"),     # bias -70000
                      ([1e5, 1e5], "min 100000")]:         # constant row
        table = np.ones((6, 2), np.float32)
        table[4] = row
        for search in (True, False):
            with pytest.raises(ValueError, match=(
                    rf"row 1004 has values beyond what int4's float16 scale "
                    rf"and bias can hold \(.*{re.escape(what)}.*; \|bias\| and \(max - "
                    rf"min\) / 15 must be at most 65504\); use the 'int8' "
                    rf"format")):
                quantization.encode_int4(table, row_offset=1000, search=search)
        with pytest.raises(ValueError, match="row 4 has values beyond"):
            tfce.quantize(table, "int4")


def test_int4_needs_its_dim_to_decode():
    data = quantization.encode_int4(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="needs its dim"):
        quantization.decode(data, [], "int4")
    np.testing.assert_array_equal(quantization.decode(data, [], "int4", 5),
                                  np.ones((3, 5)))
    # 5 and 6 have the same record size; 4 and 7 do not.
    assert quantization.decode(data, [], "int4", 6).shape == (3, 6)
    for dim in (4, 7):
        with pytest.raises(ValueError, match=r"int4 data of dim \d must have "
                                             r"shape \[rows, \d\]"):
            quantization.decode(data, [], "int4", dim)
    with pytest.raises(ValueError, match="an int4 CompressedTable needs its dim"):
        tfce.CompressedTable(data, np.zeros([0], np.float32), "int4")


# ----------------------------------------------------------- every format


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_decode_error_holds(fmt):
    rng = np.random.default_rng(57)
    for dim in (1, 2, 7, 33, 128):
        # Row maxima from 1e-2 to 1e4 (fp16 above 65504 is refused; rows
        # under float16's normals: test_max_decode_error_holds_for_tiny_rows).
        table = rng.standard_t(3, (400, dim))
        table *= 10.0 ** rng.uniform(-2, 4, (400, 1)) / np.abs(table).max(
            axis=1, keepdims=True)
        table = table.astype(np.float32)
        table[0] = 0.0
        table[1] = 1.5
        data, scales = quantization.encode(table, fmt)
        decoded = quantization.decode(data, scales, fmt, dim)
        err = np.abs(decoded.astype(np.float64) - table)
        bound = quantization.max_decode_error(fmt, np.abs(table).max(axis=1))
        assert (err <= bound[:, None]).all(), (fmt, dim)
        assert (err[0] == 0).all()


@pytest.mark.xfail(strict=True, reason=(
    "max_decode_error has no term for float16 subnormals: rows whose values "
    "are under float16's smallest normal (6.1e-5) decode with an absolute "
    "error of up to 2**-25 per rounding (fp16; int4's scale and bias), "
    "beyond the relative bound. A known bug: see the report of the int4 "
    "format's tests."))
@pytest.mark.parametrize("fmt", ["fp16", "int4"])
def test_max_decode_error_holds_for_tiny_rows(fmt):
    rng = np.random.default_rng(58)
    table = (rng.standard_normal((500, 17)) * 1e-7).astype(np.float32)
    data, scales = quantization.encode(table, fmt)
    err = np.abs(quantization.decode(data, scales, fmt, 17) - table)
    bound = quantization.max_decode_error(fmt, np.abs(table).max(axis=1))
    assert (err <= bound[:, None]).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_stored_layout(fmt):
    rng = np.random.default_rng(59)
    for dim in (0, 1, 6, 13):
        data, scales = quantization.encode(random_rows(rng, 9, dim), fmt)
        assert data.dtype == quantization.storage_dtype(fmt)
        assert data.shape == quantization.data_shape(fmt, 9, dim)
        assert scales.dtype == np.float32
        assert scales.shape == quantization.scales_shape(fmt, 9)
        want_bytes = {"int8": 4 + dim, "int4": 4 + (dim + 1) // 2,
                      "fp16": 2 * dim, "int8_split": dim}[fmt]
        assert data.shape[1] * data.itemsize == want_bytes
        assert quantization.record_bytes(fmt, dim) == want_bytes
        assert quantization.row_bytes(fmt, dim) == want_bytes + (
            4 if fmt == "int8_split" else 0)
    assert quantization.op_row_format(fmt) == {
        "int8": "int8_rowwise", "int4": "int4_rowwise"}.get(fmt, "plain")


def test_fp16_is_exact_cast_and_refuses_overflow():
    table = np.array([[1.0, -65504.0, 1e-8]], np.float32)
    data, scales = quantization.encode(table, "fp16")
    assert data.dtype == np.float16 and scales.shape == (0,)
    np.testing.assert_array_equal(data, table.astype(np.float16))
    with pytest.raises(ValueError, match=r"beyond the float16 range .*65504.*"
                                         r"row 0, column 1"):
        quantization.encode(np.array([[1.0, 65505.0]], np.float32), "fp16")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(fmt, bad):
    table = np.ones((3, 4), np.float32)
    table[2, 1] = bad
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\).*row 2, "
                                         r"column 1"):
        tfce.quantize(table, fmt)
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\).*row 12, "
                                         r"column 1"):
        quantization.encode(table, fmt, row_offset=10)


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_rank_refused(shape, fmt):
    with pytest.raises(ValueError, match=r"table must be rank 2 \[rows, dim\]"):
        tfce.quantize(np.ones(shape, np.float32), fmt)


def test_unknown_format_and_dtype_refused():
    names = ", ".join(repr(f) for f in FORMATS)
    assert set(FORMATS) == {"int4", "int8", "fp16", "int8_split"}
    with pytest.raises(ValueError, match=rf"format must be one of {names}, "
                                         rf"got 'int2'"):
        tfce.quantize(np.ones((2, 2), np.float32), "int2")
    for fmt in FORMATS:
        with pytest.raises(TypeError, match="floating-point"):
            tfce.quantize(np.ones((2, 2), np.int32), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_beyond_float32_refused(fmt):
    # fp16's own range check comes first.
    with pytest.raises(ValueError, match="beyond the float(32|16) range"):
        tfce.quantize(np.array([[1e300, 1.0]]), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_compressed_table_properties(fmt):
    rng = np.random.default_rng(52)
    table = rng.standard_normal((100, 13)).astype(np.float32)
    ct = tfce.quantize(table, fmt)
    data, scales = quantization.encode(table, fmt)
    assert ct.format == fmt and ct.dim == 13
    assert tuple(ct.shape) == (100, 13)
    assert ct.dtype.name == {"int8": "uint8", "int4": "uint8", "fp16": "float16",
                             "int8_split": "int8"}[fmt]
    assert ct.nbytes == 100 * quantization.row_bytes(fmt, 13)
    np.testing.assert_array_equal(ct.data.numpy(), data)
    np.testing.assert_array_equal(ct.scales.numpy(), scales)
    np.testing.assert_array_equal(ct.dequantize(),
                                  quantization.decode(data, scales, fmt, 13))
    assert fmt in repr(ct) and "[100, 13]" in repr(ct)
    if fmt == "fp16":
        np.testing.assert_array_equal(ct.dequantize(),
                                      table.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_tables(fmt):
    for rows, dim in [(0, 4), (3, 0), (0, 0)]:
        data, scales = quantization.encode(np.zeros((rows, dim), np.float32),
                                           fmt)
        assert data.shape == quantization.data_shape(fmt, rows, dim)
        assert scales.shape == quantization.scales_shape(fmt, rows)
        assert (scales == 0).all()
        assert quantization.decode(data, scales, fmt, dim).shape == (rows, dim)
        ct = tfce.quantize(np.zeros((rows, dim), np.float32), fmt)
        assert tuple(ct.shape) == (rows, dim)
    # Rowwise records of dim 0: a zero scale (and bias) only.
    if fmt in quantization.ROWWISE_FORMATS:
        data, _ = quantization.encode(np.zeros((3, 0), np.float32), fmt)
        assert data.shape == (3, 4) and not data.any()

"""The storage formats against an element-by-element float64 reading of the
format definition, and the encoder's refusals."""
import numpy as np
import pytest

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization


def slow_int8(table):
    """The format definition, one element at a time."""
    data = np.zeros(table.shape, np.int8)
    scales = np.zeros(table.shape[0], np.float32)
    for r, row in enumerate(table.astype(np.float32)):
        scale = np.float32(np.abs(row).max() / np.float32(127)) if row.size else 0
        scales[r] = scale
        for d, x in enumerate(row):
            q = 0 if scale == 0 else round(float(np.float32(x / scale)))  # half-even
            data[r, d] = max(-127, min(127, q))
    return data, scales


def test_int8_matches_definition():
    rng = np.random.default_rng(51)
    table = (rng.standard_normal((40, 13)) * rng.uniform(0.01, 100, (40, 1))
             ).astype(np.float32)
    table[3] = 0.0  # all-zero row: scale 0, q 0
    table[4, :] = 0.5  # constant row
    data, scales = quantization.encode_int8(table)
    want_data, want_scales = slow_int8(table)
    np.testing.assert_array_equal(data, want_data)
    np.testing.assert_array_equal(scales, want_scales)
    assert scales[3] == 0 and not data[3].any()
    # Each row's largest magnitude maps to +-127, and the error is at most
    # half a step.
    assert (np.abs(data[np.arange(40) != 3]).max(axis=1) == 127).all()
    err = np.abs(quantization.decode(data, scales, "int8") - table)
    assert (err <= scales[:, None] * 0.5 * (1 + 1e-6)).all()


def test_int8_rounds_half_to_even():
    # max 127 -> scale 1: x / scale lands exactly on .5 ties.
    table = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5]], np.float32)
    data, scales = quantization.encode_int8(table)
    assert scales[0] == 1.0
    np.testing.assert_array_equal(data[0], [127, 0, 2, 2, 0, -2])


def test_fp16_is_exact_cast_and_refuses_overflow():
    table = np.array([[1.0, -65504.0, 1e-8]], np.float32)
    data, scales = quantization.encode(table, "fp16")
    assert data.dtype == np.float16 and scales.shape == (0,)
    np.testing.assert_array_equal(data, table.astype(np.float16))
    with pytest.raises(ValueError, match=r"beyond the float16 range .*65504.*"
                                         r"row 0, column 1"):
        quantization.encode(np.array([[1.0, 65505.0]], np.float32), "fp16")


@pytest.mark.parametrize("fmt", ["int8", "fp16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(fmt, bad):
    table = np.ones((3, 4), np.float32)
    table[2, 1] = bad
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\).*row 2, "
                                         r"column 1"):
        tfce.quantize(table, fmt)


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_rank_refused(shape):
    with pytest.raises(ValueError, match=r"table must be rank 2 \[rows, dim\]"):
        tfce.quantize(np.ones(shape, np.float32), "int8")


def test_unknown_format_and_dtype_refused():
    with pytest.raises(ValueError, match=r"format must be one of 'int8', "
                                         r"'fp16', got 'int4'"):
        tfce.quantize(np.ones((2, 2), np.float32), "int4")
    with pytest.raises(TypeError, match="floating-point"):
        tfce.quantize(np.ones((2, 2), np.int32), "int8")


def test_float64_beyond_float32_refused():
    with pytest.raises(ValueError, match="beyond the float32 range"):
        tfce.quantize(np.array([[1e300, 1.0]]), "int8")


def test_compressed_table_properties():
    rng = np.random.default_rng(52)
    table = rng.standard_normal((100, 12)).astype(np.float32)
    ct8, ct16 = tfce.quantize(table, "int8"), tfce.quantize(table, "fp16")
    assert (ct8.format, ct8.dtype.name, tuple(ct8.shape)) == ("int8", "int8", (100, 12))
    assert (ct16.format, ct16.dtype.name) == ("fp16", "float16")
    assert ct8.nbytes == 100 * 12 + 100 * 4
    assert ct16.nbytes == 100 * 12 * 2
    np.testing.assert_array_equal(
        ct8.dequantize(), quantization.decode(*quantization.encode(table, "int8"), "int8"))
    np.testing.assert_array_equal(ct16.dequantize(), table.astype(np.float16).astype(np.float32))
    assert "int8" in repr(ct8)


def test_empty_tables():
    data, scales = quantization.encode_int8(np.zeros((0, 4), np.float32))
    assert data.shape == (0, 4) and scales.shape == (0,)
    data, scales = quantization.encode_int8(np.zeros((3, 0), np.float32))
    assert data.shape == (3, 0) and (scales == 0).all()

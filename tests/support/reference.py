"""Independent numpy references for the ops (float64 accumulation)."""
import numpy as np

from tf_compressed_embedding import quantization


def random_table(rng, rows, dim, scale=1.0):
    return (rng.standard_normal((rows, dim)) * scale).astype(np.float32)


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def decoded(ct):
    """The decoded float64 table of a CompressedTable, from its raw bytes
    (the format's reference decoder, quantization.decode)."""
    return quantization.decode(_numpy(ct.data), _numpy(ct.scales), ct.format,
                               ct.dim).astype(np.float64)


def op_attrs(fmt, dim):
    """The raw ops' row_format and dim attrs for a table of format `fmt`
    ({} for the layouts the table dtype names: int8_split, fp16)."""
    if fmt in quantization.ROWWISE_FORMATS:
        return {"row_format": quantization.op_row_format(fmt), "dim": int(dim)}
    return {}


def int4_records(data, dim):
    """(q int64 [V, D], scale float64 [V], bias float64 [V]) of int4 records,
    read from the format definition: a little-endian float16 scale, a
    float16 bias, then the values two to a byte, low nibble first."""
    data = np.asarray(data, np.uint8)
    header = np.ascontiguousarray(data[:, :4]).view("<f2").astype(np.float64)
    values = data[:, 4:].astype(np.int64)
    q = np.stack([values & 0x0F, values >> 4], axis=2).reshape(len(data), -1)
    return q[:, :dim], header[:, 0], header[:, 1]


def magnitudes(ct):
    """float64 [V, D]: per element, the magnitude the kernels' pooled error
    scales with, for a weight of 1 (so a term of weight w counts |w| times).

    The kernels accumulate the weighted values of a row and its weighted
    bias separately (kernel_api.h: acc += (w scale) q, bias_sum += w bias),
    so for int4 an element's terms are |q scale| and |bias|, however much of
    them cancels in the decoded value. Every other format has a single term,
    |decoded value|.
    """
    if ct.format != "int4":
        return np.abs(decoded(ct))
    q, scale, bias = int4_records(_numpy(ct.data), ct.dim)
    return np.abs(q * scale[:, None]) + np.abs(bias)[:, None]


def lookup(table64, ids):
    return table64[np.asarray(ids, np.int64)]


def pool(table64, ids, segment_ids, weights, combiner, num_segments,
         magnitudes=None):
    """Returns (expected, bound): the float64 result and, per element, the
    kernels' float32 error bound (quantization.pooled_error_bound).

    `magnitudes` is the table's magnitudes(ct) (|table64| if None, right for
    every format but int4): a bag's magnitude is sum_i |w_i| magnitudes[id_i].
    """
    ids = np.asarray(ids, np.int64)
    segment_ids = np.asarray(segment_ids, np.int64)
    dim = table64.shape[1]
    mags = np.abs(table64) if magnitudes is None else np.asarray(magnitudes,
                                                                np.float64)
    w = (np.ones(len(ids)) if weights is None
         else np.asarray(weights, np.float64))
    out = np.zeros((num_segments, dim))
    bound = np.zeros((num_segments, dim))
    for s in range(num_segments):
        sel = segment_ids == s
        total = (table64[ids[sel]] * w[sel][:, None]).sum(axis=0)
        magnitude = (mags[ids[sel]] * np.abs(w[sel])[:, None]).sum(axis=0)
        if combiner == "sum":
            denom = 1.0
        elif combiner == "mean":
            denom = w[sel].sum()
        else:
            denom = np.sqrt((w[sel] ** 2).sum())
        if denom == 0:
            continue
        out[s] = total / denom
        bound[s] = quantization.pooled_error_bound(magnitude, sel.sum(),
                                                   denom)
    return out, bound + 1e-30


def pool_table(ct, ids, segment_ids, weights, combiner, num_segments):
    """pool() of a CompressedTable: its decoded rows, with its magnitudes."""
    return pool(decoded(ct), ids, segment_ids, weights, combiner,
                num_segments, magnitudes=magnitudes(ct))


def random_bags(rng, num_ids, num_segments):
    """Sorted segment ids with some empty segments and duplicates."""
    return np.sort(rng.integers(0, num_segments, size=num_ids))

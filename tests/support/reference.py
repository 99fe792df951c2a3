"""Independent numpy references for the ops (float64 accumulation)."""
import numpy as np

from tf_compressed_embedding import quantization


def random_table(rng, rows, dim, scale=1.0):
    return (rng.standard_normal((rows, dim)) * scale).astype(np.float32)


def decoded(ct):
    """The decoded float64 table of a CompressedTable, from its raw bytes."""
    return quantization.decode(ct.data.numpy(), ct.scales.numpy(),
                               ct.format).astype(np.float64)


def lookup(table64, ids):
    return table64[np.asarray(ids, np.int64)]


def pool(table64, ids, segment_ids, weights, combiner, num_segments):
    """Returns (expected, bound): the float64 result and, per element, the
    kernels' float32 error bound (quantization.pooled_error_bound)."""
    ids = np.asarray(ids, np.int64)
    segment_ids = np.asarray(segment_ids, np.int64)
    dim = table64.shape[1]
    w = (np.ones(len(ids)) if weights is None
         else np.asarray(weights, np.float64))
    out = np.zeros((num_segments, dim))
    bound = np.zeros((num_segments, dim))
    for s in range(num_segments):
        sel = segment_ids == s
        rows = table64[ids[sel]] * w[sel][:, None]
        total = rows.sum(axis=0)
        magnitude = np.abs(rows).sum(axis=0)
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


def random_bags(rng, num_ids, num_segments):
    """Sorted segment ids with some empty segments and duplicates."""
    return np.sort(rng.integers(0, num_segments, size=num_ids))

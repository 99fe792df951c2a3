"""A DLRM-style ranking model as a SavedModel, and request batches for it.

Sparse features are multi-valued bags of ids, each pooled from its own
embedding table with `tf.nn.embedding_lookup_sparse(..., combiner="mean")`;
the pooled vectors and a few dense features go through a small MLP to one
score per candidate. Signature inputs: one int64 `[B, L]` per sparse feature
(padded with -1) and `dense` float32 `[B, 13]`; output `score` `[B, 1]`.
Used by the demo (tools/demo.py) and the serving benchmark.
"""
import dataclasses

import numpy as np
import tensorflow as tf

DENSE_FEATURES = 13


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    rows: int
    dim: int
    max_ids: int  # a bag holds 1..max_ids ids


def demo_features():
    """A small model: 8 features, 10k-500k rows, dims 8-64 (12 the most common)."""
    spec = [(500_000, 16, 20), (200_000, 12, 10), (100_000, 12, 30), (100_000, 32, 5),
            (50_000, 12, 50), (50_000, 8, 1), (20_000, 64, 3), (10_000, 12, 8)]
    return [Feature(f"f{i}", rows, dim, ids) for i, (rows, dim, ids) in enumerate(spec)]


def dlrm_features(total_gib=4.0, count=100, seed=0):
    """A production-like model: `count` features, dims from {8, 12, 16, 32, 64}
    (12 the most common), table rows log-uniform in 10k-5M, scaled so the FP32
    tables total at least `total_gib`; bags of 1-50 ids."""
    rng = np.random.default_rng(seed)
    dims = rng.choice([8, 12, 16, 32, 64], size=count, p=[0.2, 0.4, 0.2, 0.15, 0.05])
    rows = np.exp(rng.uniform(np.log(10_000), np.log(5_000_000), count))
    scale = total_gib * 2**30 / float(np.sum(rows * dims * 4))
    rows = np.clip(np.ceil(rows * scale), 10_000, 5_000_000).astype(int)
    rows[np.argmax(rows)], rows[np.argmin(rows)] = 5_000_000, 10_000  # the full range
    while np.sum(rows * dims * 4) < total_gib * 2**30:  # clipping at 10k/5M moved it
        small = rows < 5_000_000
        rows[small] = np.minimum(5_000_000, rows[small] * 11 // 10)
    max_ids = rng.integers(1, 51, count)
    return [Feature(f"f{i:03d}", int(r), int(d), int(m))
            for i, (r, d, m) in enumerate(zip(rows, dims, max_ids))]


def _fill(variable, rng, chunk_rows=1 << 18):
    rows = variable.shape[0]
    for start in range(0, rows, chunk_rows):
        count = min(chunk_rows, rows - start)
        values = rng.standard_normal((count, variable.shape[1]), np.float32) * 0.05
        # scatter_update writes in place (a sliced assign copies the variable)
        variable.scatter_update(tf.IndexedSlices(values, tf.range(start, start + count)))


class RankingModel(tf.Module):
    """`pooling="sparse"`: `tf.nn.embedding_lookup_sparse` (Unique, gather,
    SparseSegmentMean), what models export. `pooling="segment"`: a gather of
    every id and `tf.math.segment_mean`, no Unique: the fastest FP32 graph
    stock TF expresses for the same model."""

    def __init__(self, features, hidden=(256, 64), seed=0, pooling="sparse"):
        super().__init__(name="ranking_model")
        rng = np.random.default_rng(seed)
        self.pooling = pooling
        self.features = list(features)
        self.tables = {}
        for f in self.features:
            table = tf.Variable(tf.zeros([f.rows, f.dim]), name=f"{f.name}_embedding")
            _fill(table, rng)
            self.tables[f.name] = table
        width = sum(f.dim for f in self.features) + DENSE_FEATURES
        self.layers = []
        for units in list(hidden) + [1]:
            kernel = rng.standard_normal((width, units), np.float32) / np.float32(np.sqrt(width))
            self.layers.append((tf.Variable(kernel), tf.Variable(tf.zeros([units]))))
            width = units

    def score(self, inputs):
        pooled = []
        for f in self.features:
            ids = inputs[f.name]
            where = tf.where(ids >= 0)
            sparse = tf.SparseTensor(where, tf.gather_nd(ids, where),
                                     tf.shape(ids, out_type=tf.int64))
            if self.pooling == "segment":
                rows = tf.gather(self.tables[f.name], sparse.values)
                pooled.append(tf.math.segment_mean(rows, sparse.indices[:, 0]))
            else:
                pooled.append(tf.nn.embedding_lookup_sparse(
                    self.tables[f.name], sparse, None, combiner="mean"))
        x = tf.concat(pooled + [inputs["dense"]], axis=1)
        for i, (kernel, bias) in enumerate(self.layers):
            x = tf.matmul(x, kernel) + bias
            x = tf.nn.relu(x) if i < len(self.layers) - 1 else tf.sigmoid(x)
        return {"score": x}


def save(model, path):
    """Saves `model` with a `serving_default` signature."""
    specs = {f.name: tf.TensorSpec([None, None], tf.int64, name=f.name)
             for f in model.features}
    specs["dense"] = tf.TensorSpec([None, DENSE_FEATURES], tf.float32, name="dense")
    serve = tf.function(lambda **inputs: model.score(inputs)).get_concrete_function(**specs)
    tf.saved_model.save(model, path, signatures={"serving_default": serve})


def requests(features, batch, count, seed=1):
    """`count` request batches of `batch` candidates: {input name: array}."""
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(count):
        feed = {"dense": rng.standard_normal((batch, DENSE_FEATURES)).astype(np.float32)}
        for f in features:
            lengths = rng.integers(1, f.max_ids + 1, batch)
            ids = np.full((batch, f.max_ids), -1, np.int64)
            mask = np.arange(f.max_ids) < lengths[:, None]
            ids[mask] = rng.integers(0, f.rows, int(mask.sum()))
            feed[f.name] = ids
        result.append(feed)
    return result

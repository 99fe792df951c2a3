"""tfce.embedding_lookup_sparse / safe_embedding_lookup_sparse as drop-ins
for tf.nn's, run on the decoded table as the reference."""
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization

COMBINERS = ("sum", "mean", "sqrtn")
FORMATS = quantization.FORMATS


def random_sparse(rng, batch, max_len, vocab, empty_rows=(), negative=False):
    indices, values, weights = [], [], []
    for b in range(batch):
        if b in empty_rows:
            continue
        for j in range(rng.integers(1, max_len + 1)):
            indices.append([b, j])
            values.append(rng.integers(-2 if negative else 0, vocab))
            weights.append(rng.uniform(-0.5 if negative else 0.5, 1.5))
    shape = [batch, max_len]
    ids = tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                          np.array(values, np.int64), shape)
    w = tf.SparseTensor(ids.indices, np.array(weights, np.float32), shape)
    return ids, w


class EmbeddingLookupSparseTest(tf.test.TestCase, parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(21)
        self.use_format("int8")

    def use_format(self, fmt):
        """self.ct: a table in format `fmt`; self.table: its decoded rows,
        for tf.nn's ops (so quantization error is not counted)."""
        rng = np.random.default_rng(22)
        self.ct = tfce.quantize(reference.random_table(rng, 64, 12), fmt)
        self.table = tf.constant(reference.decoded(self.ct).astype(np.float32))

    @parameterized.product(combiner=COMBINERS, weighted=(False, True),
                           fmt=FORMATS)
    def test_sparse_matches_tf_nn(self, combiner, weighted, fmt):
        self.use_format(fmt)
        ids, w = random_sparse(self.rng, 9, 5, 64, empty_rows=(3, 8))
        w = w if weighted else None
        got = tfce.embedding_lookup_sparse(self.ct, ids, w, combiner=combiner)
        want = tf.nn.embedding_lookup_sparse(self.table, ids, w, combiner=combiner)
        self.assertEqual(got.shape, want.shape)  # 8 rows: TF drops the last empty one
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.product(combiner=COMBINERS, weighted=(False, True),
                           fmt=FORMATS)
    def test_ragged_matches_sparse(self, combiner, weighted, fmt):
        self.use_format(fmt)
        ids, w = random_sparse(self.rng, 7, 4, 64, empty_rows=(0, 6))
        ragged_ids = tf.RaggedTensor.from_sparse(ids)
        ragged_w = tf.RaggedTensor.from_sparse(w) if weighted else None
        got = tfce.embedding_lookup_sparse(self.ct, ragged_ids, ragged_w,
                                           combiner=combiner)
        self.assertEqual(got.shape, (7, 12))  # one row per ragged row
        want = tf.nn.safe_embedding_lookup_sparse(
            self.table, ids, w if weighted else None, combiner=combiner)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.product(combiner=COMBINERS, weighted=(False, True),
                           default_id=(None, 5), fmt=FORMATS)
    def test_safe_matches_tf_nn(self, combiner, weighted, default_id, fmt):
        self.use_format(fmt)
        # Negative ids and weights are pruned; empty rows get default_id or 0.
        ids, w = random_sparse(self.rng, 10, 4, 64, empty_rows=(0, 4, 9),
                               negative=True)
        w = w if weighted else None
        got = tfce.safe_embedding_lookup_sparse(
            self.ct, ids, w, combiner=combiner, default_id=default_id)
        want = tf.nn.safe_embedding_lookup_sparse(
            self.table, ids, w, combiner=combiner, default_id=default_id)
        self.assertEqual(got.shape, want.shape)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(*FORMATS)
    def test_safe_rank3_ids(self, fmt):
        self.use_format(fmt)
        rng = self.rng
        dense = rng.integers(-1, 64, size=(2, 3, 4))
        ids = tf.sparse.from_dense(dense)  # -1 kept as a value, pruned later
        ids = tf.SparseTensor(ids.indices, ids.values, ids.dense_shape)
        got = tfce.safe_embedding_lookup_sparse(self.ct, ids, combiner="sqrtn")
        want = tf.nn.safe_embedding_lookup_sparse(self.table, ids,
                                                  combiner="sqrtn")
        self.assertEqual(got.shape, (2, 3, 12))
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(*FORMATS)
    def test_inside_tf_function(self, fmt):
        self.use_format(fmt)
        ids, w = random_sparse(self.rng, 6, 3, 64)

        @tf.function
        def f(ids, w):
            return tfce.embedding_lookup_sparse(self.ct, ids, w, combiner="mean")

        self.assertAllClose(f(ids, w), tf.nn.embedding_lookup_sparse(
            self.table, ids, w, combiner="mean"), rtol=1e-5, atol=1e-6)

    def test_bad_arguments(self):
        ids, w = random_sparse(self.rng, 3, 3, 64)
        with self.assertRaisesRegex(TypeError, "sp_ids must be a SparseTensor "
                                               "or RaggedTensor"):
            tfce.embedding_lookup_sparse(self.ct, tf.constant([1, 2]))
        with self.assertRaisesRegex(TypeError, "sp_weights must be None or a "
                                               "SparseTensor"):
            tfce.embedding_lookup_sparse(self.ct, ids, tf.constant([1.0]))
        with self.assertRaisesRegex(ValueError, "combiner must be one of"):
            tfce.embedding_lookup_sparse(self.ct, ids, combiner="max")
        with self.assertRaisesRegex(ValueError, "max_norm is not supported"):
            tfce.embedding_lookup_sparse(self.ct, ids, max_norm=1.0)
        with self.assertRaisesRegex(TypeError, "must be a CompressedTable"):
            tfce.embedding_lookup_sparse(self.table, ids)
        bad = tf.SparseTensor(ids.indices, ids.values + 64, ids.dense_shape)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"is not in \[0, 64\)"):
            tfce.embedding_lookup_sparse(self.ct, bad)


if __name__ == "__main__":
    tf.test.main()

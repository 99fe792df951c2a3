"""BatchedFusedDecodeAxpy against its reference semantics, a loop of
FusedDecodeAxpy calls (bit for bit: each bag is pooled by the same kernel in
the same order), and against the float64 numpy reference; its bad inputs,
each named with its feature (docs/bad_input_matrix.md, 4d). Runs on the ISA
row chosen by TFCE_ISA (test_isa.py re-runs this file on every row).
"""
import dataclasses

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import _batched_inputs, _loader, quantization
from tf_compressed_embedding._batched_inputs import ROWS_OF_BAGS, ROWS_WITH_IDS
from tf_compressed_embedding.ops import _table_inputs, _with_max_threads

FORMATS = quantization.FORMATS
COMBINERS = ("sum", "mean", "sqrtn")
DIMS = list(range(1, 34)) + [64, 128, 129]


KINDS = ("ragged", "sparse", "padded")


def random_feature(rng, fmt, dim, rows=37, batch=9, max_len=6,
                   kind="ragged", weighted=False, id_dtype=tf.int64):
    """(CompressedTable, ids, weights): ids a RaggedTensor [batch, (ids)],
    its SparseTensor, or (padded) a dense [batch, max_len + 2] matrix with
    each row's ids at random places among -1 padding; empty rows; weights
    of the same structure."""
    ct = tfce.quantize(reference.random_table(rng, rows, dim), fmt)
    lengths = rng.integers(0, max_len + 1, size=batch)
    lengths[0] = 0
    values = rng.integers(0, rows, size=lengths.sum())
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(values, id_dtype),
                                           lengths)
    weights = None
    if weighted:
        weights = tf.RaggedTensor.from_row_lengths(
            rng.uniform(0.5, 1.5, lengths.sum()).astype(np.float32), lengths)
    if kind == "sparse":
        ids = ids.to_sparse()
        weights = None if weights is None else weights.to_sparse()
    elif kind == "padded":
        width = max_len + 2
        matrix = np.full((batch, width), -1, id_dtype.as_numpy_dtype)
        dense_weights = rng.uniform(-9, 9, (batch, width)).astype(np.float32)
        for b, row in enumerate(ids.numpy()):
            places = np.sort(rng.choice(width, len(row), replace=False))
            matrix[b, places] = row
            if weighted:
                dense_weights[b, places] = weights[b].numpy()
        matrix[matrix < 0] = rng.integers(-5, 0, int((matrix < 0).sum()))
        ids = tf.constant(matrix)
        weights = tf.constant(dense_weights) if weighted else None
    return ct, ids, weights


def one_by_one(ct, ids, weights, combiner):
    """The reference: FusedDecodeAxpy on one feature, with the batched op's
    row count (dense_shape[0] for sparse ids)."""
    if isinstance(ids, tf.RaggedTensor):
        segment_ids, values, rows = ids.value_rowids(), ids.flat_values, ids.nrows()
        w = None if weights is None else weights.flat_values
    elif not isinstance(ids, tf.SparseTensor):  # padded: the ids >= 0
        where = tf.where(ids >= 0)
        segment_ids, values, rows = where[:, 0], tf.gather_nd(ids, where), ids.shape[0]
        w = None if weights is None else tf.gather_nd(weights, where)
    else:
        segment_ids, values, rows = ids.indices[:, 0], ids.values, ids.dense_shape[0]
        w = None if weights is None else weights.values
    return tfce.fused_decode_axpy(ct, values, segment_ids, w, combiner,
                                  num_segments=rows)


def numpy_reference(ct, ids, weights, combiner):
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        ids = tf.RaggedTensor.from_tensor(ids, ragged_rank=1)
        ids, weights = (
            tf.ragged.boolean_mask(ids, ids >= 0),
            None if weights is None else tf.ragged.boolean_mask(
                tf.RaggedTensor.from_tensor(weights, ragged_rank=1), ids >= 0))
    if isinstance(ids, tf.SparseTensor):
        ids = tf.RaggedTensor.from_sparse(ids)
        weights = None if weights is None else tf.RaggedTensor.from_sparse(weights)
    w = None if weights is None else weights.flat_values.numpy()
    return reference.pool_table(ct, ids.flat_values.numpy(),
                                ids.value_rowids().numpy(), w, combiner,
                                int(ids.nrows()))


class BatchedValuesTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.product(combiner=COMBINERS, weighted=(False, True),
                           id_dtype=(tf.int32, tf.int64))
    def test_every_format_and_dim_equals_per_table_op(self, combiner,
                                                      weighted, id_dtype):
        rng = np.random.default_rng(21)
        features = [random_feature(rng, FORMATS[i % len(FORMATS)], dim,
                                   kind=KINDS[i % 3], weighted=weighted,
                                   id_dtype=id_dtype)
                    for i, dim in enumerate(DIMS)]
        tables, ids, weights = zip(*features)
        got = tfce.batched_embedding_lookup_sparse(
            tables, ids, list(weights), combiners=combiner)
        self.assertLen(got, len(features))
        for f, (ct, i, w) in enumerate(features):
            self.assertAllEqual(got[f], one_by_one(ct, i, w, combiner),
                                msg=f"feature {f}: {ct.format} dim {ct.dim}")
        # And within the float32 bound of the float64 numpy reference.
        for f in (0, 5, 17, len(features) - 1):
            want, bound = numpy_reference(*features[f], combiner)
            self.assertAllLessEqual(np.abs(got[f].numpy() - want) - bound, 0)

    def test_concat_is_the_outputs_side_by_side(self):
        rng = np.random.default_rng(22)
        features = [random_feature(rng, fmt, dim, kind=KINDS[dim % 3])
                    for fmt, dim in zip(FORMATS * 3, range(3, 40, 3))]
        tables, ids, _ = zip(*features)
        combiners = [COMBINERS[f % 3] for f in range(len(features))]
        apart = tfce.batched_embedding_lookup_sparse(tables, ids,
                                                     combiners=combiners)
        together = tfce.batched_embedding_lookup_sparse(
            tables, ids, combiners=combiners, concat=True)
        self.assertAllEqual(together, np.concatenate(apart, axis=1))

    def test_features_sharing_a_table_and_different_batch_sizes(self):
        rng = np.random.default_rng(23)
        ct = tfce.quantize(reference.random_table(rng, 50, 16), "int8")
        user = tf.ragged.constant([[3, 4, 4]], tf.int64)  # one row
        candidates = tf.ragged.constant([[1], [2], [49], [0]], tf.int64)
        got = tfce.batched_embedding_lookup_sparse(
            [ct, ct], [user, candidates], combiners=["mean", "sum"])
        self.assertAllEqual(got[0], one_by_one(ct, user, None, "mean"))
        self.assertAllEqual(got[1], one_by_one(ct, candidates, None, "sum"))

    def test_padded_features_of_mixed_id_types_and_odd_sizes(self):
        # The op packs every padded feature of a call into one buffer: int32
        # ids of an odd count before int64 ones, weighted among unweighted,
        # each equal to the per-table op.
        rng = np.random.default_rng(25)
        specs = [(tf.int32, False, 5, 9), (tf.int64, True, 4, 7),
                 (tf.int32, True, 3, 1), (tf.int64, False, 6, 2),
                 (tf.int32, False, 1, 5), (tf.int64, True, 2, 11)]
        features = [random_feature(rng, FORMATS[f % len(FORMATS)], 3 + f,
                                   batch=batch, max_len=max_len, kind="padded",
                                   weighted=weighted, id_dtype=dtype)
                    for f, (dtype, weighted, max_len, batch) in enumerate(specs)]
        tables, ids, weights = zip(*features)
        got = tfce.batched_embedding_lookup_sparse(tables, ids, list(weights),
                                                   combiners="sqrtn")
        for f, (ct, i, w) in enumerate(features):
            self.assertAllEqual(got[f], one_by_one(ct, i, w, "sqrtn"),
                                msg=f"feature {f}: {i.dtype} {i.shape}")

    @parameterized.parameters(*FORMATS)
    def test_empty_features_and_zero_width_tables(self, fmt):
        rng = np.random.default_rng(24)
        ct = tfce.quantize(reference.random_table(rng, 10, 5), fmt)
        no_rows = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), [0])
        no_ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64),
                                                  [0, 0, 0])
        some = tf.ragged.constant([[1, 2], [], [9]], tf.int64)
        got = tfce.batched_embedding_lookup_sparse(
            [ct, ct, ct], [no_rows, no_ids, some], combiners="mean")
        self.assertEqual(got[0].shape, (0, 5))
        self.assertAllEqual(got[1], np.zeros((3, 5)))
        self.assertAllEqual(got[2], one_by_one(ct, some, None, "mean"))
        # A zero-width (int8_split [V, 0]) table still checks its ids.
        wide0 = tfce.CompressedTable(np.zeros((10, 0), np.int8),
                                     np.zeros(10, np.float32), "int8_split")
        got = tfce.batched_embedding_lookup_sparse(
            [wide0, ct], [some, some], concat=True)
        self.assertAllEqual(got, one_by_one(ct, some, None, "mean"))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"feature 0: ids\[1\] = 12 is not in \[0, 10\)"):
            tfce.batched_embedding_lookup_sparse(
                [wide0], [tf.ragged.constant([[1, 12]], tf.int64)])

    def test_graph_mode_static_shapes(self):
        rng = np.random.default_rng(25)
        cts = [tfce.quantize(reference.random_table(rng, 20, d), fmt)
               for d, fmt in [(8, "int4"), (12, "fp16"), (3, "int8_split")]]

        @tf.function(input_signature=[
            tf.RaggedTensorSpec([None, None], tf.int64),
            tf.SparseTensorSpec([None, None], tf.int64)])
        def apart(ragged, sparse):
            return tfce.batched_embedding_lookup_sparse(
                cts, [ragged, sparse, ragged])

        @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
        def together(ragged):
            return tfce.batched_embedding_lookup_sparse(
                cts, [ragged] * 3, concat=True)

        shapes = [o.shape.as_list()
                  for o in apart.get_concrete_function().structured_outputs]
        self.assertEqual(shapes, [[None, 8], [None, 12], [None, 3]])
        self.assertEqual(together.get_concrete_function().structured_outputs
                         .shape.as_list(), [None, 23])
        ragged = tf.ragged.constant([[1, 2], [3]], tf.int64)
        eager = tfce.batched_embedding_lookup_sparse(cts, [ragged] * 3,
                                                     concat=True)
        self.assertAllEqual(together(ragged), eager)

    def test_split_over_threads_equals_one_thread(self):
        # Enough work that the op cuts features into tiles over the pool
        # (bags of 20 ids, 600 bags a feature): results do not depend on it.
        rng = np.random.default_rng(26)
        features = [random_feature(rng, FORMATS[f % len(FORMATS)], 16 + f,
                                   rows=3000, batch=600, max_len=40,
                                   kind=KINDS[f % 3], weighted=True)
                    for f in range(12)]
        tables, ids, weights = zip(*features)

        def run(max_threads):
            @tf.function
            def f():
                out = tfce.batched_embedding_lookup_sparse(
                    tables, ids, list(weights), concat=True)
                return _with_max_threads(out, max_threads)
            return f()

        self.assertAllEqual(run(0), run(1))
        self.assertAllEqual(
            run(0), np.concatenate([one_by_one(ct, i, w, "mean")
                                    for ct, i, w in features], axis=1))

    def test_segment_id_inputs_with_gaps_and_trailing_empty_bags(self):
        rng = np.random.default_rng(27)
        ct = tfce.quantize(reference.random_table(rng, 30, 7), "int8")
        ids = np.array([4, 5, 6, 7], np.int64)
        segment_ids = np.array([1, 1, 4, 4], np.int64)
        got = raw_batched([table_feature(ct, ids, "segment_ids", segment_ids,
                                         num_bags=np.int64(7))])
        self.assertAllEqual(got[0], tfce.fused_decode_axpy(
            ct, ids, segment_ids, num_segments=7))
        # num_bags may be int32, as FusedDecodeAxpy's num_segments.
        got32 = raw_batched([table_feature(ct, ids, "segment_ids", segment_ids,
                                           num_bags=np.int32(7))])
        self.assertAllEqual(got32[0], got[0])

    def test_counted_rows_of_segment_ids_are_the_last_id_plus_one(self):
        # As SparseSegment* ops without num_segments (and FusedDecodeAxpy's
        # wrapper default): the last segment id + 1, 0 without ids; both
        # counts agree for segment ids.
        rng = np.random.default_rng(28)
        ct = tfce.quantize(reference.random_table(rng, 30, 5), "int4")

        def batched(ids, segment_ids, num_bags):
            return raw_batched([table_feature(ct, ids, "segment_ids", segment_ids,
                                              num_bags=num_bags,
                                              combiner="mean")])[0]

        ids = np.array([4, 5, 6, 7], np.int64)
        for count in (ROWS_OF_BAGS, ROWS_WITH_IDS):
            for segment_ids in ([0, 0, 3, 3], [2, 2, 2, 2], [0, 1, 2, 3]):
                for dtype in (np.int32, np.int64):
                    got = batched(ids, np.array(segment_ids, dtype), count)
                    self.assertAllEqual(got, tfce.fused_decode_axpy(
                        ct, ids, segment_ids, combiner="mean"))
            empty = batched(np.zeros([0], np.int64), np.zeros([0], np.int64),
                            count)
            self.assertEqual(empty.shape, (0, 5))
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        r"feature 0: segment_ids\[0\] = -3 is "
                                        r"not in \[0, 0\)"):
                batched(ids[:1], np.array([-3], np.int64), count)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 2)
        def graph(i, s):
            return batched(i, s, ROWS_OF_BAGS)

        self.assertEqual(graph.get_concrete_function().structured_outputs
                         .shape.as_list(), [None, 5])
        self.assertAllEqual(graph(ids, np.array([0, 0, 3, 3])),
                            batched(ids, np.array([0, 0, 3, 3]), ROWS_OF_BAGS))


    def matrix_kind(self, ct, ids, kind, num_bags=ROWS_OF_BAGS, weights=None,
                    combiner="sum"):
        """The raw op on one 'dense' or 'padded' feature."""
        if isinstance(num_bags, int):
            num_bags = np.int64(num_bags)
        return raw_batched([table_feature(ct, ids, kind, weights=weights,
                                          num_bags=num_bags,
                                          combiner=combiner)])[0]

    @parameterized.product(fmt=FORMATS, id_dtype=(np.int32, np.int64))
    def test_dense_rows_are_bags(self, fmt, id_dtype):
        rng = np.random.default_rng(29)
        ct = tfce.quantize(reference.random_table(rng, 40, 9), fmt)
        ids = rng.integers(0, 40, (6, 5)).astype(id_dtype)
        weights = rng.uniform(0.5, 1.5, (6, 5)).astype(np.float32)
        segment_ids = np.repeat(np.arange(6), 5)
        for num_bags in (ROWS_OF_BAGS, ROWS_WITH_IDS, 6):
            got = self.matrix_kind(ct, ids, "dense", num_bags, weights, "sqrtn")
            self.assertAllEqual(got, tfce.fused_decode_axpy(
                ct, ids.reshape(-1), segment_ids, weights.reshape(-1),
                "sqrtn", num_segments=6))
        # Zero rows, and rows of zero ids (empty bags: zeros).
        self.assertEqual(self.matrix_kind(ct, ids[:0], "dense").shape, (0, 9))
        self.assertAllEqual(self.matrix_kind(ct, ids[:, :0], "dense"),
                            np.zeros((6, 9)))

    @parameterized.parameters(*FORMATS)
    def test_padded_rows_count_as_sparse_segment_ops_do(self, fmt):
        # rows_with_ids: the last row with an id + 1, as a SparseSegment* op
        # pools the SparseTensor of tf.where(ids >= 0); rows_of_bags: every
        # row of ids; a larger num_bags adds empty bags.
        rng = np.random.default_rng(30)
        ct = tfce.quantize(reference.random_table(rng, 40, 6), fmt)
        ids = np.array([[-1, 3, -7, 4], [-1] * 4, [0, -1, 39, 39],
                        [-1] * 4, [-2] * 4], np.int64)
        where = tf.where(ids >= 0)
        values, segment_ids = tf.gather_nd(ids, where), where[:, 0]
        for num_bags, rows in ((ROWS_WITH_IDS, None), (ROWS_OF_BAGS, 5), (8, 8)):
            got = self.matrix_kind(ct, ids, "padded", num_bags, combiner="mean")
            self.assertAllEqual(got, tfce.fused_decode_axpy(
                ct, values, segment_ids, combiner="mean", num_segments=rows))
        self.assertEqual(got.shape, (8, 6))
        self.assertEqual(self.matrix_kind(ct, np.full((4, 2), -1), "padded",
                                          ROWS_WITH_IDS).shape, (0, 6))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def graph(ids):
            return [self.matrix_kind(ct, ids, "padded", ROWS_WITH_IDS,
                                     combiner="mean"),
                    self.matrix_kind(ct, tf.maximum(ids, 0), "dense",
                                     ROWS_WITH_IDS)]

        shapes = [o.shape.as_list()
                  for o in graph.get_concrete_function().structured_outputs]
        self.assertEqual(shapes, [[None, 6], [None, 6]])
        self.assertAllEqual(graph(ids)[0], got[:3])

    def test_row_splits_rows_with_ids_drops_trailing_empty_rows(self):
        # What tf.nn.embedding_lookup_sparse of a RaggedTensor outputs.
        rng = np.random.default_rng(31)
        ct = tfce.quantize(reference.random_table(rng, 40, 5), "int8")
        for lengths in ([2, 0, 3, 0, 0], [0, 0], [1], []):
            ragged = tf.RaggedTensor.from_row_lengths(
                rng.integers(0, 40, sum(lengths)), lengths)
            got = raw_batched([table_feature(
                ct, ragged.flat_values, "row_splits", ragged.row_splits,
                num_bags=ROWS_WITH_IDS, combiner="sqrtn")])[0]
            self.assertAllEqual(got, tfce.fused_decode_axpy(
                ct, ragged.flat_values, ragged.value_rowids(), combiner="sqrtn"))
            if sum(lengths):
                self.assertEqual(got.shape, tf.nn.embedding_lookup_sparse(
                    ct.dequantize(), ragged, None, combiner="sqrtn").shape)

def table_feature(ct, ids, kind, bag_splits=None, weights=None,
                  num_bags=ROWS_OF_BAGS, combiner="sum"):
    """A dict of raw_batched's for one feature over CompressedTable `ct`."""
    table = _table_inputs(ct)
    row_format = table.get("row_format", "plain")
    has_scales = _batched_inputs.has_scales(table["table"].dtype.name, row_format)
    return dict(table=table["table"], scales=table["scales"] if has_scales else None,
                ids=ids, bag_splits=bag_splits, weights=weights,
                num_bags=num_bags, row_format=row_format,
                dim=table.get("dim", -1), combiner=combiner, bag_kind=kind)


def raw_batched(features, concat=False, names=(), **overrides):
    """The raw op on `features`: dicts of _batched_inputs.Feature's fields
    (None: no such input), laid out as the wrappers lay them out."""
    args = _batched_inputs.layout([_batched_inputs.Feature(**f) for f in features])
    args.update(concat=concat, num_outputs=1 if concat else len(features),
                feature_names=list(names))
    args.update(overrides)
    return _loader.ops().batched_fused_decode_axpy(**args)


class BatchedBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """Bad-input matrix 4d: every error names the feature, eagerly and in a
    graph, and says what FusedDecodeAxpy would say of that input."""

    def feature(self, fmt="int8", rows=10, dim=4, ids=(1, 2), splits=(0, 0),
                kind="segment_ids", num_bags=2, weights=None):
        data, scales = quantization.encode(np.ones((rows, dim), np.float32), fmt)
        return dict(table=data, scales=scales if fmt == "int8_split" else None,
                    ids=np.array(ids, np.int64),
                    bag_splits=(None if splits is None
                                else np.array(splits, np.int64)),
                    weights=(None if weights is None
                             else np.asarray(weights, np.float32)),
                    num_bags=(num_bags if isinstance(num_bags, str)
                              else np.int64(num_bags)),
                    row_format=quantization.op_row_format(fmt),
                    dim=dim if fmt in quantization.ROWWISE_FORMATS else -1,
                    combiner="sum", bag_kind=kind)

    def assert_invalid(self, pattern, features, concat=False, names=()):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_batched(features, concat, names)
        # The same inputs as placeholders of unknown shape.
        arrays = [(f, k) for f, feature in enumerate(features)
                  for k, v in feature.items() if isinstance(v, np.ndarray | np.generic)]
        flat = [tf.constant(features[f][k]) for f, k in arrays]

        @tf.function(input_signature=[tf.TensorSpec(None, a.dtype) for a in flat])
        def graph(*a):
            fs = [dict(f) for f in features]
            for (f, k), placeholder in zip(arrays, a):
                fs[f][k] = placeholder
            return raw_batched(fs, concat, names)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            graph(*flat)

    @parameterized.parameters(*FORMATS)
    def test_bad_id_names_feature_position_and_segment(self, fmt):
        good = self.feature(fmt)
        bad = self.feature(fmt, ids=(1, 10), splits=(0, 1))
        self.assert_invalid(
            r"feature 1: ids\[1\] = 10 \(in segment 1\) is not in \[0, 10\)",
            [good, bad])
        self.assert_invalid(
            r"feature 1 \('item'\): ids\[1\] = 10 \(in segment 1\)",
            [good, bad], names=("user", "item"))
        ragged = self.feature(fmt, ids=(-1, 1), splits=(0, 2), kind="row_splits",
                              num_bags=ROWS_OF_BAGS)
        self.assert_invalid(r"feature 0: ids\[0\] = -1 is not in \[0, 10\)",
                            [ragged, bad])

    def test_dense_and_padded_bag_kinds(self):
        def matrix(kind, ids=((1, 2), (3, -1)), **kw):
            return self.feature(ids=ids, splits=None, kind=kind, **kw)

        for kind in ("dense", "padded"):
            self.assert_invalid(
                rf"feature 1: ids must be a matrix \[rows, width\] \(bag kind "
                rf"'{kind}'\), but has shape \[2\]",
                [self.feature(), self.feature(splits=None, kind=kind)])
            self.assert_invalid(
                r"feature 0: weights must have the shape of ids, \[2,2\], or "
                r"\[0\] \(unweighted\), but has shape \[4\]",
                [matrix(kind, weights=np.ones(4))])
            self.assert_invalid(r"feature 0: ids\[0,1\] = 10 is not in \[0, 10\)",
                                [matrix(kind, ids=((1, 10), (3, 4)))])
        self.assert_invalid(r"feature 0: ids\[1,1\] = -1 is not in \[0, 10\)",
                            [matrix("dense")])
        self.assert_invalid(r"feature 0: num_bags = 3 but ids has 2 rows: give "
                            r"2, or let the op count them \(bag_counts "
                            r"'rows_of_bags' or 'rows_with_ids'\)",
                            [matrix("dense", num_bags=3)])
        self.assert_invalid(r"feature 0: num_bags = 1 but row 1 of ids holds "
                            r"ids: give at least 2, or let the op count them "
                            r"\(bag_counts 'rows_of_bags': ids' rows; "
                            r"'rows_with_ids': the last row holding an id \+ 1\)",
                            [matrix("padded", num_bags=1)])
        self.assert_invalid(r"feature 0: num_bags = -3 must be >= 0",
                            [matrix("padded", num_bags=-3)])

    def test_first_feature_with_a_bad_id_is_reported(self):
        # Both bad: the report does not depend on which thread saw which.
        bad = [self.feature(ids=(1, 99), splits=(0, 1)) for _ in range(3)]
        self.assert_invalid(r"feature 1: ids\[1\] = 99", [self.feature()] + bad)

    def test_segment_ids(self):
        self.assert_invalid(r"feature 1: segment_ids are not sorted",
                            [self.feature(), self.feature(splits=(1, 0))])
        self.assert_invalid(r"feature 1: segment_ids\[1\] = 2 is not in \[0, 2\)",
                            [self.feature(), self.feature(splits=(0, 2))])
        self.assert_invalid(r"feature 0: segment_ids must have the same size as ids",
                            [self.feature(splits=(0,))])
        self.assert_invalid(r"feature 0: segment_ids must be a vector",
                            [self.feature(splits=[[0, 0]])])

    def test_row_splits(self):
        def ragged(splits, num_bags=ROWS_OF_BAGS, ids=(1, 2)):
            return self.feature(ids=ids, splits=splits, kind="row_splits",
                                num_bags=num_bags)
        self.assert_invalid(r"feature 1: row_splits\[0\] = 1 must be 0",
                            [ragged((0, 2)), ragged((1, 2))])
        self.assert_invalid(r"feature 0: row_splits are not sorted: "
                            r"row_splits\[1\] = 2 > row_splits\[2\] = 1",
                            [ragged((0, 2, 1, 2))])
        self.assert_invalid(r"feature 0: row_splits\[1\] = 3 must be the "
                            r"number of ids, 2", [ragged((0, 3))])
        self.assert_invalid(r"feature 0: row_splits must have at least one",
                            [ragged(np.zeros([0], np.int64), ids=())])
        self.assert_invalid(r"feature 0: num_bags = 3 but row_splits has 2 "
                            r"elements, so 1 rows: give their number, or let "
                            r"the op count them", [ragged((0, 2), num_bags=3)])
        # rows_with_ids drops trailing empty rows, but every split is still
        # checked.
        self.assert_invalid(r"feature 0: row_splits are not sorted",
                            [ragged((0, 2, 1, 2), num_bags=ROWS_WITH_IDS)])
        self.assert_invalid(r"feature 0: row_splits\[2\] = 3 must be the "
                            r"number of ids, 2",
                            [ragged((0, 2, 3), num_bags=ROWS_WITH_IDS)])
        self.assert_invalid(r"feature 0: row_splits must be a vector",
                            [ragged([[0, 2]])])

    def test_ids_weights_and_num_bags(self):
        self.assert_invalid(r"feature 0: ids must be a vector",
                            [self.feature(ids=[[1, 2]])])
        self.assert_invalid(r"feature 1: weights must have shape \[2\] \(one "
                            r"per id\) or \[0\]",
                            [self.feature(), self.feature(weights=[1.0])])
        # The op counts rows only when bag_counts says so: the old -1 and
        # -2 markers are refused as any given count below 0.
        for given in (-1, -2, -3):
            self.assert_invalid(rf"feature 0: num_bags = {given} must be >= 0",
                                [self.feature(num_bags=given)])
        f = self.feature()
        f["num_bags"] = np.array([2], np.int64)
        self.assert_invalid(r"feature 0: num_bags must be a scalar", [f])

    def test_table_and_scales_checks_apply(self):
        f = self.feature("int8_split")
        f["scales"] = np.ones(3, np.float32)
        self.assert_invalid(r"feature 0: scales must have one float32 per "
                            r"table row", [f])
        h = self.feature("int4", dim=5)
        h["table"] = h["table"][:, :-1]
        self.assert_invalid(r"feature 0: table must have shape \[rows, 7\]", [h])

    def test_concat_needs_equal_bag_counts(self):
        self.assert_invalid(r"feature 2: has 3 bags, but feature 0 has 2: a "
                            r"concatenated output",
                            [self.feature(), self.feature(),
                             self.feature(num_bags=3)], concat=True)

    def test_huge_num_bags_fails_cleanly(self):
        # Outputs above kValidateFirstElements are allocated after the ids are
        # checked: a bad id is named, not an out-of-memory.
        self.assert_invalid(r"feature 1: ids\[1\] = 10",
                            [self.feature(num_bags=2**40),
                             self.feature(ids=(1, 10), splits=(0, 1))])
        with self.assertRaises((tf.errors.InvalidArgumentError,
                                tf.errors.ResourceExhaustedError)):
            raw_batched([self.feature(num_bags=2**40)])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "more elements than int64 can count"):
            raw_batched([self.feature(num_bags=2**62)])

    def test_attrs_are_checked_when_the_graph_is_built(self):
        cases = [
            ({"combiners": ["max"]}, r"feature 0: combiner must be one of"),
            ({"bag_kinds": ["lengths"]}, r"feature 0: bag_kinds must be "
                                         r"'segment_ids', 'row_splits', "
                                         r"'dense' or 'padded', got 'lengths'"),
            ({"dims": [-1, -1]}, r"attr dims must have one entry per feature"),
            ({"num_outputs": 2}, r"attr num_outputs must be 1"),
            ({"feature_names": ["a", "b"]}, r"attr feature_names must be "
                                            r"empty or have one name per"),
            ({"row_formats": ["int4_rowwise"]},
             r"feature 0: a table of row_format 'int4_rowwise' must be uint8"),
            ({"ids": [np.zeros(1, np.int64)] * 2},
             r"attr Tids \(the ids inputs\) must have one entry per feature"),
            ({"bag_counts": ["all"]},
             r"feature 0: bag_counts must be 'given', 'rows_of_bags' or "
             r"'rows_with_ids', got 'all'"),
            ({"weighted": [False, False]},
             r"attr weighted must have one entry per feature"),
            # Each input list holds exactly the inputs its features need.
            ({"num_bags": [np.int64(1)] * 3},
             r"attr Tnum_bags \(the num_bags inputs\): one per feature whose "
             r"bag_counts is 'given': 1 for these features, but has 3"),
            ({"scales": []},
             r"attr num_scales \(the scales inputs\): one per 'plain' int8 "
             r"table: 1 for these features, but has 0"),
            ({"bag_kinds": ["dense"]},
             r"attr Tsplits \(the bag_splits inputs\): one per 'segment_ids' "
             r"or 'row_splits' feature: 0 for these features, but has 1"),
            ({"weights": [np.ones(2, np.float32)]},
             r"attr num_weights \(the weights inputs\): one per weighted "
             r"feature: 0 for these features, but has 1"),
        ]
        for overrides, pattern in cases:
            with self.subTest(attr=", ".join(overrides)):
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                            pattern):
                    raw_batched([self.feature("int8_split")], **overrides)

                @tf.function
                def build(overrides=overrides):
                    return raw_batched([self.feature("int8_split")], **overrides)

                with self.assertRaisesRegex(ValueError, pattern):
                    build.get_concrete_function()

    def test_shape_function_names_the_feature_of_a_rank_error(self):
        @tf.function
        def build():
            f = self.feature()
            g = dict(f, ids=tf.zeros([2, 2], tf.int64))
            return raw_batched([f, g])

        with self.assertRaisesRegex(ValueError, r"feature 1: .*must be rank 1"):
            build.get_concrete_function()


class BatchedPythonApiTest(tf.test.TestCase):

    def test_argument_errors(self):
        ct = tfce.quantize(np.ones((4, 2), np.float32), "int8")
        ids = tf.ragged.constant([[1]], tf.int64)
        with self.assertRaisesRegex(ValueError, "at least one table"):
            tfce.batched_embedding_lookup_sparse([], [])
        with self.assertRaisesRegex(ValueError, r"sp_ids must have one entry "
                                                r"per table \(2\), got 1"):
            tfce.batched_embedding_lookup_sparse([ct, ct], [ids])
        with self.assertRaisesRegex(ValueError, "combiners must have one entry"):
            tfce.batched_embedding_lookup_sparse([ct], [ids],
                                                 combiners=["sum", "mean"])
        with self.assertRaisesRegex(ValueError, "combiner must be one of"):
            tfce.batched_embedding_lookup_sparse([ct], [ids], combiners="max")
        with self.assertRaisesRegex(TypeError, r"sp_ids\[0\] must be a "
                                               r"SparseTensor, a RaggedTensor "
                                               r"or a dense int tensor"):
            tfce.batched_embedding_lookup_sparse([ct], [{"ids": 1}])
        with self.assertRaisesRegex(TypeError, r"sp_ids\[0\] must hold int32 "
                                               r"or int64 ids, got float32"):
            tfce.batched_embedding_lookup_sparse([ct], [tf.constant([[1.0]])])
        with self.assertRaisesRegex(ValueError, r"sp_ids\[0\] must be a dense "
                                                r"\[batch, length\] matrix"):
            tfce.batched_embedding_lookup_sparse([ct], [tf.constant([1])])
        with self.assertRaisesRegex(ValueError, r"sp_weights\[0\] must have "
                                                r"the shape of sp_ids\[0\]"):
            tfce.batched_embedding_lookup_sparse(
                [ct], [tf.constant([[1, -1]])], [tf.ones([2, 3])])
        with self.assertRaisesRegex(ValueError, "feature_names must be a list"):
            tfce.batched_embedding_lookup_sparse([ct], [ids],
                                                 feature_names="a")

    def test_ragged_weights_with_other_row_lengths(self):
        ct = tfce.quantize(np.ones((4, 2), np.float32), "int8")
        ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
        weights = tf.ragged.constant([[1.0], [2.0, 3.0]])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"sp_weights\[0\] must have the row "
                                    r"lengths of sp_ids\[0\]"):
            tfce.batched_embedding_lookup_sparse([ct], [ids], [weights])

    def test_one_node_reads_the_table_variables_itself(self):
        # A CompressedTable's variables go in as their handles: no
        # ReadVariableOp or DisableCopyOnRead node per table, and a shared
        # table is one handle.
        cts = [tfce.quantize(np.ones((4, 2), np.float32), fmt)
               for fmt in ("int8", "fp16")]

        @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
        def f(ids):
            return tfce.batched_embedding_lookup_sparse(
                [cts[0], cts[1], cts[0]], [ids] * 3, concat=True)

        graph = f.get_concrete_function().graph
        types = [op.type for op in graph.get_operations()]
        self.assertEqual(types.count("BatchedFusedDecodeAxpy"), 1)
        self.assertEqual(types.count("ReadVariableOp"), 0)
        self.assertEqual(types.count("DisableCopyOnRead"), 0)
        node = next(op for op in graph.get_operations()
                    if op.type == "BatchedFusedDecodeAxpy")
        self.assertEqual([t.dtype for t in node.inputs[:3]], [tf.resource] * 3)
        self.assertEqual(node.inputs[0].op, node.inputs[2].op)
        ragged = tf.ragged.constant([[1, 3], [0]], tf.int64)
        self.assertAllEqual(f(ragged), np.concatenate(
            [one_by_one(ct, ragged, None, "mean") for ct in
             (cts[0], cts[1], cts[0])], axis=1))


def handle_feature(handle, dtype, fmt="fp16", ids=(1, 2)):
    """A one-bag feature whose table is `handle` (or any tensor) of `dtype`."""
    return _batched_inputs.Feature(
        table=handle, ids=np.array(ids, np.int64), bag_kind="segment_ids",
        row_format=quantization.op_row_format(fmt),
        bag_splits=np.zeros(len(ids), np.int64), num_bags=np.int64(1),
        table_dtype=dtype)


class BatchedVariableTablesTest(tf.test.TestCase, parameterized.TestCase):
    """Tables given as resource variable handles, which the op reads."""

    def run_features(self, features, **overrides):
        args = _batched_inputs.layout(features)
        args.update(num_outputs=len(features), **overrides)
        return _loader.ops().batched_fused_decode_axpy(**args)

    @parameterized.parameters(*FORMATS)
    def test_a_handle_and_its_value_give_the_same_result(self, fmt):
        rng = np.random.default_rng(42)
        ct, ids, weights = random_feature(rng, fmt, 13, kind="ragged", weighted=True)
        handles = tfce.batched_embedding_lookup_sparse([ct], [ids], [weights])[0]
        values = raw_batched([table_feature(  # the table read into tensors
            ct, ids.flat_values, "row_splits", ids.row_splits,
            weights=weights.flat_values, combiner="mean")])[0]
        self.assertAllEqual(handles, values)

    def test_variable_in_copy_on_read_mode_is_read_at_its_current_value(self):
        # A gather puts the variable in copy-on-read mode, in which sparse
        # updates write its buffer in place; the op turns the mode off and
        # reads the current value, before and after an assignment.
        rng = np.random.default_rng(43)
        ct, ids, _ = random_feature(rng, "int8", 6)
        values = ct.data.numpy()

        def expected(data):
            return raw_batched([table_feature(
                tfce.CompressedTable(data, ct.scales.numpy(), ct.format, ct.dim),
                ids.flat_values, "row_splits", ids.row_splits,
                combiner="mean")])[0]

        for data in (values, values[::-1]):
            ct.data.assign(data)
            tf.gather(ct.data, [0])  # ResourceGather: copy-on-read mode
            self.assertAllEqual(tfce.batched_embedding_lookup_sparse([ct], [ids])[0],
                                expected(data))

    def test_missing_variable_is_named(self):
        # A handle to a variable never created (or already deleted).
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float16, shape=[4, 2],
                                        shared_name="tfce_never_assigned")
        with self.assertRaisesRegex(tf.errors.NotFoundError,
                                    r"feature 0: table variable not found "
                                    r"\(create and initialize or restore it "
                                    r"before the call\): .*tfce_never_assigned"):
            self.run_features([handle_feature(handle, tf.float16)])

    def test_missing_variable_after_found_ones_is_named(self):
        # The op looks all handles up at once; the one not found is still
        # reported with its own feature, after the ones that were.
        present = tf.Variable(np.ones((4, 2), np.float16))
        missing = tf.raw_ops.VarHandleOp(dtype=tf.float16, shape=[4, 2],
                                         shared_name="tfce_never_assigned_2")
        with self.assertRaisesRegex(tf.errors.NotFoundError,
                                    r"feature 2: table variable not found "
                                    r".*tfce_never_assigned_2"):
            self.run_features([handle_feature(present.handle, tf.float16)] * 2
                              + [handle_feature(missing, tf.float16)])

    def test_variable_of_another_dtype_is_named(self):
        variable = tf.Variable(np.ones((4, 2), np.float16))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"feature 0: table variable holds half but "
                                    r"attr table_dtypes says uint8"):
            self.run_features([handle_feature(variable.handle, tf.uint8,
                                                   fmt="int8")],
                              dims=[2])

    def test_table_dtypes_attr_errors(self):
        variable = tf.Variable(np.ones((4, 2), np.float16))
        feature = handle_feature(variable.handle, tf.float16)
        tensor = handle_feature(tf.constant(np.ones((4, 2), np.float16)),
                                     tf.float16)
        cases = [
            ({"table_dtypes": []}, r"feature 0: a table given as a resource "
                                   r"variable needs its dtype in attr table_dtypes"),
            ({"table_dtypes": [tf.float16] * 2}, r"attr table_dtypes must be "
                                                 r"empty \(every table a tensor\) "
                                                 r"or have one entry per feature"),
        ]
        for overrides, pattern in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
                    self.run_features([feature], **overrides)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"feature 0: table is half but table_dtypes "
                                    r"says int8"):
            self.run_features([tensor], table_dtypes=[tf.int8])
        with self.assertRaisesRegex(ValueError, "table_dtype must be given for "
                                                "every feature or for none"):
            _batched_inputs.layout([feature, dataclasses.replace(tensor, table_dtype=None)])


class BatchedNamedTablesTest(tf.test.TestCase, parameterized.TestCase):
    """Tables named by their variables' shared names (attr table_names), as
    the export writes them for the Session path: the op looks each one up in
    its device's resource manager, with no table inputs."""

    def named_variable(self, name, value):
        handle = tf.raw_ops.VarHandleOp(dtype=tf.as_dtype(value.dtype),
                                        shape=value.shape, shared_name=name)
        tf.raw_ops.AssignVariableOp(resource=handle, value=value)
        return handle

    def by_name(self, features, names, **overrides):
        args = _batched_inputs.layout(features)
        args.update(tables=[], table_names=names, num_outputs=len(features))
        args.update(overrides)
        return _loader.ops().batched_fused_decode_axpy(**args)

    @parameterized.parameters(*FORMATS)
    def test_named_tables_equal_their_handles(self, fmt):
        rng = np.random.default_rng(44)
        cts, features, names = [], [], []
        for t in range(2):
            ct, ids, weights = random_feature(rng, fmt, 5 + 8 * t, kind="ragged",
                                              weighted=True)
            cts.append((ct, ids, weights))
        # Two features share the first table, as a shared handle would.
        for t in (0, 1, 0):
            ct, ids, weights = cts[t]
            name = f"tfce_named_{fmt}_{t}"
            handle = self.named_variable(name, ct.data.numpy())
            table = _table_inputs(ct)
            features.append(_batched_inputs.Feature(
                table=handle, table_dtype=ct.data.dtype,
                scales=table["scales"] if fmt == "int8_split" else None,
                ids=ids.flat_values, bag_kind="row_splits", bag_splits=ids.row_splits,
                weights=weights.flat_values, num_bags=ROWS_OF_BAGS,
                row_format=table.get("row_format", "plain"), dim=table.get("dim", -1),
                combiner="mean"))
            names.append(name)
        want = tfce.batched_embedding_lookup_sparse(
            [cts[t][0] for t in (0, 1, 0)], [cts[t][1] for t in (0, 1, 0)],
            [cts[t][2] for t in (0, 1, 0)])
        got = self.by_name(features, names)
        for g, w in zip(got, want):
            self.assertAllEqual(g, w)

    def test_session_reads_the_variables_it_restored_by_name(self):
        # The Session path: the graph's VarHandleOp creates the variable by
        # its shared name; the op node has no input from it.
        data, _ = quantization.encode(np.arange(12, dtype=np.float32).reshape(4, 3),
                                      "int8")
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            handle = tf.raw_ops.VarHandleOp(dtype=tf.uint8, shape=data.shape,
                                            shared_name="tfce_session_table")
            session.run(tf.raw_ops.AssignVariableOp(resource=handle, value=data))
            feature = _batched_inputs.Feature(
                table=handle, table_dtype=tf.uint8, ids=np.array([3, 1, 2], np.int64),
                bag_kind="segment_ids", bag_splits=np.array([0, 0, 1], np.int64),
                num_bags=np.int64(2), row_format="int8_rowwise", dim=3,
                combiner="sum")
            named = self.by_name([feature], ["tfce_session_table"])[0]
            self.assertEqual([i.op.type for i in named.op.inputs],
                             ["Const"] * 3)  # ids, bag splits, num_bags
            args = _batched_inputs.layout([feature])
            args.update(num_outputs=1)
            handles = _loader.ops().batched_fused_decode_axpy(**args)[0]
            got, want = session.run([named, handles])
        self.assertAllEqual(got, want)
        decoded = quantization.decode(data, np.zeros(0, np.float32), "int8", 3)
        self.assertAllClose(got, [decoded[3] + decoded[1], decoded[2]])

    def test_weights_gradient_of_named_tables_equals_their_handles(self):
        # The gradient reads the tables again: by a handle of the same name.
        rng = np.random.default_rng(45)
        features, weights = [], []
        for f, fmt in enumerate(("int8", "int4")):
            ct, ids, w = random_feature(rng, fmt, 6 + f, kind="ragged", weighted=True)
            table = _table_inputs(ct)
            weights.append(tf.constant(w.flat_values))
            features.append(_batched_inputs.Feature(
                table=self.named_variable(f"tfce_named_grad_{f}", ct.data.numpy()),
                table_dtype=tf.uint8, ids=ids.flat_values, bag_kind="row_splits",
                bag_splits=ids.row_splits, weights=weights[-1],
                num_bags=ROWS_OF_BAGS, row_format=table["row_format"],
                dim=table["dim"], combiner="sqrtn"))
        grads = {}
        for named in (True, False):
            with tf.GradientTape() as tape:
                tape.watch(weights)
                given = [dataclasses.replace(f, weights=w)
                         for f, w in zip(features, weights)]
                if named:
                    out = self.by_name(given, ["tfce_named_grad_0", "tfce_named_grad_1"])
                else:
                    args = _batched_inputs.layout(given)
                    out = _loader.ops().batched_fused_decode_axpy(num_outputs=2, **args)
                loss = sum(tf.reduce_sum(o * o) for o in out)
            grads[named] = tape.gradient(loss, weights)
        for g, w in zip(grads[True], grads[False]):
            self.assertAllEqual(g, w)
            self.assertGreater(float(tf.reduce_max(tf.abs(g))), 0.0)

    def test_missing_variable_is_named(self):
        feature = handle_feature(
            tf.constant(np.ones((4, 2), np.float16)), tf.float16)
        with self.assertRaisesRegex(tf.errors.NotFoundError,
                                    r"feature 0: no table variable named "
                                    r"'tfce_never_created' \(attr table_names\) in "
                                    r"container '.*' of this device's resource "
                                    r"manager: create or restore it before the call"):
            self.by_name([feature], ["tfce_never_created"])

    def test_missing_variable_among_found_ones_is_named(self):
        self.named_variable("tfce_named_present", np.ones((4, 2), np.float16))
        feature = handle_feature(
            tf.constant(np.ones((4, 2), np.float16)), tf.float16)
        with self.assertRaisesRegex(tf.errors.NotFoundError,
                                    r"feature 1: no table variable named "
                                    r"'tfce_never_created_1'"):
            self.by_name([feature] * 3, ["tfce_named_present", "tfce_never_created_1",
                                         "tfce_named_present"])

    def test_table_names_attr_errors(self):
        self.named_variable("tfce_named_errors", np.ones((4, 2), np.float16))
        feature = handle_feature(
            tf.constant(np.ones((4, 2), np.float16)), tf.float16)
        cases = [
            ({"table_names": [""]}, r"feature 0: attr table_names gives its table "
                                    r"no name"),
            ({"table_dtypes": []}, r"feature 0: a table given as a resource "
                                   r"variable needs its dtype in attr table_dtypes"),
            ({"table_names": ["tfce_named_errors"] * 2},
             r"attr row_formats must have one entry per feature \(N = 2\)"),
            ({"tables": [feature.table]}, r"attr table_names names the tables' "
                                          r"variables, so there must be no table "
                                          r"inputs, but Ttables has 1"),
            ({"table_names": []}, r"the op needs at least one table: table inputs "
                                  r"\(Ttables\) or their variables' names"),
        ]
        for overrides, pattern in cases:
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
                    self.by_name([feature], ["tfce_named_errors"], **overrides)
        # Checked when a graph is built, too (the shape function).
        with tf.Graph().as_default():
            with self.assertRaisesRegex(ValueError, r"attr table_names gives its "
                                                    r"table no name"):
                self.by_name([feature], [""])

def weight_values(weights):
    """The flat tensor of a feature's ragged, sparse or dense weights."""
    if isinstance(weights, tf.RaggedTensor):
        return weights.flat_values
    return weights.values if isinstance(weights, tf.SparseTensor) else weights


def with_weight_values(like, values):
    """Weights of the structure of `like` holding `values` (a tensor the
    tape watches)."""
    if isinstance(like, tf.RaggedTensor):
        return like.with_flat_values(values)
    if isinstance(like, tf.SparseTensor):
        return tf.SparseTensor(like.indices, values, like.dense_shape)
    return values


class BatchedGradientTest(tf.test.TestCase, parameterized.TestCase):
    """The weights' gradient is each feature's FusedDecodeAxpy gradient
    (the per-table op's own gradient is checked against numeric
    differentiation in test_fused_decode_axpy_op.py); tables get none."""

    @parameterized.product(combiner=COMBINERS, concat=(False, True))
    def test_weights_gradient_equals_per_table_ops(self, combiner, concat):
        rng = np.random.default_rng(40)
        features = [random_feature(rng, FORMATS[f % len(FORMATS)], 3 + f,
                                   kind=KINDS[f % 3], weighted=True)
                    for f in range(6)]
        tables, ids, weights = zip(*features)
        tensors = [weight_values(w) for w in weights]
        upstream = [tf.constant(rng.standard_normal((9, ct.dim)), tf.float32)
                    for ct in tables]

        with tf.GradientTape(persistent=True) as tape:
            tape.watch(tensors)
            rebuilt = [with_weight_values(like, w) for w, like in zip(tensors, weights)]
            got = tfce.batched_embedding_lookup_sparse(
                tables, ids, rebuilt, combiners=combiner, concat=concat)
            if concat:
                loss = tf.reduce_sum(got * tf.concat(upstream, axis=1))
            else:  # feature 4's output left out of the loss
                loss = sum(tf.reduce_sum(o * u) for f, (o, u) in
                           enumerate(zip(got, upstream)) if f != 4)
            want = sum(tf.reduce_sum(one_by_one(ct, i, w, combiner) * u)
                       for f, (ct, i, w, u) in enumerate(
                           zip(tables, ids, rebuilt, upstream))
                       if concat or f != 4)
        got_grads = tape.gradient(loss, tensors)
        want_grads = tape.gradient(want, tensors)
        for f, (g, w) in enumerate(zip(got_grads, want_grads)):
            if w is None:  # TF may hand the op zeros for an unused output
                if g is not None:
                    self.assertAllEqual(g, tf.zeros_like(g), msg=f"feature {f}")
                continue
            self.assertAllClose(tf.convert_to_tensor(g), tf.convert_to_tensor(w),
                                atol=1e-5, msg=f"feature {f} ({KINDS[f % 3]})")

    def test_tables_get_no_gradient(self):
        # The fp16 table's variable (float, so the tape can watch it) goes
        # in as its handle; the op gives it no gradient, the weights one.
        rng = np.random.default_rng(41)
        ct, ids, weights = random_feature(rng, "fp16", 4, weighted=True)
        flat = weights.flat_values
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([ct.data, flat])
            out = tfce.batched_embedding_lookup_sparse(
                [ct], [ids], [weights.with_flat_values(flat)])
            loss = tf.reduce_sum(out[0])
        self.assertIsNone(tape.gradient(loss, ct.data))
        self.assertIsNotNone(tape.gradient(loss, flat))

    def test_weighted_among_unweighted_features(self):
        # The gradients land on the weights inputs of the weighted features
        # only, whatever inputs the others have (scales, splits, num_bags).
        rng = np.random.default_rng(44)
        specs = [("int8_split", False, "sparse"), ("fp16", True, "ragged"),
                 ("int8", False, "padded"), ("int4", True, "sparse"),
                 ("int8", True, "padded")]
        features = [random_feature(rng, fmt, 3 + f, kind=kind, weighted=w)
                    for f, (fmt, w, kind) in enumerate(specs)]
        flats = {f: weight_values(w)
                 for f, (_, _, w) in enumerate(features) if w is not None}

        with tf.GradientTape(persistent=True) as tape:
            tape.watch(list(flats.values()))
            weights = [with_weight_values(features[f][2], flats[f]) if f in flats
                       else None for f in range(len(features))]
            got = tfce.batched_embedding_lookup_sparse(
                [ct for ct, _, _ in features], [i for _, i, _ in features],
                weights, combiners="sqrtn")
            loss = sum(tf.reduce_sum(o * (f + 1)) for f, o in enumerate(got))
            want = sum(tf.reduce_sum(one_by_one(ct, i, w, "sqrtn") * (f + 1))
                       for f, ((ct, i, _), w) in enumerate(zip(features, weights)))
        for f, flat in flats.items():
            self.assertAllClose(tape.gradient(loss, flat), tape.gradient(want, flat),
                                atol=1e-5, msg=f"feature {f}")

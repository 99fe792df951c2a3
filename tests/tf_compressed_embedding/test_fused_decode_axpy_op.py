"""FusedDecodeAxpy against the float64 numpy reference, and its bad inputs
(docs/bad_input_matrix.md, 4b). Runs on the ISA row chosen by TFCE_ISA (see
test_isa.py, which re-runs this file on every row the CPU supports).

Error bound: the kernels accumulate a bag of L rows in float32, so each
output element may differ from the exact result by at most
quantization.pooled_error_bound (reference.pool), of the magnitude of the
terms the kernels add (reference.magnitudes: for int4, a row's values and
its bias separately)."""
import collections

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import _loader, quantization

DIMS = list(range(1, 34)) + [64, 100, 128, 129, 257]
FORMATS = quantization.FORMATS
COMBINERS = ("sum", "mean", "sqrtn")
# A stored table as reference.decoded() and magnitudes() read it.
Stored = collections.namedtuple("Stored", ["data", "scales", "format", "dim"])


def raw_pool(table, scales, ids, segment_ids, weights, num_segments,
             combiner="sum", **attrs):
    """The raw op; `attrs`: row_format and dim (reference.op_attrs)."""
    return _loader.ops().fused_decode_axpy(
        table=table, scales=scales, ids=ids, segment_ids=segment_ids,
        weights=weights, num_segments=num_segments, combiner=combiner,
        **attrs)


class PoolValuesTest(tf.test.TestCase, parameterized.TestCase):

    def assert_matches(self, got, ct, ids, segment_ids, weights, combiner,
                       num_segments):
        self.assert_within_bound(got, *reference.pool_table(
            ct, ids, segment_ids, weights, combiner, num_segments))

    def assert_within_bound(self, got, want, bound):
        got = np.asarray(got, np.float64)
        self.assertEqual(got.shape, want.shape)
        excess = np.abs(got - want) - bound
        worst = (np.unravel_index(excess.argmax(), excess.shape)
                 if excess.size else None)
        self.assertLessEqual(excess.max(initial=-1), 0,
                             msg=f"worst error beyond bound at {worst}")

    @parameterized.product(fmt=FORMATS, combiner=COMBINERS,
                           weighted=(False, True),
                           id_dtype=(tf.int32, tf.int64),
                           seg_dtype=(tf.int32, tf.int64))
    def test_every_dim_matches_reference(self, fmt, combiner, weighted,
                                         id_dtype, seg_dtype):
        rng = np.random.default_rng(11)
        for dim in DIMS:
            rows, num_ids, num_segments = 29, 60, 12
            ct = tfce.quantize(reference.random_table(rng, rows, dim), fmt)
            ids = rng.integers(0, rows, size=num_ids)
            ids[:2] = [0, rows - 1]
            segment_ids = reference.random_bags(rng, num_ids, num_segments - 2)
            weights = (rng.uniform(0.5, 1.5, num_ids).astype(np.float32)
                       if weighted else None)
            got = tfce.fused_decode_axpy(
                ct, tf.constant(ids, id_dtype), tf.constant(segment_ids, seg_dtype),
                weights, combiner, num_segments=num_segments)
            self.assert_matches(got, ct, ids, segment_ids, weights, combiner,
                                num_segments)

    @parameterized.product(fmt=FORMATS, combiner=COMBINERS)
    def test_long_bags_duplicates_and_empty_segments(self, fmt, combiner):
        rng = np.random.default_rng(12)
        ct = tfce.quantize(reference.random_table(rng, 100, 12), fmt)
        # Segment 0 empty, 1 long (L = 3000), 2 all one id, 3 empty, 4 short.
        segment_ids = np.repeat([1, 2, 4], [3000, 50, 3])
        ids = rng.integers(0, 100, size=len(segment_ids))
        ids[3000:3050] = 42
        weights = rng.uniform(0.5, 1.5, len(ids)).astype(np.float32)
        for w in (None, weights):
            got = tfce.fused_decode_axpy(ct, ids, segment_ids, w, combiner,
                                         num_segments=6)
            self.assert_matches(got, ct, ids, segment_ids, w, combiner, 6)
            self.assertAllEqual(got.numpy()[[0, 3, 5]], np.zeros((3, 12)))

    @parameterized.product(seg_dtype=(tf.int32, tf.int64), fmt=FORMATS)
    def test_bag_lengths_in_runs_with_changes_and_gaps(self, seg_dtype, fmt):
        # The op turns segment ids into offsets by guessing that a bag is as
        # long as the one before and searching when it is not: runs of equal
        # lengths, changes, empty bags (also first and last) and long gaps.
        rng = np.random.default_rng(13)
        ct = tfce.quantize(reference.random_table(rng, 50, 5), fmt)
        for _ in range(20):
            lengths = np.concatenate([
                np.full(rng.integers(1, 6), rng.choice([0, 1, 2, 3, 7, 40]))
                for _ in range(rng.integers(1, 12))])
            num_segments = len(lengths) + int(rng.integers(0, 3))
            segment_ids = np.repeat(np.arange(len(lengths)), lengths)
            ids = rng.integers(0, 50, size=len(segment_ids))
            got = tfce.fused_decode_axpy(
                ct, ids, tf.constant(segment_ids, seg_dtype), None, "sum",
                num_segments=num_segments)
            self.assert_matches(got, ct, ids, segment_ids, None, "sum",
                                num_segments)

    @parameterized.parameters(*FORMATS)
    def test_weighted_mean_with_zero_weight_sum_gives_zeros(self, fmt):  # F13
        # Rows with a bias (int4: every row's minimum is 3 r) pool to a
        # nonzero sum here: the zero denominator alone makes the zeros.
        ct = tfce.quantize(np.arange(12, dtype=np.float32).reshape(4, 3), fmt)
        got = tfce.fused_decode_axpy(ct, [1, 2, 3], [0, 0, 1],
                                     [1.0, -1.0, 0.0], "mean")
        self.assertAllEqual(got, np.zeros((2, 3)))
        got = tfce.fused_decode_axpy(ct, [3], [0], [0.0], "sqrtn")
        self.assertAllEqual(got, np.zeros((1, 3)))
        # The same bags summed are not zero (but for the zero weight).
        got = tfce.fused_decode_axpy(ct, [1, 2, 3], [0, 0, 1],
                                     [1.0, -1.0, 0.0], "sum")
        self.assert_matches(got, ct, [1, 2, 3], [0, 0, 1], [1.0, -1.0, 0.0],
                            "sum", 2)
        self.assertTrue(np.all(got.numpy()[0] != 0))

    @parameterized.product(fmt=FORMATS, combiner=COMBINERS)
    def test_zero_weights_and_opposite_weights(self, fmt, combiner):  # F13
        # Bags whose weights are all zero, cancel, or leave one row: the
        # denominators 0, 0 and 1 (sum), and a bias counted once per
        # weighted row, never once per bag.
        rng = np.random.default_rng(15)
        ct = tfce.quantize(reference.random_table(rng, 9, 21) + 3, fmt)
        ids = [4, 4, 2, 7, 7, 1, 5, 5, 5]
        segment_ids = [0, 0, 1, 1, 1, 2, 3, 3, 3]
        weights = np.array([0, 0, 1, -1, 0, 2.5, 1, 1, -1], np.float32)
        got = tfce.fused_decode_axpy(ct, ids, segment_ids, weights, combiner,
                                     num_segments=5)
        self.assert_matches(got, ct, ids, segment_ids, weights, combiner, 5)
        zero_denominator = {"sum": [0, 4], "mean": [0, 1, 4],
                            "sqrtn": [0, 4]}[combiner]
        self.assertAllEqual(got.numpy()[zero_denominator],
                            np.zeros((len(zero_denominator), 21)))

    @parameterized.product(fmt=FORMATS, combiner=COMBINERS)
    def test_offset_rows_and_rows_whose_bias_cancels(self, fmt, combiner):
        # int4's bias dominates: rows offset far from 0, and rows of small
        # values whose range (-40 .. 40) makes q scale and the bias cancel.
        # The pooled error scales with |q scale| + |bias|, not |value|.
        rng = np.random.default_rng(17)
        offset = reference.random_table(rng, 40, 19) + 1000
        cancel = rng.uniform(-1, 1, (40, 19)).astype(np.float32)
        cancel[:, 0], cancel[:, 7] = -40, 40
        for table in (offset, cancel):
            ct = tfce.quantize(table, fmt)
            ids = rng.integers(0, 40, size=300)
            segment_ids = reference.random_bags(rng, 300, 9)
            weights = rng.uniform(-1.5, 1.5, 300).astype(np.float32)
            got = tfce.fused_decode_axpy(ct, ids, segment_ids, weights,
                                         combiner, num_segments=9)
            self.assert_matches(got, ct, ids, segment_ids, weights, combiner,
                                9)

    def test_default_num_segments_is_last_segment_plus_one(self):
        ct = tfce.quantize(np.ones((4, 3), np.float32), "int8")
        self.assertEqual(tfce.fused_decode_axpy(ct, [1, 2], [0, 4]).shape, (5, 3))
        self.assertEqual(tfce.fused_decode_axpy(
            ct, tf.zeros([0], tf.int64), tf.zeros([0], tf.int64)).shape, (0, 3))

    @parameterized.parameters(*FORMATS)
    def test_no_segments(self, fmt):  # F15
        ct = tfce.quantize(np.ones((4, 3), np.float32), fmt)
        out = raw_pool(ct.data, ct.scales, tf.zeros([0], tf.int64),
                       tf.zeros([0], tf.int64), tf.zeros([0]), 0,
                       **reference.op_attrs(fmt, 3))
        self.assertEqual(out.shape, (0, 3))

    @parameterized.parameters(*FORMATS)
    def test_sliced_unaligned_inputs(self, fmt):  # L14
        rng = np.random.default_rng(16)
        data, scales = quantization.encode(reference.random_table(rng, 40, 13),
                                           fmt)
        attrs = reference.op_attrs(fmt, 13)
        ids = rng.integers(0, 39, size=30)
        segment_ids = reference.random_bags(rng, 27, 6)
        weights = rng.uniform(0.5, 1.5, 30).astype(np.float32)

        @tf.function
        def pool(data, scales, ids, segment_ids, weights):
            # Slices that start mid-buffer (every row of every format).
            return raw_pool(data[1:], scales[1:], ids[3:], segment_ids,
                            weights[3:], 6, "mean", **attrs)

        got = pool(data, scales, ids, segment_ids, weights)
        sliced = Stored(data[1:], scales[1:], fmt, 13)
        self.assert_within_bound(got, *reference.pool_table(
            sliced, ids[3:], segment_ids, weights[3:], "mean", 6))

    @parameterized.parameters(*FORMATS)
    def test_graph_mode_matches_eager(self, fmt):
        rng = np.random.default_rng(13)
        ct = tfce.quantize(reference.random_table(rng, 50, 16), fmt)
        ids = rng.integers(0, 50, size=40)
        segment_ids = reference.random_bags(rng, 40, 10)
        weights = rng.uniform(0.5, 1.5, 40).astype(np.float32)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 2 +
                     [tf.TensorSpec([None], tf.float32)])
        def pool(ids, segment_ids, weights):
            out = tfce.fused_decode_axpy(ct, ids, segment_ids, weights,
                                         "sqrtn", num_segments=10)
            self.assertEqual(out.shape.as_list(), [10, 16])
            return out

        self.assertAllEqual(pool(ids, segment_ids, weights),
                            tfce.fused_decode_axpy(ct, ids, segment_ids, weights,
                                                   "sqrtn", num_segments=10))

    @parameterized.parameters(*FORMATS)
    def test_many_segments_split_over_threads_match_one_thread(self, fmt):
        rng = np.random.default_rng(14)
        ct = tfce.quantize(reference.random_table(rng, 5000, 32), fmt)
        ids = rng.integers(0, 5000, size=100_000)
        segment_ids = reference.random_bags(rng, 100_000, 4096)
        got = tfce.fused_decode_axpy(ct, ids, segment_ids, None, "mean",
                                     num_segments=4096)
        self.assert_matches(got, ct, ids, segment_ids, None, "mean", 4096)
        # Bags are never split between threads: repeated runs are identical.
        again = tfce.fused_decode_axpy(ct, ids, segment_ids, None, "mean",
                                       num_segments=4096)
        self.assertAllEqual(got, again)

    @parameterized.parameters(*FORMATS)
    def test_nan_and_inf_weights_propagate(self, fmt):  # F18
        ct = tfce.quantize(np.ones((4, 2), np.float32), fmt)
        got = tfce.fused_decode_axpy(ct, [0, 1, 2], [0, 1, 2],
                                     [np.nan, np.inf, 1.0]).numpy()
        self.assertTrue(np.isnan(got[0]).all())
        if fmt == "int4":
            # A constant row is scale 0, bias 1: the kernels add
            # (w scale) q = (Inf 0) 0 = NaN and w bias = Inf (kernel_api.h),
            # where w x = Inf: non-finite, not +Inf.
            self.assertTrue(np.isnan(got[1]).all())
        else:
            self.assertTrue(np.isposinf(got[1]).all())
        self.assertAllEqual(got[2], [1, 1])


class PoolBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """Every row of the bad-input matrix 4b (docs/bad_input_matrix.md),
    eagerly and in a graph."""

    def setUp(self):
        super().setUp()
        # The split layout: the table is the one the rows below are about.
        self.data, self.scales = tfce.quantization.encode(
            np.ones((10, 4), np.float32), "int8_split")

    def assert_invalid(self, pattern, ids, segment_ids, weights, num_segments,
                       table=None, scales=None, **attrs):
        table = self.data if table is None else table
        scales = self.scales if scales is None else scales
        args = [tf.constant(a) for a in (table, scales, ids, segment_ids,
                                         weights, num_segments)]
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_pool(*args, **attrs)

        @tf.function(input_signature=[tf.TensorSpec(None, a.dtype) for a in args])
        def graph(*a):
            return raw_pool(*a, **attrs)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            graph(*args)

    def ids(self, *values):
        return np.array(values, np.int64)

    @parameterized.product(dtype=(np.int32, np.int64), fmt=FORMATS)
    def test_id_out_of_range_names_position_and_segment(self, dtype, fmt):  # F11
        data, scales = quantization.encode(np.ones((10, 4), np.float32), fmt)
        attrs = dict(table=data, scales=scales, **reference.op_attrs(fmt, 4))
        self.assert_invalid(r"ids\[2\] = 10 \(in segment 1\) is not in \[0, 10\)",
                            np.array([1, 2, 10], dtype), self.ids(0, 1, 1),
                            np.zeros([0], np.float32), np.int64(2), **attrs)
        self.assert_invalid(r"ids\[0\] = -3 \(in segment 0\) is not in \[0, 10\)",
                            np.array([-3], dtype), self.ids(0),
                            np.zeros([0], np.float32), np.int64(1), **attrs)

    def test_ids_and_segment_ids_not_vectors(self):  # F3
        self.assert_invalid(r"ids must be a vector", np.zeros((2, 1), np.int64),
                            self.ids(0, 0), np.zeros([0], np.float32), np.int64(1))
        self.assert_invalid(r"segment_ids must be a vector", self.ids(0, 0),
                            np.zeros((2, 1), np.int64),
                            np.zeros([0], np.float32), np.int64(1))

    def test_segment_ids_not_sorted(self):  # F4
        self.assert_invalid(
            r"segment_ids are not sorted: segment_ids\[1\] = 2 > segment_ids\[2\] = 1",
            self.ids(0, 1, 2), self.ids(0, 2, 1), np.zeros([0], np.float32),
            np.int64(3))

    @parameterized.parameters((np.int32,), (np.int64,))
    def test_segment_ids_negative(self, dtype):  # F5
        self.assert_invalid(r"segment_ids\[0\] = -1 is not in \[0, 3\)",
                            self.ids(0, 1), np.array([-1, 0], dtype),
                            np.zeros([0], np.float32), np.int64(3))

    def test_num_segments_not_scalar(self):  # F6
        for bad in (np.array([2], np.int64), np.zeros([0], np.int32)):
            self.assert_invalid(r"num_segments must be a scalar, not shape",
                                self.ids(0), self.ids(0),
                                np.zeros([0], np.float32), bad)

    @parameterized.parameters((np.int32(-1),), (np.int64(-5),),
                              (np.int64(np.iinfo(np.int64).min),))
    def test_num_segments_negative(self, bad):  # F7
        self.assert_invalid(rf"num_segments = {bad} must be >= 0",
                            self.ids(0), self.ids(0),
                            np.zeros([0], np.float32), bad)

    def test_num_segments_huge(self):  # F7, L11
        # [2^62, 4] floats overflows int64 bytes: an argument error.
        with self.assertRaises((tf.errors.InvalidArgumentError,
                                tf.errors.ResourceExhaustedError)):
            raw_pool(self.data, self.scales, self.ids(0), self.ids(0),
                     np.zeros([0], np.float32), np.int64(2**62))
        # [2^40, 4] floats is 16 TiB: the allocation fails cleanly.
        with self.assertRaises((tf.errors.InvalidArgumentError,
                                tf.errors.ResourceExhaustedError)):
            raw_pool(self.data, self.scales, self.ids(0), self.ids(0),
                     np.zeros([0], np.float32), np.int64(2**40))
        # A huge count with D = 0 allocates nothing and still validates.
        out = raw_pool(np.zeros((10, 0), np.int8), self.scales, self.ids(0),
                       self.ids(0), np.zeros([0], np.float32),
                       np.int64(np.iinfo(np.int64).max))
        self.assertEqual(out.shape, (np.iinfo(np.int64).max, 0))

    def test_segment_id_beyond_num_segments(self):  # F8
        self.assert_invalid(r"segment_ids\[1\] = 3 is not in \[0, 3\)",
                            self.ids(0, 1), self.ids(0, 3),
                            np.zeros([0], np.float32), np.int64(3))

    def test_segment_ids_size_differs_from_ids(self):  # F9
        self.assert_invalid(r"segment_ids must have the same size as ids: ids "
                            r"has 2 elements, segment_ids has 3",
                            self.ids(0, 1), self.ids(0, 0, 1),
                            np.zeros([0], np.float32), np.int64(2))

    def test_weights_shape(self):  # F10
        for bad in (np.ones([3], np.float32), np.ones([1], np.float32),
                    np.ones([2, 1], np.float32)):
            self.assert_invalid(r"weights must have shape \[2\] \(one per id\) "
                                r"or \[0\] \(unweighted\)",
                                self.ids(0, 1), self.ids(0, 0), bad, np.int64(1))

    def test_table_and_scales_checks_apply(self):  # L4, L5, L8
        self.assert_invalid(r"table must be a matrix", self.ids(0), self.ids(0),
                            np.zeros([0], np.float32), np.int64(1),
                            table=np.ones((10,), np.int8))
        self.assert_invalid(r"expected shape \[10\] for an int8 table",
                            self.ids(0), self.ids(0), np.zeros([0], np.float32),
                            np.int64(1), scales=np.ones((9,), np.float32))
        self.assert_invalid(r"scales must be empty \(shape \[0\]\) for float16",
                            self.ids(0), self.ids(0), np.zeros([0], np.float32),
                            np.int64(1), table=np.ones((10, 4), np.float16))
        self.assert_invalid(r"ids\[0\] = 0 \(in segment 0\) is not in \[0, 0\)",
                            self.ids(0), self.ids(0), np.zeros([0], np.float32),
                            np.int64(1), table=np.ones((0, 4), np.int8),
                            scales=np.ones((0,), np.float32))

    @parameterized.parameters(*FORMATS)
    def test_bad_id_is_an_error_even_with_zero_dim(self, fmt):  # L7
        data, scales = quantization.encode(np.ones((10, 0), np.float32), fmt)
        self.assert_invalid(r"ids\[1\] = 10 \(in segment 0\) is not in \[0, 10\)",
                            self.ids(0, 10), self.ids(0, 0),
                            np.zeros([0], np.float32), np.int64(1),
                            table=data, scales=scales,
                            **reference.op_attrs(fmt, 0))

    def test_unknown_combiner(self):  # F14
        with self.assertRaisesRegex(ValueError, "combiner must be one of"):
            tfce.fused_decode_axpy(tfce.quantize(np.ones((2, 2)), "int8"),
                                   [0], [0], combiner="max")
        with self.assertRaisesRegex((tf.errors.InvalidArgumentError, ValueError),
                                    "combiner"):
            raw_pool(self.data, self.scales, self.ids(0), self.ids(0),
                     np.zeros([0], np.float32), np.int64(1), combiner="max")

    def test_shape_function_rejects_static_rank_errors(self):
        @tf.function
        def f():
            return raw_pool(self.data, self.scales, tf.zeros([2, 2], tf.int64),
                            tf.zeros([4], tf.int64), tf.zeros([0]), 1)

        with self.assertRaisesRegex(ValueError, "must be rank 1"):
            f.get_concrete_function()

        @tf.function
        def g():
            return raw_pool(self.data, self.scales, tf.zeros([3], tf.int64),
                            tf.zeros([4], tf.int64), tf.zeros([0]), 1)

        with self.assertRaisesRegex(ValueError, "Dimension 0 in both shapes must be equal"):
            g.get_concrete_function()


class PoolTableFormatBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """The table format attrs of FusedDecodeAxpy (row_format, dim) against
    the table's dtype and shape: rows L18-L23 of docs/bad_input_matrix.md,
    which test_lookup_op.py's TableFormatBadInputTest runs for the lookup.
    Wrong attrs for the dtype: the kernel refuses them eagerly, the shape
    function when a graph is built; a table that does not fit them: the
    kernel, eagerly and in graphs."""

    def pool_inputs(self, table, scales):
        return [table, scales, np.array([0, 1], np.int64),
                np.array([0, 1], np.int64), np.ones([2], np.float32),
                np.int64(2)]

    def assert_refused_when_built(self, pattern, table, scales, **attrs):
        args = self.pool_inputs(table, scales)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_pool(*args, "mean", **attrs)

        @tf.function(input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(a).dtype)) for a in args])
        def graph(*a):
            return raw_pool(*a, "mean", **attrs)

        with self.assertRaisesRegex(ValueError, pattern):
            graph.get_concrete_function()

    def assert_invalid_at_run_time(self, pattern, table, scales, **attrs):
        args = self.pool_inputs(table, scales)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_pool(*args, "mean", **attrs)

        @tf.function(input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(a).dtype)) for a in args])
        def unknown_shapes(*a):
            return raw_pool(*a, "mean", **attrs)

        @tf.function
        def static_shapes():
            return raw_pool(*[tf.constant(a) for a in args], "mean", **attrs)

        for graph in (lambda: unknown_shapes(*args), static_shapes):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
                graph()

    def table(self, fmt, dim=13):
        rng = np.random.default_rng(19)
        return quantization.encode(reference.random_table(rng, 10, dim), fmt)

    @parameterized.product(fmt=quantization.ROWWISE_FORMATS,
                           row_format=(None, "plain"))
    def test_uint8_table_with_plain_row_format(self, fmt, row_format):  # L18
        attrs = {} if row_format is None else {"row_format": row_format}
        self.assert_refused_when_built(
            r"a table of row_format 'plain' must be int8 or float16, got "
            r"uint8; uint8 tables hold rowwise records: set row_format "
            r"'int8_rowwise' or 'int4_rowwise'", *self.table(fmt), **attrs)

    @parameterized.product(fmt=("int8_split", "fp16"),
                           row_format=("int8_rowwise", "int4_rowwise"))
    def test_int8_or_half_table_with_rowwise_row_format(self, fmt,
                                                        row_format):  # L19
        data, _ = self.table(fmt)
        dtype_name = {"int8_split": "int8", "fp16": "half"}[fmt]  # TF's names
        self.assert_refused_when_built(
            rf"a table of row_format '{row_format}' must be uint8 \(its rows "
            rf"are byte records\), got {dtype_name}",
            data, np.zeros([0], np.float32), row_format=row_format, dim=13)

    @parameterized.product(fmt=quantization.ROWWISE_FORMATS, dim=(None, -7))
    def test_rowwise_dim_negative(self, fmt, dim):  # L20
        row_format = quantization.op_row_format(fmt)
        attrs = {"row_format": row_format}
        if dim is not None:
            attrs["dim"] = dim
        self.assert_refused_when_built(
            rf"attr dim must be in \[0, 1099511627776\] for row_format "
            rf"'{row_format}' \(its records do not give it\), got "
            rf"{-1 if dim is None else dim}",
            *self.table(fmt), **attrs)

    @parameterized.product(fmt=("int8_split", "fp16"), dim=(0, 13))
    def test_plain_dim_not_minus_one(self, fmt, dim):  # L20
        self.assert_refused_when_built(
            rf"attr dim must be -1 \(the table's second dimension gives it\) "
            rf"for row_format 'plain', got {dim}", *self.table(fmt), dim=dim)

    @parameterized.parameters(*quantization.ROWWISE_FORMATS)
    def test_table_width_not_record_bytes(self, fmt):  # L21
        row_format = quantization.op_row_format(fmt)
        data13, scales = self.table(fmt)
        other = "int4" if fmt == "int8" else "int8"
        for data, dim in [(data13, 12 if fmt == "int8" else 11), (data13, 40),
                          (self.table(other)[0], 13),
                          (np.ascontiguousarray(data13[:, 4:]), 13)]:
            want = quantization.record_bytes(fmt, dim)
            self.assertNotEqual(data.shape[1], want)
            self.assert_invalid_at_run_time(
                rf"table must have shape \[rows, {want}\] for {row_format} "
                rf"rows of dim {dim} \(4 header bytes, then the values\), but "
                rf"has shape \[10,{data.shape[1]}\]",
                data, scales, row_format=row_format, dim=dim)

    @parameterized.parameters(*quantization.ROWWISE_FORMATS)
    def test_rowwise_scales_not_empty(self, fmt):  # L22
        row_format = quantization.op_row_format(fmt)
        data, _ = self.table(fmt)
        for rows in (10, 1):
            self.assert_invalid_at_run_time(
                rf"scales must be empty \(shape \[0\]\) for {row_format} "
                rf"tables, but got shape \[{rows}\]", data,
                np.ones([rows], np.float32), **reference.op_attrs(fmt, 13))

    def test_unknown_row_format(self):  # L23
        data, scales = self.table("int4")
        args = self.pool_inputs(data, scales)
        pattern = (r"(attr|Attr) 'row_format' .*\Wint4\W.* \"plain\", "
                   r"\"int8_rowwise\", \"int4_rowwise\"")
        with self.assertRaisesRegex(
                (tf.errors.InvalidArgumentError, ValueError, TypeError), pattern):
            raw_pool(*args, row_format="int4", dim=13)

        @tf.function
        def graph():
            return raw_pool(*args, row_format="int4", dim=13)

        with self.assertRaisesRegex((ValueError, TypeError), pattern):
            graph.get_concrete_function()


if __name__ == "__main__":
    tf.test.main()

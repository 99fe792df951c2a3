"""CompressedEmbeddingLookup against the numpy reference, and its bad inputs
(docs/bad_input_matrix.md, 4a). Runs on the ISA row chosen by TFCE_ISA (see
test_isa.py, which re-runs this file on every row the CPU supports)."""
import collections

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import _loader

DIMS = list(range(1, 34)) + [64, 100, 128, 257]
Table = collections.namedtuple("Table", ["data", "scales"])
FORMATS = ("int8", "fp16")
ID_DTYPES = (tf.int32, tf.int64)


def raw_lookup(table, scales, ids):
    return _loader.ops().compressed_embedding_lookup(
        table=table, scales=scales, ids=ids)


class LookupValuesTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.product(fmt=FORMATS, id_dtype=ID_DTYPES)
    def test_every_dim_matches_reference(self, fmt, id_dtype):
        rng = np.random.default_rng(7)
        for dim in DIMS:
            rows = 37
            ct = tfce.quantize(reference.random_table(rng, rows, dim), fmt)
            # Always include the first and last rows, and duplicates.
            ids = np.concatenate([[0, rows - 1, 5, 5],
                                  rng.integers(0, rows, size=41)])
            got = tfce.compressed_embedding_lookup(
                ct, tf.constant(ids, id_dtype))
            want = reference.lookup(reference.decoded(ct), ids)
            # One float32 multiply (int8) or an exact conversion (fp16):
            # bit-identical to the float32 reference.
            self.assertAllEqual(got, want.astype(np.float32),
                                msg=f"dim={dim}")

    @parameterized.parameters(*FORMATS)
    def test_ids_of_any_shape(self, fmt):
        rng = np.random.default_rng(1)
        ct = tfce.quantize(reference.random_table(rng, 20, 6), fmt)
        table = reference.decoded(ct)
        for shape in [(), (3,), (2, 5), (2, 3, 4)]:
            ids = rng.integers(0, 20, size=shape)
            got = tfce.compressed_embedding_lookup(ct, ids)
            self.assertEqual(got.shape, shape + (6,))
            self.assertAllEqual(got, reference.lookup(table, ids).astype(np.float32))

    @parameterized.parameters(*FORMATS)
    def test_any_object_with_data_and_scales_is_a_table(self, fmt):
        # Numpy arrays, tensors and variables of a CompressedTable's layout:
        # the wrappers pass an fp16 table's empty scales as a constant and
        # must not depend on what kind of object carries them.
        rng = np.random.default_rng(3)
        ct = tfce.quantize(reference.random_table(rng, 30, 12), fmt)
        ids = rng.integers(0, 30, size=17)
        seg = np.sort(rng.integers(0, 5, size=17))
        want_lookup = reference.lookup(reference.decoded(ct), ids)
        want_pool, bound = reference.pool(reference.decoded(ct), ids, seg,
                                          None, "sum", 5)
        data, scales = ct.data.numpy(), ct.scales.numpy()
        for table in [Table(data, scales),
                      Table(tf.constant(data), tf.constant(scales)),
                      Table(tf.Variable(data), tf.Variable(scales))]:
            self.assertAllEqual(tfce.compressed_embedding_lookup(table, ids),
                                want_lookup.astype(np.float32))
            got = tfce.fused_decode_axpy(table, ids, seg, num_segments=5)
            self.assertTrue(np.all(np.abs(got.numpy() - want_pool) <= bound))

    def test_graph_mode_matches_eager(self):
        rng = np.random.default_rng(2)
        ct = tfce.quantize(reference.random_table(rng, 50, 12), "int8")
        ids = rng.integers(0, 50, size=(8, 3))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def lookup(ids):
            return tfce.compressed_embedding_lookup(ct, ids)

        self.assertAllEqual(lookup(ids), tfce.compressed_embedding_lookup(ct, ids))
        self.assertAllEqual(lookup(ids),
                            reference.lookup(reference.decoded(ct), ids).astype(np.float32))

    def test_static_shape_inference(self):
        ct = tfce.quantize(np.ones((10, 7), np.float32), "int8")

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32)])
        def lookup(ids):
            out = tfce.compressed_embedding_lookup(ct, ids)
            self.assertEqual(out.shape.as_list(), [None, 3, 7])
            return out

        lookup.get_concrete_function()

        @tf.function(input_signature=[tf.TensorSpec(None, tf.int32)])
        def unknown_rank(ids):
            out = tfce.compressed_embedding_lookup(ct, ids)
            self.assertIsNone(out.shape.rank)
            return out

        unknown_rank.get_concrete_function()

    def test_sliced_unaligned_inputs(self):
        rng = np.random.default_rng(3)
        table = reference.random_table(rng, 40, 13)
        data, scales = tfce.quantization.encode(table, "int8")

        @tf.function
        def lookup(data, scales, ids):
            # Slices that start mid-buffer: row 1 starts at byte 13.
            return raw_lookup(data[1:], scales[1:], ids[3:])

        ids = rng.integers(0, 39, size=20)
        got = lookup(tf.constant(data), tf.constant(scales), tf.constant(ids))
        want = reference.lookup(
            tfce.quantization.decode(data[1:], scales[1:], "int8"), ids[3:])
        self.assertAllEqual(got, want)

    def test_large_batch_uses_threads_and_matches(self):
        # Large enough for the intra-op pool to split the work.
        rng = np.random.default_rng(4)
        ct = tfce.quantize(reference.random_table(rng, 1000, 64), "fp16")
        ids = rng.integers(0, 1000, size=200_000)
        got = tfce.compressed_embedding_lookup(ct, ids)
        self.assertAllEqual(got, reference.lookup(reference.decoded(ct), ids).astype(np.float32))

    def test_nan_inf_zero_negative_scales_are_used_as_given(self):  # L9
        data = np.ones((4, 3), np.int8)
        scales = np.array([np.nan, np.inf, 0.0, -2.0], np.float32)
        got = raw_lookup(data, scales, [0, 1, 2, 3]).numpy()
        self.assertTrue(np.isnan(got[0]).all())
        self.assertTrue(np.isposinf(got[1]).all())
        self.assertAllEqual(got[2:], [[0, 0, 0], [-2, -2, -2]])


class LookupBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """Every row of the bad-input matrix 4a (docs/bad_input_matrix.md),
    eagerly and in a graph."""

    def assert_invalid(self, pattern, table, scales, ids):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_lookup(table, scales, ids)

        # A graph with unknown static shapes reaches the kernel's checks.
        @tf.function(input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(table).dtype)),
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.as_dtype(np.asarray(ids).dtype))])
        def graph(table, scales, ids):
            return raw_lookup(table, scales, ids)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            graph(table, scales, ids)

    @parameterized.product(id_dtype=(np.int32, np.int64),
                           fmt=FORMATS)
    def test_id_equal_to_rows(self, id_dtype, fmt):  # L1
        data, scales = tfce.quantization.encode(np.ones((10, 4)), fmt)
        self.assert_invalid(r"ids\[2\] = 10 is not in \[0, 10\)",
                            data, scales, np.array([0, 9, 10, 3], id_dtype))

    @parameterized.parameters(
        (np.int32, -1), (np.int32, np.iinfo(np.int32).min),
        (np.int64, -1), (np.int64, np.iinfo(np.int64).min),
        (np.int64, np.iinfo(np.int32).max + 1),  # L3: beyond 32 bits
        (np.int64, np.iinfo(np.int64).max))
    def test_negative_and_huge_ids(self, id_dtype, bad):  # L2, L3
        data, scales = tfce.quantization.encode(np.ones((10, 4)), "int8")
        self.assert_invalid(rf"ids\[1,0\] = {bad} is not in \[0, 10\)",
                            data, scales, np.array([[1], [bad]], id_dtype))

    def test_table_not_a_matrix(self):  # L4
        for table in [np.int8(1), np.ones((5,), np.int8),
                      np.ones((2, 3, 4), np.int8)]:
            self.assert_invalid(r"table must be a matrix \[rows, dim\]",
                                table, np.ones((2,), np.float32),
                                np.array([0], np.int64))

    def test_table_rank_rejected_by_shape_function(self):  # L4, L16
        @tf.function
        def f():
            return raw_lookup(tf.ones([5], tf.int8), tf.ones([5]),
                              tf.constant([0]))

        with self.assertRaisesRegex(ValueError, "must be rank 2"):
            f.get_concrete_function()

    def test_empty_table_with_ids(self):  # L5
        self.assert_invalid(r"ids\[0\] = 0 is not in \[0, 0\)",
                            np.zeros((0, 4), np.int8), np.zeros((0,), np.float32),
                            np.array([0], np.int64))

    def test_empty_ids_give_empty_output(self):  # L6
        for rows in (0, 5):
            data = np.zeros((rows, 4), np.int8)
            scales = np.zeros((rows,), np.float32)
            for shape in [(0,), (2, 0), (0, 3)]:
                out = raw_lookup(data, scales, np.zeros(shape, np.int64))
                self.assertEqual(out.shape, shape + (4,))

    def test_zero_dim(self):  # L7
        data = np.zeros((5, 0), np.int8)
        scales = np.zeros((5,), np.float32)
        out = raw_lookup(data, scales, np.array([[0, 4]], np.int64))
        self.assertEqual(out.shape, (1, 2, 0))
        # A bad id is an error even when there is nothing to decode.
        self.assert_invalid(r"ids\[1\] = 5 is not in \[0, 5\)",
                            data, scales, np.array([0, 5], np.int64))

    @parameterized.parameters(
        ((9,), r"expected shape \[10\] for an int8 table"),
        ((11,), r"expected shape \[10\] for an int8 table"),
        ((10, 1), r"scales must be a vector"),
        ((), r"scales must be a vector"))
    def test_int8_scales_wrong_shape(self, shape, pattern):  # L8
        self.assert_invalid(pattern, np.ones((10, 4), np.int8),
                            np.ones(shape, np.float32), np.array([0], np.int64))

    def test_fp16_scales_not_empty(self):  # L8
        self.assert_invalid(r"scales must be empty \(shape \[0\]\) for a float16 table",
                            np.ones((10, 4), np.float16),
                            np.ones((10,), np.float32), np.array([0], np.int64))

    def test_wrong_dtypes_rejected_at_construction(self):  # L10
        ok_scales = np.ones((4,), np.float32)
        for table, scales, ids in [
                (np.ones((4, 2), np.float32), ok_scales, [0]),
                (np.ones((4, 2), np.int8), ok_scales, np.array([0.0])),
                (np.ones((4, 2), np.int8), ok_scales.astype(np.float64), [0])]:
            table, scales, ids = map(tf.constant, (table, scales, ids))
            with self.assertRaisesRegex(
                    (TypeError, tf.errors.InvalidArgumentError),
                    "not in the list of allowed values|expected to be a float"):
                raw_lookup(table, scales, ids)


if __name__ == "__main__":
    tf.test.main()

"""CompressedEmbeddingLookup against the numpy reference, and its bad inputs
(docs/bad_input_matrix.md, 4a). Runs on the ISA row chosen by TFCE_ISA (see
test_isa.py, which re-runs this file on every row the CPU supports)."""
import collections
import struct

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import _loader, quantization

DIMS = list(range(1, 34)) + [64, 100, 128, 129, 257]
# Any object with these attributes is a table (the wrappers read no more).
Table = collections.namedtuple("Table", ["data", "scales"])
RowwiseTable = collections.namedtuple("RowwiseTable",
                                      ["data", "scales", "format", "dim"])
FORMATS = quantization.FORMATS
ID_DTYPES = (tf.int32, tf.int64)


def raw_lookup(table, scales, ids, **attrs):
    """The raw op; `attrs`: row_format and dim (reference.op_attrs)."""
    return _loader.ops().compressed_embedding_lookup(
        table=table, scales=scales, ids=ids, **attrs)


def table_object(ct, data, scales):
    """An object of `ct`'s format holding `data` and `scales`: rowwise
    tables must also say their format and dim."""
    if ct.format in quantization.ROWWISE_FORMATS:
        return RowwiseTable(data, scales, ct.format, ct.dim)
    return Table(data, scales)


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
            # One float32 multiply (int8 in both layouts), a multiply then
            # an add (int4), or an exact conversion (fp16), as the numpy
            # decoder does: bit-identical to the float32 reference.
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
        want_pool, bound = reference.pool_table(ct, ids, seg, None, "sum", 5)
        data, scales = ct.data.numpy(), ct.scales.numpy()
        for table in [table_object(ct, data, scales),
                      table_object(ct, tf.constant(data), tf.constant(scales)),
                      table_object(ct, tf.Variable(data), tf.Variable(scales))]:
            self.assertAllEqual(tfce.compressed_embedding_lookup(table, ids),
                                want_lookup.astype(np.float32))
            got = tfce.fused_decode_axpy(table, ids, seg, num_segments=5)
            self.assertTrue(np.all(np.abs(got.numpy() - want_pool) <= bound))

    def test_uint8_records_without_a_format_are_refused(self):
        ct = tfce.quantize(np.ones((4, 3), np.float32), "int8")
        with self.assertRaisesRegex(TypeError, r"a table of uint8 records "
                                    r"must say its format and dim"):
            tfce.compressed_embedding_lookup(Table(ct.data, ct.scales), [0])

    @parameterized.parameters(*FORMATS)
    def test_graph_mode_matches_eager(self, fmt):
        rng = np.random.default_rng(2)
        ct = tfce.quantize(reference.random_table(rng, 50, 13), fmt)
        ids = rng.integers(0, 50, size=(8, 3))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def lookup(ids):
            return tfce.compressed_embedding_lookup(ct, ids)

        self.assertAllEqual(lookup(ids), tfce.compressed_embedding_lookup(ct, ids))
        self.assertAllEqual(lookup(ids),
                            reference.lookup(reference.decoded(ct), ids).astype(np.float32))

    @parameterized.parameters(*FORMATS)
    def test_static_shape_inference(self, fmt):
        # D, never the record width (int4: 8 bytes; int8: 11).
        ct = tfce.quantize(np.ones((10, 7), np.float32), fmt)

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

    @parameterized.parameters(*FORMATS)
    def test_sliced_unaligned_inputs(self, fmt):
        rng = np.random.default_rng(3)
        table = reference.random_table(rng, 40, 13)
        data, scales = tfce.quantization.encode(table, fmt)
        attrs = reference.op_attrs(fmt, 13)

        @tf.function
        def lookup(data, scales, ids):
            # Slices that start mid-buffer: row 1 starts at byte 13 (int8
            # split), 26 (fp16), 17 (int8 records) or 11 (int4 records).
            return raw_lookup(data[1:], scales[1:], ids[3:], **attrs)

        ids = rng.integers(0, 39, size=20)
        got = lookup(tf.constant(data), tf.constant(scales), tf.constant(ids))
        want = reference.lookup(
            tfce.quantization.decode(data[1:], scales[1:], fmt, 13), ids[3:])
        self.assertAllEqual(got, want)

    @parameterized.parameters(*FORMATS)
    def test_large_batch_uses_threads_and_matches(self, fmt):
        # Large enough for the intra-op pool to split the work.
        rng = np.random.default_rng(4)
        ct = tfce.quantize(reference.random_table(rng, 1000, 64), fmt)
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

    def test_rowwise_nan_inf_zero_negative_scales_are_used_as_given(self):  # L9
        # int8 records: [float32 scale][int8 values]; decoded q * scale.
        scales = [np.nan, np.inf, 0.0, -2.0]
        data = np.array([list(struct.pack("<f", s)) + [1, 0, 255]
                         for s in scales], np.uint8)  # q = 1, 0, -1
        got = raw_lookup(data, np.zeros([0], np.float32), [0, 1, 2, 3],
                         **reference.op_attrs("int8", 3)).numpy()
        self.assertTrue(np.isnan(got[0]).all())
        np.testing.assert_array_equal(got[1], [np.inf, np.nan, -np.inf])
        np.testing.assert_array_equal(got[2:], [[0, 0, -0.0], [-2, -0.0, 2]])
        # int4 records: [f16 scale][f16 bias][nibbles]; q * scale + bias.
        q = (1, 0, 15)
        rows = [(np.nan, 1.0), (np.inf, 1.0), (1.0, -np.inf), (0.0, 2.5),
                (-2.0, 0.5), (65504.0, 65504.0)]
        data = np.array([list(struct.pack("<ee", s, b))
                         + [q[0] | q[1] << 4, q[2]] for s, b in rows], np.uint8)
        got = raw_lookup(data, np.zeros([0], np.float32), np.arange(6),
                         **reference.op_attrs("int4", 3)).numpy()
        want = [[np.nan] * 3, [np.inf, np.nan, np.inf], [-np.inf] * 3,
                [2.5] * 3, [-1.5, 0.5, -29.5],
                [2 * 65504.0, 65504.0, 16 * 65504.0]]  # beyond float16: fine
        np.testing.assert_array_equal(got, np.array(want, np.float32))


class LookupBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """Every row of the bad-input matrix 4a (docs/bad_input_matrix.md),
    eagerly and in a graph."""

    def assert_invalid(self, pattern, table, scales, ids, **attrs):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_lookup(table, scales, ids, **attrs)

        # A graph with unknown static shapes reaches the kernel's checks.
        @tf.function(input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(table).dtype)),
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.as_dtype(np.asarray(ids).dtype))])
        def graph(table, scales, ids):
            return raw_lookup(table, scales, ids, **attrs)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            graph(table, scales, ids)

    @parameterized.product(id_dtype=(np.int32, np.int64),
                           fmt=FORMATS)
    def test_id_equal_to_rows(self, id_dtype, fmt):  # L1
        data, scales = tfce.quantization.encode(np.ones((10, 4)), fmt)
        self.assert_invalid(r"ids\[2\] = 10 is not in \[0, 10\)",
                            data, scales, np.array([0, 9, 10, 3], id_dtype),
                            **reference.op_attrs(fmt, 4))

    @parameterized.product(
        bad=[(np.int32, -1), (np.int32, np.iinfo(np.int32).min),
             (np.int64, -1), (np.int64, np.iinfo(np.int64).min),
             (np.int64, np.iinfo(np.int32).max + 1),  # L3: beyond 32 bits
             (np.int64, np.iinfo(np.int64).max)],
        fmt=FORMATS)
    def test_negative_and_huge_ids(self, bad, fmt):  # L2, L3
        id_dtype, bad = bad
        data, scales = tfce.quantization.encode(np.ones((10, 4)), fmt)
        self.assert_invalid(rf"ids\[1,0\] = {bad} is not in \[0, 10\)",
                            data, scales, np.array([[1], [bad]], id_dtype),
                            **reference.op_attrs(fmt, 4))

    def test_table_not_a_matrix(self):  # L4
        for table in [np.int8(1), np.ones((5,), np.int8),
                      np.ones((2, 3, 4), np.int8)]:
            self.assert_invalid(r"table must be a matrix \[rows, dim\]",
                                table, np.ones((2,), np.float32),
                                np.array([0], np.int64))
        for fmt in quantization.ROWWISE_FORMATS:
            for table in [np.uint8(1), np.ones((5,), np.uint8),
                          np.ones((2, 8, 1), np.uint8)]:
                self.assert_invalid(
                    r"table must be a matrix \[rows, record bytes\]", table,
                    np.zeros((0,), np.float32), np.array([0], np.int64),
                    **reference.op_attrs(fmt, 4))

    def test_table_rank_rejected_by_shape_function(self):  # L4, L16
        @tf.function
        def f():
            return raw_lookup(tf.ones([5], tf.int8), tf.ones([5]),
                              tf.constant([0]))

        with self.assertRaisesRegex(ValueError, "must be rank 2"):
            f.get_concrete_function()

    @parameterized.parameters(*FORMATS)
    def test_empty_table_with_ids(self, fmt):  # L5
        data, scales = quantization.encode(np.zeros((0, 4), np.float32), fmt)
        self.assertEqual(data.shape, quantization.data_shape(fmt, 0, 4))
        self.assert_invalid(r"ids\[0\] = 0 is not in \[0, 0\)",
                            data, scales, np.array([0], np.int64),
                            **reference.op_attrs(fmt, 4))

    @parameterized.parameters(*FORMATS)
    def test_empty_ids_give_empty_output(self, fmt):  # L6
        for rows in (0, 5):
            data, scales = quantization.encode(np.zeros((rows, 4), np.float32),
                                               fmt)
            for shape in [(0,), (2, 0), (0, 3)]:
                out = raw_lookup(data, scales, np.zeros(shape, np.int64),
                                 **reference.op_attrs(fmt, 4))
                self.assertEqual(out.shape, shape + (4,))

    @parameterized.parameters(*FORMATS)
    def test_zero_dim(self, fmt):  # L7
        # Rowwise records of dim 0 are their 4 header bytes.
        data, scales = quantization.encode(np.zeros((5, 0), np.float32), fmt)
        self.assertEqual(data.shape, quantization.data_shape(fmt, 5, 0))
        attrs = reference.op_attrs(fmt, 0)
        out = raw_lookup(data, scales, np.array([[0, 4]], np.int64), **attrs)
        self.assertEqual(out.shape, (1, 2, 0))
        # A bad id is an error even when there is nothing to decode.
        self.assert_invalid(r"ids\[1\] = 5 is not in \[0, 5\)",
                            data, scales, np.array([0, 5], np.int64), **attrs)

    @parameterized.parameters(
        ((9,), r"expected shape \[10\] for an int8 table"),
        ((11,), r"expected shape \[10\] for an int8 table"),
        ((10, 1), r"scales must be a vector"),
        ((), r"scales must be a vector"))
    def test_int8_scales_wrong_shape(self, shape, pattern):  # L8
        self.assert_invalid(pattern, np.ones((10, 4), np.int8),
                            np.ones(shape, np.float32), np.array([0], np.int64))

    def test_fp16_scales_not_empty(self):  # L8
        self.assert_invalid(r"scales must be empty \(shape \[0\]\) for float16 tables",
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


def rowwise_table(fmt, rows=10, dim=13):
    """(data, scales) of a valid `fmt` table [rows, dim]."""
    rng = np.random.default_rng(9)
    return quantization.encode(reference.random_table(rng, rows, dim), fmt)


class TableFormatBadInputTest(tf.test.TestCase, parameterized.TestCase):
    """The table format attrs (row_format, dim) against the table's dtype and
    shape: rows L18-L23 of docs/bad_input_matrix.md. A wrong combination of
    dtype and attrs is refused by the kernel when run eagerly and by the
    shape function when a graph is built; a table whose shape does not fit
    them, by the kernel."""

    def assert_refused_when_built(self, pattern, table, scales, **attrs):
        ids = np.array([0], np.int64)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            raw_lookup(table, scales, ids, **attrs)

        # Unknown shapes: the attrs and the dtype alone are wrong.
        @tf.function(input_signature=[
            tf.TensorSpec(None, tf.as_dtype(np.asarray(table).dtype)),
            tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.int64)])
        def graph(table, scales, ids):
            return raw_lookup(table, scales, ids, **attrs)

        with self.assertRaisesRegex(ValueError, pattern):
            graph.get_concrete_function()

    def assert_invalid_at_run_time(self, pattern, table, scales, **attrs):
        ids = np.array([0], np.int64)
        LookupBadInputTest.assert_invalid(self, pattern, table, scales, ids,
                                          **attrs)

        # Static shapes: the graph builds, the kernel refuses the table.
        @tf.function
        def graph():
            return raw_lookup(tf.constant(table), tf.constant(scales),
                              tf.constant(ids), **attrs)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, pattern):
            graph()

    @parameterized.product(fmt=quantization.ROWWISE_FORMATS,
                           row_format=(None, "plain"))
    def test_uint8_table_with_plain_row_format(self, fmt, row_format):  # L18
        # A rowwise table passed without its attrs (row_format defaults to
        # 'plain'), or with 'plain' said.
        data, scales = rowwise_table(fmt)
        attrs = {} if row_format is None else {"row_format": row_format}
        self.assert_refused_when_built(
            r"a table of row_format 'plain' must be int8 or float16, got "
            r"uint8; uint8 tables hold rowwise records: set row_format "
            r"'int8_rowwise' or 'int4_rowwise'", data, scales, **attrs)

    @parameterized.product(fmt=("int8_split", "fp16"),
                           row_format=("int8_rowwise", "int4_rowwise"))
    def test_int8_or_half_table_with_rowwise_row_format(self, fmt,
                                                        row_format):  # L19
        data, scales = rowwise_table(fmt)
        dtype_name = {"int8_split": "int8", "fp16": "half"}[fmt]  # TF's names
        self.assert_refused_when_built(
            rf"a table of row_format '{row_format}' must be uint8 \(its rows "
            rf"are byte records\), got {dtype_name}",
            data, np.zeros([0], np.float32), row_format=row_format, dim=13)

    @parameterized.product(fmt=quantization.ROWWISE_FORMATS,
                           dim=(None, -2, np.iinfo(np.int64).min))
    def test_rowwise_dim_negative(self, fmt, dim):  # L20
        # None: dim left out (its default, -1).
        data, scales = rowwise_table(fmt)
        attrs = {"row_format": quantization.op_row_format(fmt)}
        if dim is not None:
            attrs["dim"] = int(dim)
        self.assert_refused_when_built(
            rf"attr dim must be in \[0, 1099511627776\] for row_format "
            rf"'{attrs['row_format']}' \(its records do not give it\), got "
            rf"{-1 if dim is None else dim}", data, scales, **attrs)

    @parameterized.product(fmt=("int8_split", "fp16"), dim=(0, 13, -2))
    def test_plain_dim_not_minus_one(self, fmt, dim):  # L20
        data, scales = rowwise_table(fmt)
        self.assert_refused_when_built(
            rf"attr dim must be -1 \(the table's second dimension gives it\) "
            rf"for row_format 'plain', got {dim}", data, scales, dim=dim)

    @parameterized.parameters(*quantization.ROWWISE_FORMATS)
    def test_table_width_not_record_bytes(self, fmt):  # L21
        row_format = quantization.op_row_format(fmt)
        data13, scales = rowwise_table(fmt, dim=13)  # 17 or 11 bytes a row
        other = "int4" if fmt == "int8" else "int8"
        cases = [
            # The records of another dim.
            (data13, 11),
            (data13, 20),
            # The other rowwise format's records of the same dim.
            (rowwise_table(other, dim=13)[0], 13),
            # The values without their header (the split layout's width).
            (np.ascontiguousarray(data13[:, 4:]), 13),
            # No values at all: header bytes only.
            (np.ascontiguousarray(data13[:, :4]), 13),
        ]
        for data, dim in cases:
            want = quantization.record_bytes(fmt, dim)
            self.assertNotEqual(data.shape[1], want)
            self.assert_invalid_at_run_time(
                rf"table must have shape \[rows, {want}\] for {row_format} "
                rf"rows of dim {dim} \(4 header bytes, then the values\), but "
                rf"has shape \[10,{data.shape[1]}\]",
                data, scales, row_format=row_format, dim=dim)

    def test_int4_records_of_dims_2k_minus_1_and_2k_are_the_same_size(self):
        # L21: what the op cannot check. Read as dim 14, records of dim 13
        # give a 14th value from the last byte's high nibble, 0 (the bias).
        data, scales = rowwise_table("int4", dim=13)
        got = raw_lookup(data, scales, np.arange(10),
                         **reference.op_attrs("int4", 14)).numpy()
        want = quantization.decode(data, scales, "int4", 13)
        self.assertAllEqual(got[:, :13], want)
        bias = np.ascontiguousarray(data[:, 2:4]).view("<f2")[:, 0]
        self.assertAllEqual(got[:, 13], bias.astype(np.float32))

    @parameterized.product(fmt=quantization.ROWWISE_FORMATS,
                           scales_shape=((10,), (1,), (9,)))
    def test_rowwise_scales_not_empty(self, fmt, scales_shape):  # L22
        data, _ = rowwise_table(fmt)
        row_format = quantization.op_row_format(fmt)
        self.assert_invalid_at_run_time(
            rf"scales must be empty \(shape \[0\]\) for {row_format} tables, "
            rf"but got shape \[{scales_shape[0]}\]", data,
            np.ones(scales_shape, np.float32), **reference.op_attrs(fmt, 13))
        # Not a vector: the shape function refuses a known rank.
        for shape in [(10, 0), ()]:
            LookupBadInputTest.assert_invalid(
                self, "scales must be a vector", data,
                np.ones(shape, np.float32), np.array([0], np.int64),
                **reference.op_attrs(fmt, 13))

    @parameterized.parameters("int2_rowwise", "PLAIN", "", "int8")
    def test_unknown_row_format(self, row_format):  # L23
        data, scales = rowwise_table("int8")
        # TF's words differ eagerly and in a graph; both name the attr, the
        # value and the valid ones.
        pattern = (rf"(attr|Attr) 'row_format' .*\W{row_format}\W.* "
                   rf"\"plain\", \"int8_rowwise\", \"int4_rowwise\"")
        with self.assertRaisesRegex(
                (tf.errors.InvalidArgumentError, ValueError, TypeError), pattern):
            raw_lookup(data, scales, [0], row_format=row_format, dim=13)

        @tf.function
        def graph():
            return raw_lookup(data, scales, [0], row_format=row_format, dim=13)

        with self.assertRaisesRegex((ValueError, TypeError), pattern):
            graph.get_concrete_function()

    def test_huge_rowwise_dim(self):  # L20
        """The record bytes of a dim near 2**63 do not fit int64: the op
        refuses dims above 2**40 with a message that names dim and the
        range, never a negative record size (and never overflows: the
        sanitizer run covers it)."""
        for fmt in quantization.ROWWISE_FORMATS:
            for dim in (2**63 - 1, 2**63 - 4):
                data, scales = rowwise_table(fmt)
                with self.assertRaises(tf.errors.InvalidArgumentError) as error:
                    raw_lookup(data, scales, [0], **reference.op_attrs(fmt, dim))
                self.assertIn("attr dim must be in [0, 1099511627776]",
                              error.exception.message)
                self.assertNotRegex(error.exception.message, r"\[rows, -\d")

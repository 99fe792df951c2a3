"""Replacing a table's lookups with decode subgraphs over its compressed variables.

Each replacement keeps the name of the node it replaces, so every consumer
stays wired. Every table has its own storage format (`--dtype auto` mixes
them). `ops="fused"` emits this package's ops (`CompressedEmbeddingLookup`
for row gathers, `FusedDecodeAxpy` for pooled lookups), with the
`row_format` and `dim` attributes for the rowwise formats; `ops="stock"`
emits only stock TF ops for the decode and leaves pooling to the graph's own
ops: gather fp16 + cast; gather int8 + cast * the gathered scale
(int8_split); for the rowwise records (quantization.py), gather the uint8
records, bitcast the header bytes to the float32 scale (int8) or the
float16 scale and bias (int4), the values to int8 or to nibbles (bitwise
and / right shift, interleaved), and multiply (then add the bias): the
operations and roundings of `quantization.decode`, so the rows are
bit-identical to it.
"""
import dataclasses

import tensorflow as tf

from export_tools.graph_edit import node_name, output_index
from tf_compressed_embedding import quantization


@dataclasses.dataclass
class CompressedInputs:
    """Placeholders (bound to the new variables at import) and reads of one
    table stored in format `fmt`, of decoded width `dim`."""
    data_placeholder: str
    scales_placeholder: str  # None unless int8_split (the others: an empty constant)
    data_read: str
    scales_read: str
    fmt: str
    dim: int

    @property
    def storage(self):
        return tf.as_dtype(quantization.storage_dtype(self.fmt))

    @property
    def rowwise(self):
        return self.fmt in quantization.ROWWISE_FORMATS

    def op_attrs(self):
        """The fused ops' attrs naming the format. The plain formats leave
        row_format and dim at their defaults: their nodes are the ones
        servers built with version 0.1.0's ops know."""
        if not self.rowwise:
            return {"T": self.storage}
        return {"T": self.storage, "row_format": quantization.op_row_format(self.fmt),
                "dim": self.dim}


class Emitter:
    """Emits decode subgraphs into `editor`."""

    def __init__(self, editor, specs, ops):
        self.editor = editor
        self.specs = specs
        self.ops = ops
        # num_segments tensors this emitter computed as max(segment_ids) + 1
        # -> those segment_ids (the batched op counts them itself).
        self.segment_counts = {}
        # Segment ids this emitter computed for a dense [B, L] bag -> its
        # ids matrix (the batched op takes the matrix as it is).
        self.dense_bags = {}

    def _dtype(self, tensor):
        return self.specs[node_name(tensor)][output_index(tensor)][1]

    def add_table(self, base, fmt, dim):
        """Adds the placeholders and reads for one table stored as `fmt`."""
        ed = self.editor
        storage = tf.as_dtype(quantization.storage_dtype(fmt))
        data_ph = ed.add(ed.unique_name(base + "/data"), "Placeholder", [],
                         dtype=tf.resource)
        data_read = ed.add(ed.unique_name(base + "/data_read"), "ReadVariableOp",
                           [data_ph], dtype=storage)
        if quantization.scales_shape(fmt, 1) != (0,):
            scales_ph = ed.add(ed.unique_name(base + "/scales"), "Placeholder", [],
                               dtype=tf.resource)
            scales_read = ed.add(ed.unique_name(base + "/scales_read"),
                                 "ReadVariableOp", [scales_ph], dtype=tf.float32)
        else:
            scales_ph = None
            scales_read = ed.add_const(base + "/no_scales", [], tf.float32)
        return CompressedInputs(data_ph, scales_ph, data_read, scales_read, fmt, dim)

    def control_inputs(self, table):
        """The reads that stand in for the FP32 read in control dependencies."""
        return [table.data_read] + ([table.scales_read] if table.scales_placeholder else [])

    def replace_gather(self, table, gather):
        """`gather.node` (rows of the FP32 table) becomes a decode of the same rows."""
        ed = self.editor
        name, ids = gather.node, gather.ids
        id_type = self._dtype(ids)
        ed.remove(name)
        if self.ops == "fused":
            ed.add(name, "CompressedEmbeddingLookup",
                   [table.data_read, table.scales_read, ids], Tidx=id_type,
                   **table.op_attrs())
            return
        self._stock_decode(table, name, ids, id_type)

    def replace_table_operand(self, table, pooled):
        """Stock mode, TF's fast path `SparseSegment*(table, ids, segments)`
        reading the FP32 table itself: it pools the decoded rows instead,
        `SparseSegment*(decode(ids), range(size(ids)), segments)`, the same
        sums in the same order."""
        ed = self.editor
        node = ed.nodes[pooled.root]
        ids = node.input[1]
        id_type = self._dtype(ids)
        base = ed.unique_name(pooled.root + "/stock")
        rows = self._stock_decode(table, base + "/rows", ids, id_type)
        count = ed.add(base + "/count", "Size", [ids], T=id_type, out_type=id_type)
        start = ed.add_const(base + "/start", 0, id_type)
        step = ed.add_const(base + "/step", 1, id_type)
        positions = ed.add(base + "/positions", "Range", [start, count, step],
                           Tidx=id_type)
        node.input[0] = rows
        node.input[1] = positions

    def _stock_decode(self, table, name, ids, id_type):
        """Adds node `name`: float32 rows `ids` of the table, decoded by stock
        ops (see the module)."""
        if table.rowwise:
            return self._stock_decode_records(table, name, ids, id_type)
        ed = self.editor
        axis = ed.add_const(name + "/decode/axis", 0, tf.int32)
        rows = ed.add(ed.unique_name(name + "/decode/rows"), "GatherV2",
                      [table.data_read, ids, axis], Tparams=table.storage,
                      Tindices=id_type, Taxis=tf.int32, batch_dims=0)
        if table.fmt == "fp16":
            return ed.add(name, "Cast", [rows], SrcT=tf.float16, DstT=tf.float32,
                          Truncate=False)
        as_float = ed.add(ed.unique_name(name + "/decode/to_float"), "Cast", [rows],
                          SrcT=tf.int8, DstT=tf.float32, Truncate=False)
        scales = ed.add(ed.unique_name(name + "/decode/scales"), "GatherV2",
                        [table.scales_read, ids, axis], Tparams=tf.float32,
                        Tindices=id_type, Taxis=tf.int32, batch_dims=0)
        last = ed.add_const(name + "/decode/last_axis", -1, tf.int32)
        column = ed.add(ed.unique_name(name + "/decode/scale_column"), "ExpandDims",
                        [scales, last], T=tf.float32, Tdim=tf.int32)
        return ed.add(name, "Mul", [as_float, column], T=tf.float32)

    def _columns(self, base, matrix, dtype, begin, end):
        """`matrix[:, begin:end]` of a rank-2 tensor."""
        ed = self.editor
        return ed.add(ed.unique_name(base), "StridedSlice", [
            matrix, ed.add_const(base + "_begin", [0, begin], tf.int32),
            ed.add_const(base + "_end", [0, end], tf.int32),
            ed.add_const(base + "_strides", [1, 1], tf.int32)],
            T=dtype, Index=tf.int32, begin_mask=1, end_mask=1, ellipsis_mask=0,
            new_axis_mask=0, shrink_axis_mask=0)

    def _stock_decode_records(self, table, name, ids, id_type):
        """The rows of a rowwise table: the records of the flattened ids are
        gathered as uint8 [N, R], decoded to [N, D] and shaped ids + [D].
        The little-endian header is bitcast as it is: Bitcast keeps the bytes,
        and the CPUs TF Serving runs on (x86, ARM) are little-endian."""
        ed = self.editor
        base = name + "/decode"
        flat = ed.add(ed.unique_name(base + "/flat_ids"), "Reshape",
                      [ids, ed.add_const(base + "/flat", [-1], tf.int32)],
                      T=id_type, Tshape=tf.int32)
        rows = ed.add(ed.unique_name(base + "/records"), "GatherV2",
                      [table.data_read, flat, ed.add_const(base + "/axis", 0, tf.int32)],
                      Tparams=tf.uint8, Tindices=id_type, Taxis=tf.int32, batch_dims=0)
        header_bytes = quantization.RECORD_HEADER_BYTES
        record = quantization.record_bytes(table.fmt, table.dim)
        header = self._columns(base + "/header", rows, tf.uint8, 0, header_bytes)
        values = self._columns(base + "/values", rows, tf.uint8, header_bytes, record)
        if table.fmt == "int8":
            # float32(q) * scale: one rounding, as quantization.decode
            scale = ed.add(ed.unique_name(base + "/scale"), "Bitcast", [header],
                           T=tf.uint8, type=tf.float32)
            q = ed.add(ed.unique_name(base + "/q"), "Bitcast", [values], T=tf.uint8,
                       type=tf.int8)
            as_float = ed.add(ed.unique_name(base + "/to_float"), "Cast", [q],
                              SrcT=tf.int8, DstT=tf.float32, Truncate=False)
            column = ed.add(ed.unique_name(base + "/scale_column"), "ExpandDims",
                            [scale, ed.add_const(base + "/last_axis", -1, tf.int32)],
                            T=tf.float32, Tdim=tf.int32)
            decoded = ed.add(ed.unique_name(base + "/decoded"), "Mul", [as_float, column],
                             T=tf.float32)
        else:
            # float32(q) * scale, then + bias: two roundings, as quantization.decode
            halves = ed.add(ed.unique_name(base + "/header_halves"), "Reshape",
                            [header, ed.add_const(base + "/halves", [-1, 2, 2], tf.int32)],
                            T=tf.uint8, Tshape=tf.int32)
            meta16 = ed.add(ed.unique_name(base + "/scale_bias16"), "Bitcast", [halves],
                            T=tf.uint8, type=tf.float16)
            meta = ed.add(ed.unique_name(base + "/scale_bias"), "Cast", [meta16],
                          SrcT=tf.float16, DstT=tf.float32, Truncate=False)
            scale = self._columns(base + "/scale", meta, tf.float32, 0, 1)
            bias = self._columns(base + "/bias", meta, tf.float32, 1, 2)
            low = ed.add(ed.unique_name(base + "/low"), "BitwiseAnd",
                         [values, ed.add_const(base + "/mask", 0x0F, tf.uint8)],
                         T=tf.uint8)
            high = ed.add(ed.unique_name(base + "/high"), "RightShift",
                          [values, ed.add_const(base + "/shift", 4, tf.uint8)],
                          T=tf.uint8)
            # [N, C, 2] -> [N, 2C]: element 2j is byte j's low nibble, 2j+1 its high
            pairs = ed.add(ed.unique_name(base + "/nibble_pairs"), "Pack", [low, high],
                           N=2, T=tf.uint8, axis=2)
            nibbles = ed.add(ed.unique_name(base + "/nibbles"), "Reshape", [
                pairs, ed.add_const(base + "/nibbles_shape",
                                    [-1, 2 * (record - header_bytes)], tf.int32)],
                T=tf.uint8, Tshape=tf.int32)
            q = self._columns(base + "/q", nibbles, tf.uint8, 0, table.dim)
            as_float = ed.add(ed.unique_name(base + "/to_float"), "Cast", [q],
                              SrcT=tf.uint8, DstT=tf.float32, Truncate=False)
            scaled = ed.add(ed.unique_name(base + "/scaled"), "Mul", [as_float, scale],
                            T=tf.float32)
            decoded = ed.add(ed.unique_name(base + "/decoded"), "AddV2", [scaled, bias],
                             T=tf.float32)
        ids_shape = ed.add(ed.unique_name(base + "/ids_shape"), "Shape", [ids],
                           T=id_type, out_type=tf.int32)
        shape = ed.add(ed.unique_name(base + "/shape"), "ConcatV2", [
            ids_shape, ed.add_const(base + "/dim", [table.dim], tf.int32),
            ed.add_const(base + "/concat_axis", 0, tf.int32)], T=tf.int32, N=2,
            Tidx=tf.int32)
        return ed.add(name, "Reshape", [decoded, shape], T=tf.float32, Tshape=tf.int32)

    def replace_shape_query(self, table, name):
        """`Shape(read)` / `VariableShape(T)` / `Size` / `Rank` of the table:
        the same values, asked of the compressed rows. A rowwise table's
        records are [V, R]; its shape [V, D] is built from V."""
        ed = self.editor
        node = ed.nodes[name]
        source = table.data_placeholder if node.op == "VariableShape" else table.data_read
        node.input[0] = source
        if node.op in ("Shape", "Size", "Rank"):
            node.attr["T"].type = table.storage.as_datatype_enum
        if not table.rowwise or node.op == "Rank":
            return
        op, inputs = node.op, list(node.input)
        out_type = tf.as_dtype(node.attr["out_type"].type)
        ed.remove(name)
        if op == "VariableShape":
            records = ed.add(ed.unique_name(name + "/records"), op, inputs,
                             out_type=out_type)
        else:
            records = ed.add(ed.unique_name(name + "/records"), "Shape", inputs,
                             T=table.storage, out_type=out_type)
        rows = ed.add(ed.unique_name(name + "/rows"), "StridedSlice", [
            records, ed.add_const(name + "/rows_begin", [0], tf.int32),
            ed.add_const(name + "/rows_end", [1], tf.int32),
            ed.add_const(name + "/rows_strides", [1], tf.int32)],
            T=out_type, Index=tf.int32, begin_mask=0, end_mask=0, ellipsis_mask=0,
            new_axis_mask=0, shrink_axis_mask=0)
        shape_name = name if op != "Size" else ed.unique_name(name + "/decoded_shape")
        shape = ed.add(shape_name, "ConcatV2", [
            rows, ed.add_const(name + "/dim", [table.dim], out_type),
            ed.add_const(name + "/axis", 0, tf.int32)], T=out_type, N=2, Tidx=tf.int32)
        if op == "Size":
            ed.add(name, "Prod", [shape, ed.add_const(name + "/prod_axis", [0], tf.int32)],
                   T=out_type, Tidx=tf.int32, keep_dims=False)

    def replace_pooled(self, table, pooled):
        """`pooled.root` becomes one FusedDecodeAxpy (fused mode only)."""
        ed = self.editor
        root = pooled.root
        base = root + "/fused"
        if pooled.segment_ids is None:
            ids, segment_ids, num_segments = self._dense_bag(base, pooled.ids)
        else:
            ids = self._ids(base, pooled.ids)
            segment_ids = pooled.segment_ids
            num_segments = pooled.num_segments or self._segment_count(base, segment_ids)
        weights = self._weights(base, pooled)
        ed.remove(root)
        ed.add(root, "FusedDecodeAxpy",
               [table.data_read, table.scales_read, ids, segment_ids, weights, num_segments],
               **table.op_attrs(), Tidx=self._dtype(ids), Tseg=self._dtype(segment_ids),
               Tnumsegments=self._dtype(num_segments), combiner=pooled.combiner)

    def _record(self, name, dtype):
        self.specs[name] = [(None, dtype)]
        return name

    def _ids(self, base, ids):
        if not isinstance(ids, tuple):
            return ids
        rows_ids, indices = ids
        ed = self.editor
        axis = ed.add_const(base + "/axis", 0, tf.int32)
        name = ed.add(ed.unique_name(base + "/ids"), "GatherV2", [rows_ids, indices, axis],
                      Tparams=self._dtype(rows_ids), Tindices=self._dtype(indices),
                      Taxis=tf.int32, batch_dims=0)
        return self._record(name, self._dtype(rows_ids))

    def _segment_count(self, base, segment_ids):
        """max(segment_ids) + 1, and 0 for no ids: what Segment* ops output."""
        ed = self.editor
        dtype = self._dtype(segment_ids)
        axis = ed.add_const(base + "/axis0", [0], tf.int32)
        top = ed.add(ed.unique_name(base + "/max_segment"), "Max", [segment_ids, axis],
                     T=dtype, Tidx=tf.int32, keep_dims=False)
        minus_one = ed.add_const(base + "/minus_one", -1, dtype)
        top = ed.add(ed.unique_name(base + "/max_segment_or_none"), "Maximum",
                     [top, minus_one], T=dtype)
        one = ed.add_const(base + "/one", 1, dtype)
        count = self._record(ed.add(ed.unique_name(base + "/num_segments"), "AddV2",
                                    [top, one], T=dtype), dtype)
        self.segment_counts[count] = segment_ids
        return count

    def _dense_bag(self, base, ids):
        """[B, L] ids -> flat ids, segment ids (row of each id) and B."""
        ed = self.editor
        id_type = self._dtype(ids)
        flat_shape = ed.add_const(base + "/flat", [-1], tf.int32)
        flat = self._record(ed.add(ed.unique_name(base + "/flat_ids"), "Reshape",
                                   [ids, flat_shape], T=id_type, Tshape=tf.int32), id_type)
        shape = ed.add(ed.unique_name(base + "/ids_shape"), "Shape", [ids],
                       T=id_type, out_type=tf.int64)

        def dim(i):
            begin = ed.add_const(base + f"/dim{i}_begin", [i], tf.int32)
            end = ed.add_const(base + f"/dim{i}_end", [i + 1], tf.int32)
            stride = ed.add_const(base + f"/dim{i}_stride", [1], tf.int32)
            return ed.add(ed.unique_name(base + f"/dim{i}"), "StridedSlice",
                          [shape, begin, end, stride], T=tf.int64, Index=tf.int32,
                          shrink_axis_mask=1, begin_mask=0, end_mask=0,
                          ellipsis_mask=0, new_axis_mask=0)
        bags, bag_size = dim(0), dim(1)
        count = ed.add(ed.unique_name(base + "/id_count"), "Mul", [bags, bag_size],
                       T=tf.int64)
        zero = ed.add_const(base + "/zero", 0, tf.int64)
        one = ed.add_const(base + "/one", 1, tf.int64)
        positions = ed.add(ed.unique_name(base + "/positions"), "Range",
                           [zero, count, one], Tidx=tf.int64)
        divisor = ed.add(ed.unique_name(base + "/bag_size_or_one"), "Maximum",
                         [bag_size, one], T=tf.int64)
        segment_ids = ed.add(ed.unique_name(base + "/segment_ids"), "FloorDiv",
                             [positions, divisor], T=tf.int64)
        self.dense_bags[segment_ids] = ids
        return flat, self._record(segment_ids, tf.int64), self._record(bags, tf.int64)

    def _weights(self, base, pooled):
        ed = self.editor
        if pooled.weights is None:
            return ed.add_const(base + "/unweighted", [], tf.float32)
        weights = pooled.weights
        if pooled.dense_weights_3d:  # [B or 1, L or 1, 1] -> [B, L, 1]
            ids_shape = ed.add(ed.unique_name(base + "/weights_ids_shape"), "Shape",
                               [pooled.ids], T=self._dtype(pooled.ids), out_type=tf.int32)
            ones = ed.add_const(base + "/weights_one", [1], tf.int32)
            axis = ed.add_const(base + "/weights_axis", 0, tf.int32)
            target = ed.add(ed.unique_name(base + "/weights_shape"), "ConcatV2",
                            [ids_shape, ones, axis], T=tf.int32, N=2, Tidx=tf.int32)
            weights = ed.add(ed.unique_name(base + "/weights_full"), "BroadcastTo",
                             [weights, target], T=self._dtype(pooled.weights),
                             Tidx=tf.int32)
        dtype = self._dtype(pooled.weights)
        flat_shape = ed.add_const(base + "/weights_flat", [-1], tf.int32)
        flat = ed.add(ed.unique_name(base + "/weights"), "Reshape", [weights, flat_shape],
                      T=dtype, Tshape=tf.int32)
        if dtype != tf.float32:
            flat = ed.add(ed.unique_name(base + "/weights_f32"), "Cast", [flat],
                          SrcT=dtype, DstT=tf.float32, Truncate=False)
        return flat

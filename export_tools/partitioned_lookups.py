"""Lookups of a TF1 partitioned table become lookups of one whole table.

`embedding_lookup` over a partitioned variable (a `fixed_size_partitioner`
table, any `partition_strategy`) is a scatter-gather in the graph:

    pa, local = <strategy>(flat ids)            # partition and row in it
    ids_p  = DynamicPartition(local, pa, P):p
    pos_p  = DynamicPartition(Range(0, n), pa, P):p
    rows_p = Gather(partition p, ids_p)
    rows   = ParallelDynamicStitch(pos_0..pos_P-1, rows_0..rows_P-1)  # or DynamicStitch
    [rows  = Reshape(rows, Concat(Shape(ids), [D]))]

Row k of `rows` is row `local[k]` of partition `pa[k]`, that is row
`offset[pa[k]] + local[k]` of the whole variable. This pass replaces the
stitch (and the Reshape back to the ids' shape) with one gather of the whole
variable at those rows, so that the pooling after it matches the patterns of
`lookup_patterns` and the table is stored, compressed and fused as one. The
strategy's own arithmetic is kept, so every strategy and partition layout is
handled alike. Where the source fails (a partition index outside [0, P)
fails in the gather of `offset`; a row outside its partition maps to id -1,
which every lookup op refuses), so does the rewrite: no id is ever moved
into a neighbouring partition's rows.
"""
import re

import tensorflow as tf

from export_tools.checkpoint_io import VariableLocation
from export_tools.graph_edit import node_name, output_index

# The positions stitched are a partition of range(n), each once, so both
# stitches (which differ only in the order duplicates are written) agree.
_STITCH_OPS = ("ParallelDynamicStitch", "DynamicStitch")


def merge_partitioned_lookups(editor, locations, keep):
    """Rewrites every whole-variable partitioned lookup in `editor`.

    `locations` maps variable placeholders to their VariableLocation (a
    partition's is a row block of its variable). Returns {placeholder:
    VariableLocation} of the whole-variable placeholders added; the nodes
    left dead (the partitions' gathers, and the partitions themselves when
    nothing else reads them) are pruned, keeping what `keep` reaches.
    """
    wholes = {}  # checkpoint key -> (placeholder, read)
    added = {}
    for stitch in [n for n in editor.graph_def.node if n.op in _STITCH_OPS]:
        match = _match(editor, stitch, locations)
        if match is None:
            continue
        parts, partitions, local_ids, id_type = match
        whole = _whole_location(parts)
        if whole.key not in wholes:
            base = re.sub(r"[^A-Za-z0-9_./-]", "_", whole.name) + "/whole"
            placeholder = editor.add(editor.unique_name(base), "Placeholder", [],
                                     dtype=tf.resource)
            read = editor.add(editor.unique_name(base + "/read"), "ReadVariableOp",
                              [placeholder], dtype=whole.dtype)
            wholes[whole.key] = (placeholder, read)
            added[placeholder] = whole
        _, read = wholes[whole.key]
        rows = _whole_rows(editor, stitch.name + "/whole", parts, partitions, local_ids,
                           id_type)
        _replace_with_gather(editor, stitch, read, rows, id_type, whole)
    if added:
        editor.prune(keep)
    return added


def _match(editor, stitch, locations):
    """(partition locations in stitch order, partition-index tensor, local-row
    tensor, id dtype) when `stitch` reassembles plain gathers of every
    partition of one variable; else None."""
    count = stitch.attr["N"].i
    positions, data = stitch.input[:count], stitch.input[count:]
    if count < 2 or len(data) != count:
        return None
    position_split = _partition_outputs(editor, positions, count)
    if position_split is None or not _is_position_range(editor, position_split.input[0]):
        return None
    partitions = editor.through_identity(position_split.input[1])
    parts, local_rows, id_types = [], [], set()
    for tensor in data:
        gathered = _plain_gather(editor, tensor)
        if gathered is None or gathered[0] not in locations:
            return None
        table, ids, dtype = gathered
        parts.append(locations[table])
        local_rows.append(ids)
        id_types.add(dtype)
    id_split = _partition_outputs(editor, local_rows, count)
    if (id_split is None or len(id_types) != 1
            or not _same_tensor(editor.through_identity(id_split.input[1]), partitions)
            or not _tile_one_variable(parts)):
        return None
    id_type = id_types.pop()
    return parts, partitions, id_split.input[0], id_type


def _partition_outputs(editor, tensors, count):
    """The DynamicPartition node whose outputs 0..count-1 are `tensors`, in order."""
    resolved = [editor.through_identity(t) for t in tensors]
    node = editor.node(resolved[0])
    if node.op != "DynamicPartition" or node.attr["num_partitions"].i != count:
        return None
    if any(node_name(t) != node.name or output_index(t) != p
           for p, t in enumerate(resolved)):
        return None
    return node


def _same_tensor(a, b):
    return (node_name(a), output_index(a)) == (node_name(b), output_index(b))


def _is_position_range(editor, tensor):
    node = editor.node(editor.through_identity(tensor))
    if node.op != "Range":
        return False
    start, delta = editor.const_value(node.input[0]), editor.const_value(node.input[2])
    return start is not None and delta is not None and int(start) == 0 and int(delta) == 1


def _plain_gather(editor, tensor):
    """(table placeholder, ids, id dtype) when `tensor` is a row gather of a
    variable: ResourceGather(T, ids) or GatherV2(ReadVariableOp(T), ids, 0)."""
    node = editor.node(editor.through_identity(tensor))
    if node.op not in ("ResourceGather", "GatherV2") or (
            "batch_dims" in node.attr and node.attr["batch_dims"].i != 0):
        return None
    if node.op == "ResourceGather":
        table = node_name(editor.through_identity(node.input[0]))
    elif node.op == "GatherV2":
        axis = editor.const_value(node.input[2])
        read = editor.node(editor.through_identity(node.input[0]))
        if axis is None or int(axis) != 0 or read.op != "ReadVariableOp":
            return None
        table = node_name(editor.through_identity(read.input[0]))
    return table, node.input[1], tf.as_dtype(node.attr["Tindices"].type)


def _tile_one_variable(parts):
    """The partitions are row blocks of one rank-2 variable that cover it
    exactly once."""
    first = parts[0]
    if len(first.full_shape) != 2 or any(
            p.key != first.key or p.full_shape != first.full_shape or p.dtype != first.dtype
            or p.offset[1] != 0 or p.shape[1] != first.full_shape[1] for p in parts):
        return False
    blocks = sorted((p.offset[0], p.shape[0]) for p in parts)
    end = 0
    for start, rows in blocks:
        if start != end:
            return False
        end = start + rows
    return end == first.full_shape[0]


def _whole_location(parts):
    first = parts[0]
    stems = {re.sub(r"/part_\d+$", "", p.name) for p in parts}
    name = stems.pop() if len(stems) == 1 else first.key
    return VariableLocation(name, first.key, first.full_shape, (0,) * len(first.full_shape),
                            first.full_shape, first.dtype)


def _whole_rows(editor, base, parts, partitions, local_ids, id_type):
    """offset[pa] + local where 0 <= local < rows[pa], else -1."""
    ed = editor
    offsets = ed.add_const(base + "/partition_offsets", [p.offset[0] for p in parts], id_type)
    sizes = ed.add_const(base + "/partition_rows", [p.shape[0] for p in parts], id_type)
    axis = ed.add_const(base + "/axis", 0, tf.int32)

    def per_id(name, table):
        return ed.add(ed.unique_name(f"{base}/{name}"), "GatherV2",
                      [table, partitions, axis], Tparams=id_type, Tindices=tf.int32,
                      Taxis=tf.int32, batch_dims=0)
    offset, limit = per_id("offset", offsets), per_id("limit", sizes)
    zero = ed.add_const(base + "/zero", 0, id_type)
    above = ed.add(ed.unique_name(base + "/not_negative"), "GreaterEqual",
                   [local_ids, zero], T=id_type)
    below = ed.add(ed.unique_name(base + "/below_limit"), "Less", [local_ids, limit],
                   T=id_type)
    inside = ed.add(ed.unique_name(base + "/inside"), "LogicalAnd", [above, below])
    rows = ed.add(ed.unique_name(base + "/rows"), "AddV2", [offset, local_ids], T=id_type)
    invalid = ed.add_const(base + "/invalid", -1, id_type)
    return ed.add(ed.unique_name(base + "/ids"), "SelectV2", [inside, rows, invalid],
                  T=id_type)


def _replace_with_gather(editor, stitch, read, rows, id_type, whole):
    """The stitch, or the Reshape of it back to the ids' shape, becomes
    GatherV2(whole, rows) under its own name."""
    ed = editor
    target, ids = stitch.name, rows
    consumers = ed.data_consumers(stitch.name)
    if len(consumers) == 1 and consumers[0][0].op == "Reshape" and consumers[0][1] == 0:
        reshape = consumers[0][0]
        ids_shape = _ids_shape(ed, reshape.input[1], whole.full_shape[1])
        if ids_shape is not None:
            target = reshape.name
            shape_node = ed.node(ids_shape)
            shape_type = (tf.as_dtype(shape_node.attr["out_type"].type)
                          if "out_type" in shape_node.attr else tf.int32)
            ids = ed.add(ed.unique_name(stitch.name + "/whole/ids_shaped"), "Reshape",
                         [rows, ids_shape], T=id_type, Tshape=shape_type)
    axis = ed.add_const(stitch.name + "/whole/gather_axis", 0, tf.int32)
    ed.remove(target)
    ed.add(target, "GatherV2", [read, ids, axis], Tparams=whole.dtype, Tindices=id_type,
           Taxis=tf.int32, batch_dims=0)


def _ids_shape(editor, shape_tensor, dim):
    """`Shape(ids)` when `shape_tensor` is Concat(Shape(ids), [dim]) (how
    embedding_lookup restores the ids' shape), else None."""
    concat = editor.node(editor.through_identity(shape_tensor))
    if concat.op != "ConcatV2" or concat.attr["N"].i != 2:
        return None
    head = editor.through_identity(concat.input[0])
    tail = editor.const_value(concat.input[1])
    axis = editor.const_value(concat.input[2])
    if (editor.node(head).op != "Shape" or tail is None or list(tail.reshape(-1)) != [dim]
            or axis is None or int(axis) != 0):
        return None
    return head

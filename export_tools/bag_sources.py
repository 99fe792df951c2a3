"""Which pooled lookups the batched op can take with their ids as they
come, before the preprocessing that turned them into segment ids: those
nodes are then pruned from the export.

- dense [B, L] ids (a gather reduced over its bag axis): the rewrite's
  flatten / Range / FloorDiv chain becomes bag kind 'dense';
- padded ids turned into a SparseTensor, `where = tf.where(ids >= 0)`,
  `tf.gather_nd(ids, where)` and `where[:, 0]`: bag kind 'padded';
- a RaggedTensor's values and row splits, whose segment ids TF computes
  with the ~30 nodes of RaggedSplitsToSegmentIds: bag kind 'row_splits'.

Only unweighted lookups are taken: a weighted one keeps its segment ids.
The row counts stay TF's: the rows of a dense matrix, or the last row
holding an id + 1 (what SparseSegment* ops without num_segments give).
"""
import tensorflow as tf

from export_tools.graph_edit import known_rank, node_name, output_index
from tf_compressed_embedding._batched_inputs import ROWS_OF_BAGS, ROWS_WITH_IDS
# The ops TF's RaggedSplitsToSegmentIds (ragged_util.repeat) is built of.
_RAGGED_ROW_IDS_OPS = {"Shape", "StridedSlice", "Sub", "Cast", "Range", "ExpandDims",
                       "BroadcastTo", "Max", "Maximum", "Pack", "Less", "Tile",
                       "Reshape", "Where", "Squeeze", "Prod", "ConcatV2", "GatherV2",
                       "Identity", "Const", "SequenceMask"}


def bag_source(editor, emitter, inputs, k, counted):
    """Lookup k's bags as the batched op can take them without the id
    preprocessing before them: (bag kind, ids or None to keep them, bag
    splits or None for none, its bag count (_batched_inputs) or None to
    keep its num_segments), or None. `counted`: its row count is the
    emitter's last segment id + 1."""
    if not unweighted(editor, inputs["weights"][k]):
        return None
    segment_ids = inputs["segment_ids"][k]
    matrix = emitter.dense_bags.get(segment_ids)
    if matrix is not None and known_rank(emitter.specs, matrix) == 2:
        return b"dense", matrix, None, ROWS_OF_BAGS
    padded = _padded_ids(editor, emitter.specs, inputs["ids"][k], segment_ids)
    if padded is not None:
        return b"padded", padded, None, ROWS_WITH_IDS if counted else None
    splits = _ragged_row_splits(editor, segment_ids)
    if splits is not None and counted:
        return b"row_splits", None, splits, ROWS_WITH_IDS
    return None


def unweighted(editor, weights):
    """Whether `weights` is an empty constant (an unweighted lookup)."""
    value = editor.const_value(weights)
    return value is not None and value.size == 0


def _padded_ids(editor, specs, ids, segment_ids):
    """X when `ids` is gather_nd(X, where) and `segment_ids` where[:, 0],
    for where = tf.where(X >= 0) and X an int [B, L] matrix; else None."""
    gather = editor.node(ids)
    if gather.op != "GatherNd" or output_index(ids) != 0:
        return None
    matrix, where = gather.input[0], gather.input[1]
    column = editor.node(segment_ids)
    if (column.op != "StridedSlice" or output_index(segment_ids) != 0
            or column.input[0] != where or not _is_first_column(editor, column)):
        return None
    where_node = editor.node(where)
    if where_node.op != "Where" or output_index(where) != 0:
        return None
    test = editor.node(where_node.input[0])
    if test.op != "GreaterEqual" or output_index(where_node.input[0]) != 0:
        return None
    zero = editor.const_value(test.input[1])
    if (zero is None or zero.size != 1 or zero.reshape(()) != 0
            or editor.through_identity(test.input[0])
            != editor.through_identity(matrix)):
        return None
    if (known_rank(specs, matrix) != 2
            or gather.attr["Tparams"].type not in (tf.int32.as_datatype_enum,
                                                   tf.int64.as_datatype_enum)):
        return None
    return matrix


def _is_first_column(editor, node):
    """Whether StridedSlice `node` is x[:, 0] of a matrix x."""
    masks = {key: node.attr[key].i for key in (
        "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    if masks != {"begin_mask": 1, "end_mask": 1, "ellipsis_mask": 0,
                 "new_axis_mask": 0, "shrink_axis_mask": 2}:
        return False
    values = [editor.const_value(t) for t in node.input[1:4]]
    return (all(v is not None and v.shape == (2,) for v in values)
            and list(values[0]) == [0, 0] and list(values[1])[1] == 1
            and list(values[2]) == [1, 1])


def _ragged_row_splits(editor, segment_ids):
    """The row splits a RaggedTensor's segment ids (value_rowids) were
    computed from by TF's RaggedSplitsToSegmentIds, or None: the node is in
    that name scope and its only non-constant source is one tensor."""
    if "RaggedSplitsToSegmentIds/" not in node_name(segment_ids):
        return None
    sources, seen, stack = set(), set(), [segment_ids]
    while stack:
        tensor = stack.pop()
        name = node_name(tensor)
        if name in seen:
            continue
        seen.add(name)
        node = editor.nodes[name]
        if node.op == "Const":
            continue
        if "RaggedSplitsToSegmentIds/" not in name:
            sources.add(tensor)
            continue
        if node.op not in _RAGGED_ROW_IDS_OPS:
            return None
        stack.extend(i for i in node.input if not i.startswith("^"))
    return sources.pop() if len(sources) == 1 else None

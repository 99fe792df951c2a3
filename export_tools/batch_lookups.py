"""Merging a rewritten signature's pooled lookups into BatchedFusedDecodeAxpy
nodes: one node for every set of FusedDecodeAxpy nodes that do not depend
on one another.

TensorFlow's executor costs about as much per node as a whole pooled lookup
of a few ids, so a model with a hundred sparse features pays it a hundred
times per request; the batched op pays it once and spreads the features'
bags over the intra-op threads. Its reference semantics are the loop of
FusedDecodeAxpy calls it replaces (each bag pooled by the same kernel in the
same order), so outputs do not change.

Nodes are grouped by level: a lookup's level is one more than the highest
level of the lookups it depends on (through data or control edges), so no
two lookups of a level depend on each other and merging them cannot make a
cycle. In a model whose ids come straight from its inputs every lookup has
level 1: one node for all of them.

A lookup whose row count the rewrite computed as the last segment id + 1
(TF's SparseSegment* ops without num_segments) passes num_bags -2 instead:
the batched op counts those rows itself, and the three nodes per lookup
that computed them are pruned.

The batched op also absorbs the id preprocessing of unweighted lookups
whose bags it can take as they come (`_bag_source`), so those nodes are
pruned too:
- dense [B, L] ids (a gather reduced over its bag axis): the rewrite's
  flatten / Range / FloorDiv chain becomes bag kind 'dense';
- padded ids turned into a SparseTensor, `where = tf.where(ids >= 0)`,
  `tf.gather_nd(ids, where)` and `where[:, 0]`: bag kind 'padded';
- a RaggedTensor's values and row splits, whose segment ids TF computes
  with the ~30 nodes of RaggedSplitsToSegmentIds: bag kind 'row_splits'.
"""
import collections

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from export_tools.graph_edit import known_rank, node_name, output_index

BATCHED_OP = "BatchedFusedDecodeAxpy"
# FusedDecodeAxpy's inputs, in order.
_INPUTS = ("table", "scales", "ids", "segment_ids", "weights", "num_segments")


def batch_pooled_lookups(editor, keep, feature_names, emitter):
    """Replaces every level of two or more FusedDecodeAxpy nodes by one
    BatchedFusedDecodeAxpy node whose outputs feed their consumers.

    `keep`: tensor names the signature outputs or feeds; a merged node named
    there stays, as an Identity of its batched output. `feature_names`:
    {table read tensor: table name}, for the batched op's error messages.
    `emitter`: the Emitter that wrote the lookups: its `segment_counts`
    (row counts it computed) and `dense_bags` (segment ids it computed for
    dense ids) are what the batched op computes itself. Returns [(batched
    node, number of features)].
    """
    fused = [n.name for n in editor.graph_def.node if n.op == "FusedDecodeAxpy"]
    if len(fused) < 2:
        return []
    levels = _levels(editor, set(fused))
    by_level = collections.defaultdict(list)
    for name in fused:
        by_level[levels[name]].append(name)
    kept = {node_name(k) for k in keep}
    merged = []
    for level in sorted(by_level):
        names = by_level[level]
        if len(names) >= 2:
            merged.append((_merge(editor, names, kept, feature_names, emitter),
                           len(names)))
    editor._reindex()  # noqa: SLF001 - consumers were rewired in place
    return merged


def _levels(editor, fused):
    """{node: the number of `fused` nodes on the longest path from the
    graph's sources to it, itself included}, over data and control edges."""
    level = {}
    for start in editor.nodes:
        stack = [(start, False)]
        while stack:
            name, inputs_done = stack.pop()
            if name in level:
                continue
            inputs = [node_name(i) for i in editor.nodes[name].input]
            if not inputs_done:
                stack.append((name, True))
                stack.extend((i, False) for i in inputs if i not in level)
                continue
            level[name] = (max((level[i] for i in inputs), default=0)
                           + (name in fused))
    return level


def _list_attr(values, kind):
    return attr_value_pb2.AttrValue(
        list=attr_value_pb2.AttrValue.ListValue(**{kind: values}))


def _merge(editor, names, kept, feature_names, emitter):
    """One batched node for FusedDecodeAxpy nodes `names`; returns its name."""
    nodes = [editor.nodes[n] for n in names]
    inputs = {key: [n.input[i] for n in nodes] for i, key in enumerate(_INPUTS)}
    id_types = [_type(n, "Tidx") for n in nodes]
    split_types = [_type(n, "Tseg") for n in nodes]
    count_types = [_type(n, "Tnumsegments") for n in nodes]
    kinds = [b"segment_ids"] * len(nodes)
    shared = {}

    def const(key, value, dtype):
        if key not in shared:
            shared[key] = editor.add_const(f"tfce_batched_lookup/{key}", value, dtype)
        return shared[key]

    for k in range(len(nodes)):
        counted = (emitter.segment_counts.get(inputs["num_segments"][k])
                   == inputs["segment_ids"][k])
        source = _bag_source(editor, emitter, inputs, k, counted)
        if source is not None:
            kinds[k], ids, splits, rows = source
            if ids is not None:
                inputs["ids"][k] = ids
                id_types[k] = _output_type(editor, emitter, ids)
            if splits is None:
                splits = const("no_splits", [], tf.int64)
            inputs["segment_ids"][k] = splits
            split_types[k] = _output_type(editor, emitter, splits)
        else:
            rows = ROWS_WITH_IDS if counted else None
        if rows is not None:
            inputs["num_segments"][k] = const(f"rows_{-rows}", rows, tf.int64)
            count_types[k] = tf.int64.as_datatype_enum
    controls = sorted({i for n in nodes for i in n.input[len(_INPUTS):]})

    def attr_of(node, key, default=None):
        return node.attr[key] if key in node.attr else default

    row_formats, dims = [], []
    for n in nodes:
        row_format = attr_of(n, "row_format")
        row_formats.append(row_format.s if row_format is not None else b"plain")
        dim = attr_of(n, "dim")
        dims.append(dim.i if dim is not None else -1)
    combiners = [n.attr["combiner"].s if "combiner" in n.attr else b"sum"
                 for n in nodes]
    name = editor.unique_name("tfce_batched_lookup")
    editor.add(
        name, BATCHED_OP,
        inputs["table"] + inputs["scales"] + inputs["ids"] + inputs["segment_ids"]
        + inputs["weights"] + inputs["num_segments"] + controls,
        N=len(nodes),
        Ttables=_list_attr([n.attr["T"].type for n in nodes], "type"),
        Tids=_list_attr(id_types, "type"),
        Tsplits=_list_attr(split_types, "type"),
        Tnum_bags=_list_attr(count_types, "type"),
        row_formats=_list_attr(row_formats, "s"),
        dims=_list_attr(dims, "i"),
        combiners=_list_attr(combiners, "s"),
        bag_kinds=_list_attr(kinds, "s"),
        concat=False, num_outputs=len(nodes),
        feature_names=_list_attr(
            [feature_names.get(n.input[0], n.name).encode() for n in nodes], "s"))
    outputs = {n.name: f"{name}:{k}" for k, n in enumerate(nodes)}
    for old in names:
        editor.remove(old)
    for node in editor.graph_def.node:
        for pos, inp in enumerate(node.input):
            source = node_name(inp)
            if source not in outputs:
                continue
            if inp.startswith("^"):
                node.input[pos] = "^" + name
            else:
                assert output_index(inp) == 0, inp  # FusedDecodeAxpy has one output
                node.input[pos] = outputs[source]
    for old in names:
        if old in kept:
            editor.add(old, "Identity", [outputs[old]], T=tf.float32)
    _dedupe_control_inputs(editor)
    return name


# The batched op's num_bags values that ask it to count the rows: those of
# the bag structure, and the last row holding an id + 1.
ROWS_OF_BAGS = -1
ROWS_WITH_IDS = -2
# The ops TF's RaggedSplitsToSegmentIds (ragged_util.repeat) is built of.
_RAGGED_ROW_IDS_OPS = {"Shape", "StridedSlice", "Sub", "Cast", "Range", "ExpandDims",
                       "BroadcastTo", "Max", "Maximum", "Pack", "Less", "Tile",
                       "Reshape", "Where", "Squeeze", "Prod", "ConcatV2", "GatherV2",
                       "Identity", "Const", "SequenceMask"}


def _bag_source(editor, emitter, inputs, k, counted):
    """Lookup k's bags as the batched op can take them without the id
    preprocessing before them: (bag kind, ids or None to keep them, bag
    splits or None for none, num_bags constant or None to keep it), or
    None. `counted`: its row count is the emitter's last segment id + 1."""
    if not _unweighted(editor, inputs["weights"][k]):
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


def _unweighted(editor, weights):
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


def _output_type(editor, emitter, tensor):
    """The dtype enum of `tensor`, from the specs or its Const."""
    shapes = emitter.specs.get(node_name(tensor))
    if shapes is not None and output_index(tensor) < len(shapes):
        return tf.as_dtype(shapes[output_index(tensor)][1]).as_datatype_enum
    return editor.node(tensor).attr["dtype"].type


def _type(node, key):
    """A type attr of FusedDecodeAxpy, its default (int64) when absent."""
    return node.attr[key].type if key in node.attr else tf.int64.as_datatype_enum


def _dedupe_control_inputs(editor):
    """Two merged nodes may both have been control inputs of one node: keep
    one '^batched' each (TF refuses duplicate control inputs)."""
    for node in editor.graph_def.node:
        seen, kept = set(), []
        for inp in node.input:
            if inp.startswith("^"):
                if inp in seen:
                    continue
                seen.add(inp)
            kept.append(inp)
        if len(kept) != len(node.input):
            del node.input[:]
            node.input.extend(kept)

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
(TF's SparseSegment* ops without num_segments) has the batched op count
those rows itself (bag count 'rows_with_ids'), and the three nodes per
lookup that computed them are pruned. The node has only the inputs each
lookup needs (tf_compressed_embedding/_batched_inputs.py): no empty scales,
weights or splits, no row count it counts itself, and each table as its
variable's handle, which the op reads (no ReadVariableOp node per table).

The batched op also absorbs the id preprocessing of unweighted lookups
whose bags it can take as they come (bag_sources.py), so those nodes are
pruned too. When the merged lookups' only use is one ConcatV2 along their
last axis, side by side (a ranking model concatenating its pooled features
for its MLP), the node writes them concatenated (its `concat` output) and
the ConcatV2 takes that one tensor in their place: the op allocates one
output instead of one per lookup and nothing copies them again.
"""
import collections

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from export_tools.bag_sources import bag_source, unweighted
from tf_compressed_embedding import _batched_inputs
from tf_compressed_embedding._batched_inputs import ROWS_WITH_IDS
from export_tools.graph_edit import node_name, output_index

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
    concat = _concat_of(editor, names, kept)
    if concat is not None:
        names = concat[1]  # the features in the ConcatV2's order
    nodes = [editor.nodes[n] for n in names]
    inputs = {key: [n.input[i] for n in nodes] for i, key in enumerate(_INPUTS)}
    features = []
    for k, node in enumerate(nodes):
        # Values are (tensor name, dtype enum): the names become the node's
        # inputs, the dtypes its type-list attrs.
        ids = (inputs["ids"][k], _type(node, "Tidx"))
        kind = b"segment_ids"
        splits = (inputs["segment_ids"][k], _type(node, "Tseg"))
        num_bags = (inputs["num_segments"][k], _type(node, "Tnumsegments"))
        counted = (emitter.segment_counts.get(inputs["num_segments"][k])
                   == inputs["segment_ids"][k])
        source = bag_source(editor, emitter, inputs, k, counted)
        if source is not None:
            kind, source_ids, source_splits, rows = source
            if rows is not None:
                num_bags = rows
            if source_ids is not None:
                ids = (source_ids, _output_type(editor, emitter, source_ids))
            splits = (None if source_splits is None else
                      (source_splits, _output_type(editor, emitter, source_splits)))
        elif counted:
            num_bags = ROWS_WITH_IDS
        row_format = node.attr["row_format"].s if "row_format" in node.attr else b"plain"
        table_type = node.attr["T"].type
        features.append(_batched_inputs.Feature(
            table=_table_operand(editor, inputs["table"][k], table_type), ids=ids,
            bag_kind=kind.decode(), row_format=row_format.decode(),
            dim=node.attr["dim"].i if "dim" in node.attr else -1,
            combiner=(node.attr["combiner"].s if "combiner" in node.attr
                      else b"sum").decode(),
            scales=((inputs["scales"][k], tf.float32.as_datatype_enum)
                    if _batched_inputs.has_scales(tf.as_dtype(table_type).name,
                                                  row_format.decode()) else None),
            bag_splits=splits,
            weights=(None if unweighted(editor, inputs["weights"][k])
                     else (inputs["weights"][k], tf.float32.as_datatype_enum)),
            num_bags=num_bags, table_dtype=table_type))
    args = _batched_inputs.layout(features)
    controls = sorted({i for n in nodes for i in n.input[len(_INPUTS):]})
    name = editor.unique_name("tfce_batched_lookup")

    def names_of(key):
        return [tensor for tensor, _ in args[key]]

    def types_of(key):
        return _list_attr([dtype for _, dtype in args[key]], "type")

    def strings(key):
        return _list_attr([v.encode() for v in args[key]], "s")

    editor.add(
        name, BATCHED_OP,
        [t for key in _batched_inputs.INPUT_LISTS for t in names_of(key)]
        + controls,
        Ttables=types_of("tables"),
        table_dtypes=_list_attr(args["table_dtypes"], "type"),
        num_scales=len(args["scales"]),
        Tids=types_of("ids"), Tsplits=types_of("bag_splits"),
        num_weights=len(args["weights"]), Tnum_bags=types_of("num_bags"),
        row_formats=strings("row_formats"), dims=_list_attr(args["dims"], "i"),
        combiners=strings("combiners"), bag_kinds=strings("bag_kinds"),
        bag_counts=strings("bag_counts"),
        weighted=_list_attr(args["weighted"], "b"),
        concat=concat is not None, num_outputs=1 if concat else len(nodes),
        feature_names=_list_attr(
            [feature_names.get(n.input[0], n.name).encode() for n in nodes], "s"))
    outputs = {n.name: f"{name}:{k}" for k, n in enumerate(nodes)}
    for old in names:
        editor.remove(old)
    if concat is not None:
        _take_concatenated(concat[0], names, f"{name}:0")
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


def _concat_of(editor, names, kept):
    """(the ConcatV2 node, `names` in its input order) when the one data use
    of each FusedDecodeAxpy node in `names` is one ConcatV2 along the last
    axis of their [rows, D] outputs, where they are side by side; else
    None. Control uses do not count (they move to the batched node)."""
    if kept & set(names):
        return None
    concat, positions = None, {}
    for name in names:
        uses = [(n, pos) for n, pos in editor.consumers.get(name, ())
                if not n.input[pos].startswith("^")]
        if len(uses) != 1 or uses[0][0].op != "ConcatV2":
            return None
        if concat is not None and uses[0][0] is not concat:
            return None
        concat, positions[name] = uses[0]
    axis = editor.const_value(concat.input[concat.attr["N"].i])
    if axis is None or axis.ndim != 0 or int(axis) not in (1, -1):
        return None
    order = sorted(names, key=positions.get)
    if positions[order[-1]] - positions[order[0]] != len(order) - 1:
        return None
    return concat, order


def _take_concatenated(concat, names, tensor):
    """Replaces the inputs `names` of ConcatV2 node `concat` (side by side)
    by `tensor`, their concatenation; a ConcatV2 left with one value input
    becomes an Identity of it."""
    values = list(concat.input[:concat.attr["N"].i])
    first = min(values.index(v) for v in values if node_name(v) in names)
    values[first:first + len(names)] = [tensor]
    rest = concat.input[concat.attr["N"].i:]  # the axis, then control inputs
    if len(values) == 1:
        concat.op = "Identity"
        for key in ("N", "Tidx"):
            del concat.attr[key]
        rest = rest[1:]
    else:
        concat.attr["N"].i = len(values)
    new_inputs = values + list(rest)
    del concat.input[:]
    concat.input.extend(new_inputs)


def release_table_reads(editor, merged):
    """For a pruned graph: a table read that a batched node made redundant
    (it reads the variable from its handle) may still be kept by control
    edges, since a function's control outputs hold every read. Those edges
    go to the batched node instead, so the next prune drops the read rather
    than it running on every call. `merged`: batch_pooled_lookups' result."""
    resource = tf.resource.as_datatype_enum
    for name, _ in merged:
        node = editor.nodes[name]
        types = node.attr["Ttables"].list.type
        handles = {node_name(t) for t, dtype in zip(node.input[:len(types)], types)
                   if dtype == resource}
        reads = {n.name for n in editor.graph_def.node
                 if n.op == "ReadVariableOp" and node_name(n.input[0]) in handles}
        _move_read_controls(editor, name, reads)
    _dedupe_control_inputs(editor)
    editor._reindex()  # noqa: SLF001 - inputs were rewired in place


def _move_read_controls(editor, batched, reads):
    """Control edges on those `reads` that nothing reads as data go to the
    `batched` node. Edges from the batched node's own ancestors stay
    (moving them would make a cycle)."""
    data_users = {node_name(i) for n in editor.graph_def.node for i in n.input
                  if not i.startswith("^")}
    unused = {r for r in reads if r not in data_users}
    if not unused:
        return
    by_name = {n.name: n for n in editor.graph_def.node}
    ancestors, stack = set(), [batched]
    while stack:
        current = stack.pop()
        if current in ancestors or current not in by_name:
            continue
        ancestors.add(current)
        stack.extend(node_name(i) for i in by_name[current].input)
    for node in editor.graph_def.node:
        if node.name in ancestors:
            continue
        for pos, inp in enumerate(node.input):
            if inp.startswith("^") and inp[1:] in unused:
                node.input[pos] = "^" + batched


def _table_operand(editor, table, dtype):
    """(tensor, dtype enum) the batched node takes for a lookup's `table`:
    the variable's handle when the table is a ReadVariableOp's value (the
    op reads it, and the read node is pruned when nothing else uses it),
    else the table itself. A read ordered after other nodes (control
    inputs) stays, so that the lookup still sees what they wrote."""
    read = editor.node(table)
    if (read.op == "ReadVariableOp" and output_index(table) == 0
            and not any(i.startswith("^") for i in read.input)):
        return read.input[0], tf.resource.as_datatype_enum
    return table, dtype


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

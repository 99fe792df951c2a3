"""Inlining one signature function and rewriting its table lookups.

`analyze` inlines the signature (Grappler's function inliner, as TF-TRT and
tf2onnx do), lifts TF1 ref variables to resource reads, turns lookups of
whole partitioned variables into lookups of one table, and classifies every
use of every rank-2 float variable. `rewrite` then replaces the lookups of the
chosen tables, redirects control edges from the FP32 reads to the new ones,
prunes, and checks that nothing still reads a converted table.
"""
import contextlib
import dataclasses

import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from export_tools.batch_lookups import BATCHED_OP, batch_pooled_lookups, release_table_reads
from export_tools.errors import ExportError, tf_error_message
from export_tools.graph_edit import GraphEditor, infer_shapes, node_name
from export_tools.lookup_emit import Emitter
from export_tools.lookup_patterns import find_uses, match_pooled
from export_tools.partitioned_lookups import merge_partitioned_lookups
from export_tools.source import Capture

_REF_VARIABLE_OPS = ("VariableV2", "Variable")
_GRAPH_TABLE_OPS = ("HashTableV2",)


@dataclasses.dataclass
class SignatureAnalysis:
    key: str
    function: object
    editor: GraphEditor
    specs: dict
    captures: dict        # placeholder -> Capture
    locations: dict       # placeholder -> VariableLocation (captured or lifted variables)
    uses: dict            # placeholder -> TableUses, for rank-2 float variables
    input_names: list     # signature input keys, sorted
    input_specs: list     # tf.TensorSpec per input key
    input_tensors: list   # graph tensor name per input key
    outputs: dict         # output key -> graph tensor name


@dataclasses.dataclass
class RewrittenSignature:
    key: str
    graph_def: object
    input_names: list
    input_specs: list
    input_tensors: list
    outputs: dict
    bindings: dict        # placeholder -> ("table", uid, "data"|"scales") | ("variable", loc)
    #                        | ("external", tensor)
    lookup_counts: dict = dataclasses.field(default_factory=dict)
    #                       table uid -> (row lookups, pooled lookups) left in the graph
    batched: list = dataclasses.field(default_factory=list)
    #                       [(BatchedFusedDecodeAxpy node, features it pools)]


def _inline(function):
    # The private inliner TF-TRT and tf2onnx use; lower_control_flow=False keeps
    # While/If bodies as library functions, where table uses are refused.
    return convert_to_constants._run_inline_graph_optimization(  # noqa: SLF001
        function, lower_control_flow=False, aggressive_inlining=True)


def _lift_ref_variables(editor, source):
    """`VariableV2 X` becomes `ReadVariableOp X(Placeholder X__lifted)`."""
    lifted = {}
    for node in list(editor.graph_def.node):
        if node.op not in _REF_VARIABLE_OPS:
            continue
        name, dtype = node.name, tf.as_dtype(node.attr["dtype"].type)
        editor.remove(name)
        placeholder = editor.add(editor.unique_name(name + "__lifted"), "Placeholder", [],
                                 dtype=tf.resource)
        editor.add(name, "ReadVariableOp", [placeholder], dtype=dtype.base_dtype)
        lifted[placeholder] = source.tf1_location(name)
    # Ref-typed consumers (Identity `x/read`) now see a plain tensor.
    for node in editor.graph_def.node:
        if "T" in node.attr and node.attr["T"].type > 100:  # a ref dtype
            node.attr["T"].type -= 100
    editor._reindex()  # noqa: SLF001 - nodes were replaced in place
    return lifted


@contextlib.contextmanager
def _dangling_collections_hidden(function):
    """Empties, for the duration, the graph collections that name nodes the
    function's graph does not hold. A TF1 signature is a pruned graph that
    keeps the source's collections, and Grappler refuses a graph whose
    `table_initializer` names an init op pruned away ("Init node ... doesn't
    exist in graph"); the tables themselves are lifted by _lift_graph_tables."""
    graph = function.graph
    present = {n.name for n in graph.as_graph_def().node}
    hidden = {}
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        names = [getattr(getattr(i, "op", i), "name", None) for i in items]
        if any(n is not None and n not in present for n in names):
            hidden[key] = list(items)
            del items[:]
    try:
        yield
    finally:
        for key, items in hidden.items():
            graph.get_collection_ref(key).extend(items)


def _lift_graph_tables(editor, source):
    """`HashTableV2 X` in the graph (a TF1 table) becomes a placeholder X
    bound to a table the output owns, filled with the loaded table's
    contents (see SourceModel.graph_table)."""
    lifted = {}
    for node in list(editor.graph_def.node):
        if node.op not in _GRAPH_TABLE_OPS:
            continue
        table = source.graph_table(node.name, node.attr["key_dtype"].type,
                                   node.attr["value_dtype"].type)
        editor.remove(node.name)
        editor.add(node.name, "Placeholder", [], dtype=tf.resource)
        lifted[node.name] = Capture(node.name, table.resource_handle, owner=table)
    return lifted


def analyze(source, key, function):
    """Inlines signature `key` and classifies the uses of its variables."""
    try:
        with _dangling_collections_hidden(function):
            graph_def = _inline(function)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"signature {key!r}: TensorFlow could not inline it: "
                          f"{tf_error_message(e)}") from e
    editor = GraphEditor(graph_def)
    captures = {c.placeholder: c for c in source.captures(key, function)}
    captures.update(_lift_graph_tables(editor, source))
    locations = {p: c.location for p, c in captures.items() if c.location is not None}
    locations.update(_lift_ref_variables(editor, source))
    kwargs = function.structured_input_signature[1]
    names = sorted(kwargs)
    arg_tensors = [t.name for t in function.inputs if t.dtype != tf.resource][:len(names)]
    outputs = dict(zip(sorted(function.structured_outputs), [t.name for t in function.outputs]))
    locations.update(merge_partitioned_lookups(editor, locations,
                                               list(outputs.values()) + arg_tensors))
    specs = infer_shapes(editor.graph_def)
    uses = {}
    for placeholder, loc in locations.items():
        if len(loc.shape) == 2 and loc.dtype.is_floating and placeholder in editor.nodes:
            found = find_uses(editor, placeholder)
            match_pooled(editor, found, specs, loc.shape[1])
            uses[placeholder] = found
    return SignatureAnalysis(key, function, editor, specs, captures, locations, uses,
                             names, [kwargs[n] for n in names], arg_tensors, outputs)


def rewrite(analysis, chosen, formats, ops, batch=True):
    """Rewrites the lookups of the tables in `chosen` (placeholder -> table
    uid), each stored in format `formats[uid]`; with `ops` "fused" and
    `batch`, then merges the pooled lookups that do not depend on one
    another into BatchedFusedDecodeAxpy nodes (batch_lookups.py). Edits
    `analysis.editor`: a signature is rewritten once."""
    editor, emitter = analysis.editor, Emitter(analysis.editor, analysis.specs, ops)
    bindings, reads, table_names = {}, {}, {}
    for placeholder, uid in chosen.items():
        uses = analysis.uses[placeholder]
        table = emitter.add_table(placeholder, formats[uid],
                                  analysis.locations[placeholder].shape[1])
        reads[table.data_read] = uid
        reads[table.data_placeholder] = uid  # what a batched node takes
        table_names[table.data_read] = analysis.locations[placeholder].name
        bindings[table.data_placeholder] = ("table", uid, "data")
        if table.scales_placeholder:
            bindings[table.scales_placeholder] = ("table", uid, "scales")
        for pooled in uses.pooled:
            if ops == "fused":
                emitter.replace_pooled(table, pooled)
            elif node_name(editor.through_identity(
                    editor.nodes[pooled.root].input[0])) in uses.reads:
                emitter.replace_table_operand(table, pooled)
        for gather in uses.gathers:
            emitter.replace_gather(table, gather)
        for name in uses.shape_queries:
            emitter.replace_shape_query(table, name)
        new_reads = emitter.control_inputs(table)
        for old in uses.reads + [g.node for g in uses.gathers]:
            editor.redirect_control(old, new_reads)
    keep = list(analysis.outputs.values()) + analysis.input_tensors
    batched = []
    if ops == "fused" and batch:
        batched = batch_pooled_lookups(editor, keep, table_names, emitter)
    editor.prune(keep)
    if batched:
        release_table_reads(editor, batched)
        editor.prune(keep)
    editor.strip_shape_attrs()
    for placeholder in chosen:
        if placeholder in editor.nodes:
            users = [n.name for n, _ in editor.consumers.get(placeholder, ())]
            raise ExportError(f"signature {analysis.key!r}: table "
                              f"{analysis.locations[placeholder].name!r} is still read by "
                              f"{', '.join(users) or 'the graph'} after the rewrite")
    for node in editor.graph_def.node:
        if node.op != "Placeholder" or node.name in bindings:
            continue
        if node.name in analysis.locations:
            bindings[node.name] = ("variable", analysis.locations[node.name])
        elif node.name in analysis.captures:
            bindings[node.name] = ("external", analysis.captures[node.name])
    return RewrittenSignature(analysis.key, editor.graph_def, analysis.input_names,
                              analysis.input_specs, analysis.input_tensors,
                              analysis.outputs, bindings, _lookup_counts(editor, reads),
                              batched)


def _lookup_counts(editor, reads):
    """{table uid: (row lookups, pooled lookups)} in the pruned graph: the
    nodes that read each table's compressed rows (`reads`: data read ->
    uid). A stock decode counts as a row lookup (its rows GatherV2)."""
    counts = {uid: [0, 0] for uid in reads.values()}
    for node in editor.graph_def.node:
        if node.op == BATCHED_OP:  # its first inputs are its tables
            for table in node.input[:len(node.attr["Ttables"].list.type)]:
                if node_name(table) in reads:
                    counts[reads[node_name(table)]][1] += 1
            continue
        uid = reads.get(node_name(node.input[0])) if node.input else None
        if uid is None:
            continue
        if node.op == "FusedDecodeAxpy":
            counts[uid][1] += 1
        elif node.op in ("CompressedEmbeddingLookup", "GatherV2"):
            counts[uid][0] += 1
    return {uid: tuple(c) for uid, c in counts.items()}

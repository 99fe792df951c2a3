"""The Session path's signature functions, with the tables read by name.

A SavedModel written by `tf.saved_model.save` serves two kinds of loader.
`tf.saved_model.load` builds each signature from the object graph's
functions, whose variables are captured handles. A Session loader (TF
Serving, `saved_model_cli`) runs the MetaGraph's graph instead: each
signature's outer call node takes every variable's handle from a
`VarHandleOp` node and passes it through every nested call to the node that
reads it. Once Grappler has inlined the calls, each table handed to a
`BatchedFusedDecodeAxpy` node costs the executor two nodes per request: its
`VarHandleOp` and the `Identity` the inlined argument becomes.

For the Session path only, `name_tables` points each outer call at copies of
its functions in which the batched nodes name their tables instead (attr
`table_names`: the `VarHandleOp`s' shared names, under which the Session's
restore gave the variables their values), and the handles no node reads any
more are no longer arguments of the copies. The outer `VarHandleOp`s stay for
the restore. The object graph keeps the original functions, so
`tf.saved_model.load` runs exactly what it ran before.
"""
import copy

from tensorflow.core.framework import types_pb2

CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")
BATCHED_OP = "BatchedFusedDecodeAxpy"
COPY_SUFFIX = "_tables_by_name"
# Per-argument attrs of a call node: indices of its inputs.
_INPUT_INDEX_ATTRS = ("_read_only_resource_inputs",)


def name_tables(meta_graph):
    """Rewrites `meta_graph` (a MetaGraphDef) in place as the module says;
    returns how many batched nodes now name their tables."""
    graph = meta_graph.graph_def
    rewriter = _Rewriter(graph.library)
    nodes = {node.name: node for node in graph.node}
    for node in graph.node:
        if node.op not in CALL_OPS:
            continue
        handles = {}
        for index, name in enumerate(_data_inputs(node)):
            source = nodes.get(name.split(":")[0])
            if (source is not None and source.op == "VarHandleOp"
                    and name.split(":")[1:] in ([], ["0"])
                    and not _string_attr(source, "container")):
                # An empty shared_name means the node's name (VarHandleOp's doc).
                handles[index] = _string_attr(source, "shared_name") or source.name
        if handles:
            rewriter.rewrite_call(node, handles)
    return rewriter.named_nodes


class _Rewriter:
    """Makes the copies of the library's functions, once per function and
    set of handle arguments."""

    def __init__(self, library):
        self.library = library
        self.functions = {f.signature.name: f for f in library.function}
        self.copies = {}
        self.named_nodes = 0

    def rewrite_call(self, call, handles):
        """Points `call` (a NodeDef) at the copy of its function for
        `handles` ({input index: shared name}) and drops the inputs the
        copy does not take; returns whether there was a copy to point at."""
        made = self._function_copy(call.attr["f"].func.name, handles)
        if made is None:
            return False
        name, dropped = made
        call.attr["f"].func.name = name
        _drop_inputs(call, dropped)
        return True

    def _function_copy(self, name, handles):
        """(name of the copy, indices of the arguments it dropped), or None
        when no batched node in the function or below names a table."""
        key = (name, tuple(sorted(handles.items())))
        if key in self.copies:
            return self.copies[key]
        self.copies[key] = None  # a call back into the function makes none
        function = self.functions.get(name)
        if function is None:
            return None
        args = [arg.name for arg in function.signature.input_arg]
        named = {args[index]: shared for index, shared in handles.items()}
        new = copy.deepcopy(function)
        changed = False
        for node in new.node_def:
            if node.op == BATCHED_OP:
                if _name_batched_tables(node, named):
                    changed = True
                    self.named_nodes += 1
            elif node.op in CALL_OPS:
                inner = {index: named[arg]
                         for index, arg in enumerate(_data_inputs(node)) if arg in named}
                if inner and self.rewrite_call(node, inner):
                    changed = True
        if not changed:
            return None
        used = _referenced_names(new)
        dropped = sorted(index for index in handles if args[index] not in used)
        _drop_args(new, dropped)
        new.signature.name = self._unused_name(name + COPY_SUFFIX)
        self.library.function.add().CopyFrom(new)
        self.functions[new.signature.name] = new
        self.copies[key] = (new.signature.name, dropped)
        return self.copies[key]

    def _unused_name(self, name):
        candidate, n = name, 1
        while candidate in self.functions:
            candidate, n = f"{name}_{n}", n + 1
        return candidate


def _name_batched_tables(node, named):
    """Gives the batched `node` its tables by name when every table input is
    a handle argument in `named` ({argument: shared name}); returns whether
    it did."""
    if "table_names" in node.attr and node.attr["table_names"].list.s:
        return False
    types = list(node.attr["Ttables"].list.type)
    tables = list(node.input[:len(types)])
    if not types or any(t != types_pb2.DT_RESOURCE for t in types) \
            or any(table not in named for table in tables):
        return False
    node.attr["table_names"].list.s.extend(named[table].encode() for table in tables)
    del node.attr["Ttables"].list.type[:]
    node.attr["Ttables"].list.SetInParent()
    del node.input[:len(types)]
    return True


def _string_attr(node, name):
    """A string attr's value, "" when the node leaves it at its default
    (reading node.attr[name] would add an attr without a value, which
    loaders refuse)."""
    return node.attr[name].s.decode() if name in node.attr else ""


def _data_inputs(node):
    return [name for name in node.input if not name.startswith("^")]


def _referenced_names(function):
    """The names a FunctionDef's nodes and results refer to (the part before
    any ':'): its arguments among them when something still reads them."""
    names = {name.lstrip("^").split(":")[0] for node in function.node_def
             for name in node.input}
    names.update(value.split(":")[0] for value in function.ret.values())
    return names


def _drop_args(function, dropped):
    """Removes the arguments at indices `dropped` and renumbers the attrs
    kept per argument index."""
    if not dropped:
        return
    gone = set(dropped)
    kept = [i for i in range(len(function.signature.input_arg)) if i not in gone]
    args = [function.signature.input_arg[i] for i in kept]
    arg_attr = {new: function.arg_attr[old] for new, old in enumerate(kept)
                if old in function.arg_attr}
    unique_ids = {new: function.resource_arg_unique_id[old]
                  for new, old in enumerate(kept) if old in function.resource_arg_unique_id}
    shapes = function.attr["_input_shapes"].list.shape if "_input_shapes" in function.attr \
        else None
    kept_shapes = [shapes[i] for i in kept] if shapes is not None and \
        len(shapes) == len(gone) + len(kept) else None
    del function.signature.input_arg[:]
    function.signature.input_arg.extend(args)
    function.arg_attr.clear()
    for index, attrs in arg_attr.items():
        function.arg_attr[index].CopyFrom(attrs)
    function.resource_arg_unique_id.clear()
    function.resource_arg_unique_id.update(unique_ids)
    if kept_shapes is not None:
        del shapes[:]
        shapes.extend(kept_shapes)


def _drop_inputs(call, dropped):
    """Removes the call node's data inputs at indices `dropped`, their types
    (Tin) and their entries in attrs that list input indices."""
    if not dropped:
        return
    gone = set(dropped)
    data = _data_inputs(call)
    controls = [name for name in call.input if name.startswith("^")]
    types = list(call.attr["Tin"].list.type)
    del call.input[:]
    call.input.extend([name for i, name in enumerate(data) if i not in gone] + controls)
    del call.attr["Tin"].list.type[:]
    call.attr["Tin"].list.type.extend(t for i, t in enumerate(types) if i not in gone)
    for attr in _INPUT_INDEX_ATTRS:
        if attr in call.attr:
            indices = list(call.attr[attr].list.i)
            del call.attr[attr].list.i[:]
            call.attr[attr].list.i.extend(i - sum(g < i for g in gone)
                                          for i in indices if i not in gone)

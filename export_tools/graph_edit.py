"""A small editor for one flat (inlined) GraphDef: node lookup, consumers,
adding nodes, replacing a node under its own name, pruning."""
import collections

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from export_tools.errors import ExportError

_SHAPE_ATTRS = ("_output_shapes", "_input_shapes")
CONTROL_FLOW_OPS = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall"})


def node_name(tensor_name):
    """'^a', 'a:1', 'a' -> 'a'."""
    return tensor_name.lstrip("^").split(":")[0]


def output_index(tensor_name):
    parts = tensor_name.split(":")
    return int(parts[1]) if len(parts) > 1 else 0


def attr(value):
    """An AttrValue from a python value or tf.DType."""
    if isinstance(value, tf.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, (str, bytes)):
        return attr_value_pb2.AttrValue(s=value.encode() if isinstance(value, str) else value)
    raise TypeError(f"no AttrValue for {value!r}")


class GraphEditor:
    """Edits `graph_def` in place."""

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self._reindex()

    def _reindex(self):
        self.nodes = {n.name: n for n in self.graph_def.node}
        self.consumers = collections.defaultdict(list)  # name -> [(node, input position)]
        for n in self.graph_def.node:
            for pos, inp in enumerate(n.input):
                self.consumers[node_name(inp)].append((n, pos))

    def node(self, tensor_name):
        return self.nodes[node_name(tensor_name)]

    def through_identity(self, tensor_name):
        """The tensor name after following Identity nodes upwards."""
        while True:
            n = self.node(tensor_name)
            if n.op not in ("Identity", "Snapshot"):
                return tensor_name
            tensor_name = n.input[0]

    def data_consumers(self, name):
        """[(node, position)] reading a data output of node `name`, looking
        through Identity nodes (which are returned too, as ('Identity', ...))."""
        found = []
        for n, pos in self.consumers.get(name, ()):
            if n.input[pos].startswith("^"):
                continue
            if n.op in ("Identity", "Snapshot"):
                found.extend(self.data_consumers(n.name))
            else:
                found.append((n, pos))
        return found

    def const_value(self, tensor_name):
        """The numpy value of a Const (through Identity), or None."""
        n = self.node(self.through_identity(tensor_name))
        if n.op != "Const":
            return None
        return tf.make_ndarray(n.attr["value"].tensor)

    def unique_name(self, base):
        name, i = base, 0
        while name in self.nodes:
            i += 1
            name = f"{base}_{i}"
        return name

    def add(self, name, op, inputs, **attrs):
        """Adds a node named `name` as it is (see `unique_name`) with its
        attributes given as values or AttrValues; returns its name."""
        node = node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value if isinstance(value, attr_value_pb2.AttrValue)
                                    else attr(value))
        self.graph_def.node.append(node)
        self.nodes[name] = node
        for pos, inp in enumerate(node.input):
            self.consumers[node_name(inp)].append((node, pos))
        return name

    def add_const(self, base, value, dtype):
        name = self.unique_name(base)
        tensor = tf.make_tensor_proto(np.asarray(value, dtype.as_numpy_dtype), dtype)
        node = node_def_pb2.NodeDef(name=name, op="Const")
        node.attr["dtype"].CopyFrom(attr(dtype))
        node.attr["value"].CopyFrom(attr_value_pb2.AttrValue(tensor=tensor))
        self.graph_def.node.append(node)
        self.nodes[name] = node
        return name

    def remove(self, name):
        """Removes node `name` (its consumers must be rewired or replaced)."""
        node = self.nodes.pop(name)
        self.graph_def.node.remove(node)

    def redirect_control(self, old, new_names):
        """Every '^old' control input becomes '^n' for each n in `new_names`."""
        for n, _ in list(self.consumers.get(old, ())):
            if "^" + old not in n.input:
                continue
            kept = [i for i in n.input if i != "^" + old]
            kept += ["^" + x for x in new_names if "^" + x not in kept and x != n.name]
            del n.input[:]
            n.input.extend(kept)
        self._reindex()

    def prune(self, keep):
        """Removes every node that `keep` does not reach by data or control edges."""
        live, stack = set(), [node_name(k) for k in keep]
        while stack:
            name = stack.pop()
            if name in live:
                continue
            if name not in self.nodes:
                raise ExportError(f"internal: the rewritten graph lost node {name!r}")
            live.add(name)
            stack.extend(node_name(i) for i in self.nodes[name].input)
        dead = [i for i, n in enumerate(self.graph_def.node) if n.name not in live]
        for i in reversed(dead):
            del self.graph_def.node[i]
        self._reindex()

    def strip_shape_attrs(self):
        """Drops recorded shapes (stale after a rewrite; the importer re-infers)."""
        for n in self.graph_def.node:
            for key in _SHAPE_ATTRS:
                if key in n.attr:
                    del n.attr[key]


def infer_shapes(graph_def):
    """{node name: [(TensorShape, DType) per output]}, from importing the graph
    into a scratch graph (TF's shape inference).

    A table lookup's shape comes from its table's handle, which a captured
    placeholder does not carry, so TF leaves it unknown (and everything
    downstream: a `StringLookup` -> `Embedding` bag loses its rank). A
    lookup with a scalar default value is a table of scalars, whose result
    has its keys' shape; those are imported a second time as shape-keeping
    casts so that their shapes propagate."""
    specs = _imported_specs(graph_def)
    scalar_finds = [n.name for n in graph_def.node if n.op in _TABLE_FIND_OPS
                    and known_rank(specs, n.input[2]) == 0]
    if not scalar_finds:
        return specs
    scratch = graph_pb2.GraphDef()
    scratch.CopyFrom(graph_def)
    for node in scratch.node:
        if node.name in scalar_finds:
            keys, tin, tout = node.input[1], node.attr["Tin"].type, node.attr["Tout"].type
            node.op = "Cast"
            del node.input[:]
            node.input.append(keys)
            node.attr.clear()
            node.attr["SrcT"].type, node.attr["DstT"].type = tin, tout
    found = _imported_specs(scratch)
    for name in scalar_finds:  # the dtype of the real op's output
        found[name] = [(found[name][0][0], specs[name][0][1])]
    return found


_TABLE_FIND_OPS = ("LookupTableFindV2",)


def known_rank(specs, tensor):
    """The rank of `tensor` in `specs` ({node: [(TensorShape or None,
    dtype)]}), or None when unknown."""
    outputs = specs.get(node_name(tensor))
    if not outputs or output_index(tensor) >= len(outputs):
        return None
    shape = outputs[output_index(tensor)][0]
    return None if shape is None else shape.rank


def _imported_specs(graph_def):
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
    return {op.name: [(t.shape, t.dtype) for t in op.outputs]
            for op in graph.get_operations()}

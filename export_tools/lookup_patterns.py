"""Finding the lookups of a table in an inlined signature graph.

A table is a resource placeholder of the inlined graph. Its uses are:
- gathers: `ResourceGather(T, ids)` or `GatherV2(ReadVariableOp(T), ids, axis=0)`;
- shape queries: `Shape`/`VariableShape` of the table (Keras wraps negative ids with it);
- pooled lookups built on a gather, replaced whole by `FusedDecodeAxpy`:
  `SparseSegment{Sum,Mean,SqrtN}[WithNumSegments]` (unweighted
  `embedding_lookup_sparse`, also straight on the read), the weighted
  `SegmentSum(rows * w)` chain with its `DivNoNan` for mean and sqrtn, and
  dense bags `Mean`/`Sum` over axis 1 of a `[B, L, D]` gather, optionally
  weighted by a `[B, L, 1]` factor (or that factor tiled to `[B, L, D]`, as
  DeepCTR's SequencePoolingLayer does with its mask) or masked by a
  `[B, L, 1]` `SelectV2` (Keras' masked pooling).
Anything else is an unsupported use, reported with the node at fault.
"""
import dataclasses

import numpy as np

from export_tools.graph_edit import CONTROL_FLOW_OPS, known_rank, node_name, output_index

_SPARSE_SEGMENT = {
    "SparseSegmentSum": "sum", "SparseSegmentMean": "mean", "SparseSegmentSqrtN": "sqrtn",
    "SparseSegmentSumWithNumSegments": "sum", "SparseSegmentMeanWithNumSegments": "mean",
    "SparseSegmentSqrtNWithNumSegments": "sqrtn",
}
_SHAPE_OPS = ("Shape", "Size", "Rank")


@dataclasses.dataclass
class Gather:
    """`node` gathers rows `ids` of the table."""
    node: str
    ids: str


@dataclasses.dataclass
class Pooled:
    """`root` computes a pooled lookup: out[s] = combine(Σ_{seg[i]=s} w[i] table[ids[i]]).

    `ids` is the id tensor, or `(rows_ids, indices)` meaning ids = rows_ids[indices].
    `segment_ids` None marks a dense bag: `ids` is `[B, L]` and bag b is row b.
    """
    root: str
    ids: object
    combiner: str
    segment_ids: str = None
    weights: str = None        # a tensor reshaped to [N]; None = unweighted
    num_segments: str = None   # None = max(segment_ids) + 1 (or B for dense bags)
    dense_weights_3d: bool = False


@dataclasses.dataclass
class TableUses:
    """Everything one signature graph does with one table placeholder."""
    placeholder: str
    reads: list = dataclasses.field(default_factory=list)
    gathers: list = dataclasses.field(default_factory=list)
    shape_queries: list = dataclasses.field(default_factory=list)
    pooled: list = dataclasses.field(default_factory=list)
    # (node name, op, reason) of each use that is not a lookup
    unsupported: list = dataclasses.field(default_factory=list)
    control_flow: list = dataclasses.field(default_factory=list)


def _gather_problem(editor, node, axis_input):
    if node.attr["batch_dims"].i != 0:
        return f"batch_dims={node.attr['batch_dims'].i}"
    if axis_input is not None:
        axis = editor.const_value(axis_input)
        if axis is None or int(axis) != 0:
            return f"axis={'non-constant' if axis is None else int(axis)}"
    return None


def find_uses(editor, placeholder):
    """Classifies every consumer of the table `placeholder` (through Identity)."""
    uses = TableUses(placeholder)
    for node, pos in editor.data_consumers(placeholder):
        if node.op == "ReadVariableOp":
            uses.reads.append(node.name)
            _classify_read(editor, node, uses)
        elif node.op == "ResourceGather" and pos == 0:
            problem = _gather_problem(editor, node, None)
            if problem:
                uses.unsupported.append((node.name, node.op, problem))
            else:
                uses.gathers.append(Gather(node.name, node.input[1]))
        elif node.op == "VariableShape":
            uses.shape_queries.append(node.name)
        elif node.op in CONTROL_FLOW_OPS:
            uses.control_flow.append((node.name, node.op))
        else:
            uses.unsupported.append((node.name, node.op, "not a lookup"))
    return uses


def _classify_read(editor, read, uses):
    for node, pos in editor.data_consumers(read.name):
        if node.op == "GatherV2" and pos == 0:
            problem = _gather_problem(editor, node, node.input[2])
            if problem:
                uses.unsupported.append((node.name, node.op, problem))
            else:
                uses.gathers.append(Gather(node.name, node.input[1]))
        elif node.op in _SPARSE_SEGMENT and pos == 0:
            # TF's fast path: SparseSegment* straight on the table.
            uses.pooled.append(Pooled(
                node.name, node.input[1], _SPARSE_SEGMENT[node.op],
                segment_ids=node.input[2],
                num_segments=node.input[3] if len(node.input) > 3 else None))
        elif node.op in _SHAPE_OPS:
            uses.shape_queries.append(node.name)
        elif node.op in CONTROL_FLOW_OPS:
            uses.control_flow.append((node.name, node.op))
        else:
            uses.unsupported.append((node.name, node.op, "not a lookup"))


def _rows_ids(editor, gather_ids, indices):
    """ids for rows `gather(table, gather_ids)[indices]`; the Unique round trip
    (`Unique(x)` -> gather(:0) -> [:1]) collapses to `x`."""
    if indices is None:
        return gather_ids
    unique_out = editor.through_identity(gather_ids)
    unique_idx = editor.through_identity(indices)
    unique = editor.node(unique_out)
    if (unique.op == "Unique" and node_name(unique_idx) == unique.name
            and output_index(unique_out) == 0 and output_index(unique_idx) == 1):
        return unique.input[0]
    return (gather_ids, indices)


def _single_consumer(editor, name, ops):
    found = editor.data_consumers(name)
    if len(found) == 1 and found[0][0].op in ops:
        return found[0]
    return None, None


def _is_const(editor, tensor, values):
    value = editor.const_value(tensor)
    return value is not None and value.size == 1 and float(value.reshape(())) in values


def match_pooled(editor, uses, specs, dim):
    """Adds to `uses.pooled` the pooled lookups built on `uses.gathers` of a
    table of `dim` columns.

    `specs` maps node name -> [(TensorShape, DType)] of its outputs.
    """
    roots = {p.root for p in uses.pooled}

    def add(pooled):
        if pooled.root not in roots:
            roots.add(pooled.root)
            uses.pooled.append(pooled)

    for gather in uses.gathers:
        for node, pos in editor.data_consumers(gather.node):
            if pos != 0:
                continue
            if node.op in _SPARSE_SEGMENT:
                add(Pooled(node.name, _rows_ids(editor, gather.ids, node.input[1]),
                           _SPARSE_SEGMENT[node.op], segment_ids=node.input[2],
                           num_segments=node.input[3] if len(node.input) > 3 else None))
            elif node.op == "GatherV2" and _is_const(editor, node.input[2], (0,)) \
                    and node.attr["batch_dims"].i == 0:
                _match_weighted(editor, node.name,
                                _rows_ids(editor, gather.ids, node.input[1]), add)
            elif node.op == "Mul":
                _match_weighted(editor, gather.node, gather.ids, add, mul=(node, pos))
                _match_dense_weighted(editor, gather, node, pos, specs, dim, add)
            elif node.op in ("Mean", "Sum"):
                _match_dense(editor, gather, node, specs, add)
        for node, pos in editor.data_consumers(gather.node):
            if node.op == "SelectV2" and pos == 1:
                _match_dense_masked(editor, gather, node, specs, add)


def _match_weighted(editor, rows, ids, add, mul=None):
    """rows * Reshape(w) -> SegmentSum [-> DivNoNan by SegmentSum(w) or its sqrt]."""
    if mul is None:
        found = [(n, p) for n, p in editor.data_consumers(rows) if n.op == "Mul"]
        if len(found) != 1:
            return
        mul = found[0]
    mul_node, pos = mul
    scaled = editor.node(mul_node.input[1 - pos])
    if scaled.op != "Reshape":
        return
    seg_sum, _ = _single_consumer(editor, mul_node.name, ("SegmentSum",))
    if seg_sum is None or node_name(seg_sum.input[0]) != mul_node.name:
        return
    segment_ids, weights = seg_sum.input[1], scaled.input[0]
    div, dpos = _single_consumer(editor, seg_sum.name, ("DivNoNan",))
    if div is not None and dpos == 0:
        combiner = _denominator_combiner(editor, div.input[1], scaled.name, segment_ids)
        if combiner:
            add(Pooled(div.name, ids, combiner, segment_ids=segment_ids, weights=weights))
            return
    add(Pooled(seg_sum.name, ids, "sum", segment_ids=segment_ids, weights=weights))


def _denominator_combiner(editor, denominator, scaled, segment_ids):
    den = editor.node(editor.through_identity(denominator))
    if den.op == "Sqrt":
        inner = editor.node(editor.through_identity(den.input[0]))
        if inner.op != "SegmentSum" or inner.input[1] != segment_ids:
            return None
        power = editor.node(editor.through_identity(inner.input[0]))
        if (power.op == "Pow" and node_name(power.input[0]) == scaled
                and _is_const(editor, power.input[1], (2,))):
            return "sqrtn"
        return None
    if (den.op == "SegmentSum" and node_name(den.input[0]) == scaled
            and den.input[1] == segment_ids):
        return "mean"
    return None


def _reduces_bag_axis(editor, node, specs, gather):
    # The gathered rows are [B, L, D] when the ids are [B, L] (the gather's own
    # shape is unknown: resource placeholders carry no shape).
    if known_rank(specs, gather.ids) != 2 or node.attr["keep_dims"].b:
        return False
    return _is_const(editor, node.input[1], (1, -2))


def _match_dense(editor, gather, reduce_node, specs, add):
    if _reduces_bag_axis(editor, reduce_node, specs, gather):
        add(Pooled(reduce_node.name, gather.ids,
                   "mean" if reduce_node.op == "Mean" else "sum"))


def _is_bag_factor(specs, tensor):
    """A `[B, L, 1]` tensor: one factor per id of a `[B, L]` bag."""
    shape = specs.get(node_name(tensor), [(None, None)] * (output_index(tensor) + 1))[
        output_index(tensor)][0]
    return shape is not None and shape.rank == 3 and shape[2] == 1


def _bag_factor(editor, specs, tensor, dim):
    """`tensor` as a `[B, L, 1]` factor of a `[B, L]` bag's rows, seeing
    through a Tile of it to `[B, L, dim]` (the same product); else None."""
    if _is_bag_factor(specs, tensor):
        return tensor
    tile = editor.node(editor.through_identity(tensor))
    if tile.op != "Tile":
        return None
    multiples = editor.const_value(tile.input[1])
    if (multiples is None or list(multiples.reshape(-1)) not in ([1, 1, dim], [1, 1, 1])
            or not _is_bag_factor(specs, tile.input[0])):
        return None
    return tile.input[0]


def _match_dense_weighted(editor, gather, mul, pos, specs, dim, add):
    factor = _bag_factor(editor, specs, mul.input[1 - pos], dim)
    if factor is None:
        return
    reduce_node, _ = _single_consumer(editor, mul.name, ("Sum",))
    if reduce_node is not None and _reduces_bag_axis(editor, reduce_node, specs, gather):
        add(Pooled(reduce_node.name, gather.ids, "sum", weights=factor,
                   dense_weights_3d=True))


def _match_dense_masked(editor, gather, select, specs, add):
    """Keras' masked pooling: Sum(SelectV2(mask [B, L, 1], rows, 0), axis=1) is
    a weighted sum with weights cast(mask)."""
    zero = editor.const_value(select.input[2])
    if zero is None or np.any(zero != 0) or not _is_bag_factor(specs, select.input[0]):
        return
    reduce_node, _ = _single_consumer(editor, select.name, ("Sum",))
    if reduce_node is not None and _reduces_bag_axis(editor, reduce_node, specs, gather):
        add(Pooled(reduce_node.name, gather.ids, "sum", weights=select.input[0],
                   dense_weights_3d=True))

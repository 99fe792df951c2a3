"""BatchedFusedDecodeAxpy's input layout, defined once.

A feature of the batched op has only the inputs it needs, since every input
is an edge TensorFlow's executor pays on every call: scales if its table is
'plain' int8, bag splits if its bags are 'segment_ids' or 'row_splits',
weights if it is weighted, num_bags if its row count is given rather than
counted by the op. Each of the op's input lists holds those inputs in
feature order, and attrs say which feature has which. A table may be a
resource variable's handle, which the op reads itself: no ReadVariableOp
(nor, in a tf.function, DisableCopyOnRead) node per table and call.

:func:`layout` turns one :class:`Feature` per feature into the op's
arguments; :func:`features_of` reads them back from a node. The Python
wrapper, the export tool (whose values are tensor names), the gradient and
the tests all go through these two.
"""
import dataclasses

import tensorflow as tf

# bag_counts: the row count is the feature's num_bags input, the rows of its
# bag structure, or the last row holding an id + 1 (what SparseSegment* ops
# without num_segments, and so tf.nn.embedding_lookup_sparse, give).
GIVEN = "given"
ROWS_OF_BAGS = "rows_of_bags"
ROWS_WITH_IDS = "rows_with_ids"
# The bag kinds whose bags come in a bag_splits input.
SPLIT_KINDS = ("segment_ids", "row_splits")

# The op's argument names that hold inputs, in order, and the per-feature
# attrs layout() fills.
INPUT_LISTS = ("tables", "scales", "ids", "bag_splits", "weights", "num_bags")
FEATURE_ATTRS = ("row_formats", "dims", "combiners", "bag_kinds",
                 "bag_counts", "weighted")


@dataclasses.dataclass
class Feature:
    """One feature of a batched call. Values are what the caller lays out:
    tensors, or the export tool's tensor names.

    table: a tensor, or a resource variable's handle (then table_dtype is
      its dtype). scales: None for a table that has none (every table but a
      'plain' int8 one). bag_splits: segment ids or row splits; None for 'dense' and
      'padded' bags. weights: None when unweighted. num_bags: the row
      count, or ROWS_OF_BAGS / ROWS_WITH_IDS for the op to count them.
    """
    table: object
    ids: object
    bag_kind: str
    row_format: str = "plain"
    dim: int = -1
    combiner: str = "sum"
    scales: object = None
    bag_splits: object = None
    weights: object = None
    num_bags: object = ROWS_OF_BAGS
    table_dtype: object = None


def bag_count(num_bags):
    """The bag_counts attr value of a Feature's num_bags."""
    if isinstance(num_bags, str) and num_bags in (ROWS_OF_BAGS, ROWS_WITH_IDS):
        return num_bags
    return GIVEN


def layout(features):
    """The op's input lists and per-feature attrs for `features`, as a dict
    of its argument names (the caller adds concat, num_outputs and
    feature_names). A Feature whose bag_splits does not fit its bag kind is
    laid out as given: the op names the mismatch. table_dtypes is set when
    any feature has a table_dtype, and then every feature must have one."""
    features = list(features)
    args = {key: [] for key in INPUT_LISTS + FEATURE_ATTRS}
    given_dtypes = [f.table_dtype is not None for f in features]
    if any(given_dtypes):
        if not all(given_dtypes):
            raise ValueError("table_dtype must be given for every feature or "
                             "for none")
        args["table_dtypes"] = [f.table_dtype for f in features]
    for f in features:
        args["tables"].append(f.table)
        if f.scales is not None:
            args["scales"].append(f.scales)
        args["ids"].append(f.ids)
        if f.bag_splits is not None:
            args["bag_splits"].append(f.bag_splits)
        args["weighted"].append(f.weights is not None)
        if f.weights is not None:
            args["weights"].append(f.weights)
        count = bag_count(f.num_bags)
        args["bag_counts"].append(count)
        if count == GIVEN:
            args["num_bags"].append(f.num_bags)
        args["row_formats"].append(f.row_format)
        args["dims"].append(f.dim)
        args["combiners"].append(f.combiner)
        args["bag_kinds"].append(f.bag_kind)
    return args


def has_scales(dtype, row_format):
    """Whether a table of this dtype and row_format has a scales input."""
    return row_format == "plain" and dtype == "int8"


def features_of(op):
    """The Features of a BatchedFusedDecodeAxpy `tf.Operation` (its input
    tensors; attrs as str). A table the op names (attr table_names) is a
    new handle to the variable of that name."""
    names = [name.decode() for name in op.get_attr("table_names")]
    n = len(names) or len(op.get_attr("Ttables"))
    sizes = {"tables": 0 if names else n, "scales": op.get_attr("num_scales"), "ids": n,
             "bag_splits": len(op.get_attr("Tsplits")),
             "weights": op.get_attr("num_weights"),
             "num_bags": len(op.get_attr("Tnum_bags"))}
    lists, start = {}, 0
    for key in INPUT_LISTS:
        lists[key] = iter(op.inputs[start:start + sizes[key]])
        start += sizes[key]

    def strings(attr):
        return [s.decode() for s in op.get_attr(attr)]

    dtypes = [t.name for t in op.get_attr("table_dtypes") or op.get_attr("Ttables")]
    handles = [t == tf.resource for t in op.get_attr("Ttables")]
    if names:
        handles = [True] * n
        lists["tables"] = iter([tf.raw_ops.VarHandleOp(
            dtype=tf.as_dtype(dtypes[f]), shape=tf.TensorShape(None),
            shared_name=names[f]) for f in range(n)])
    row_formats, kinds = strings("row_formats"), strings("bag_kinds")
    counts, weighted = strings("bag_counts"), op.get_attr("weighted")
    features = []
    for f, (dim, combiner) in enumerate(zip(op.get_attr("dims"),
                                            strings("combiners"))):
        features.append(Feature(
            table=next(lists["tables"]), ids=next(lists["ids"]),
            bag_kind=kinds[f], row_format=row_formats[f], dim=dim,
            combiner=combiner,
            scales=(next(lists["scales"])
                    if has_scales(dtypes[f], row_formats[f]) else None),
            bag_splits=(next(lists["bag_splits"]) if kinds[f] in SPLIT_KINDS
                        else None),
            weights=next(lists["weights"]) if weighted[f] else None,
            num_bags=(next(lists["num_bags"]) if counts[f] == GIVEN
                      else counts[f]),
            table_dtype=tf.as_dtype(dtypes[f]) if handles[f] else None))
    return features


def read_table(feature):
    """The feature's table as a tensor: a handle read as the op reads it
    (copy-on-read mode off, no whole-table copy)."""
    if feature.table_dtype is None:
        return feature.table
    with tf.control_dependencies([tf.raw_ops.DisableCopyOnRead(resource=feature.table)]):
        return tf.raw_ops.ReadVariableOp(resource=feature.table,
                                         dtype=feature.table_dtype)


def table_width(feature):
    """The feature's table's second dimension, without reading a handle."""
    if feature.table_dtype is None:
        return tf.shape(feature.table)[1]
    return tf.raw_ops.VariableShape(input=feature.table)[1]


def register_table_reads():
    """Tells tf.function's automatic control dependencies that the batched
    op only reads the variables whose handles it takes, as ReadVariableOp
    does, so calls that read the same tables are not chained one after
    another (docs/compatibility.md lists this private API)."""
    from tensorflow.python.framework import auto_control_deps_utils
    auto_control_deps_utils.register_read_only_resource_op("BatchedFusedDecodeAxpy")

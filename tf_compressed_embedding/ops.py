"""Thin wrappers over the ops, and tf.nn-style sparse lookups (one table,
or many in one batched call)."""
from __future__ import annotations

import collections

import tensorflow as tf

from tf_compressed_embedding import _bags, _batched_inputs, _loader, quantization

# The op module, fetched by the wrappers while tf.functions trace them:
# autograph must not convert the loader's locking.
_op_library = tf.autograph.experimental.do_not_convert(_loader.ops)


def _read(value):
    """Reads a variable without a copy, even in copy-on-read mode.

    A dense read of a variable that a sparse op (tf.gather, a scatter) has
    touched copies the whole table on every call; read_value_no_copy() is
    how TF's own embedding_lookup_sparse avoids that. Tensors pass through.
    """
    no_copy = getattr(value, "read_value_no_copy", None)
    return no_copy() if no_copy is not None else value


def _variable_handle(value):
    """The handle of a resource variable, else None (then the table is
    read as a tensor: e.g. a distributed variable outside a replica)."""
    if not isinstance(value, tf.Variable):
        return None
    try:
        handle = value.handle
    except (AttributeError, ValueError):
        return None
    return handle if handle.dtype == tf.resource else None


def _table_inputs(table, handles=False):
    """The op inputs and attrs of a CompressedTable, or of any object with
    .data and .scales (and .format and .dim for the rowwise formats):
    {"table": ..., "scales": ..., "row_format": ..., "dim": ...}. With
    `handles`, a table held in a resource variable is its handle, for the
    batched op, which reads it itself, and "table_dtype" says its dtype."""
    try:
        data, scales = table.data, table.scales
    except AttributeError:
        raise TypeError(
            f"table must be a CompressedTable (from tfce.quantize) or have "
            f".data and .scales, got {type(table).__name__}") from None
    fmt = getattr(table, "format", None)
    if fmt is None and tf.as_dtype(data.dtype) == tf.uint8:
        raise TypeError(
            f"a table of uint8 records must say its format and dim (.format, "
            f".dim), as a CompressedTable does; {type(table).__name__} has no "
            f".format")
    handle = _variable_handle(data) if handles else None
    if handle is None:
        inputs = {"table": _read(data)}
    else:
        inputs = {"table": handle, "table_dtype": tf.as_dtype(data.dtype)}
    if fmt in quantization.ROWWISE_FORMATS:
        inputs.update(row_format=quantization.op_row_format(fmt), dim=int(table.dim))
    if _is_empty_float32(scales):
        # Empty scales (every format but int8_split): a constant, as the
        # exported models have, instead of three read nodes in every call.
        inputs["scales"] = tf.zeros([0], tf.float32)
    else:
        inputs["scales"] = _read(scales)
    return inputs


def _is_empty_float32(value):
    """Whether `value` (a variable, tensor, array...) is float32 [0]."""
    try:
        shape = tf.TensorShape(getattr(value, "shape", None))
        dtype = tf.as_dtype(getattr(value, "dtype", None))
    except (TypeError, ValueError):
        return False
    return shape.rank == 1 and shape[0] == 0 and dtype == tf.float32


def _with_max_threads(tensor, max_threads):
    """Caps the threads one call of the op producing `tensor` uses.

    Sets the node attribute ``_tfce_max_threads`` (0: all intra-op threads)
    that both ops read when their kernel is built; attributes whose names
    start with "_" are no part of an op's signature. Graph mode only (inside
    a tf.function). For benchmarks and tests: benchmarks/op_bench_tf.py times
    1 and 2 threads in one process with it.
    """
    from tensorflow.core.framework import attr_value_pb2
    tensor.op._set_attr("_tfce_max_threads",  # noqa: SLF001
                        attr_value_pb2.AttrValue(i=int(max_threads)))
    return tensor


def compressed_embedding_lookup(table, ids, max_norm: float | None = None,
                                name: str | None = None):
    """Gathers rows of a compressed table and decodes them to float32.

    A drop-in for ``tf.nn.embedding_lookup(params, ids, max_norm, name)``.

    Args:
      table: a :class:`CompressedTable`.
      ids: int32 or int64 ids of any shape, each in ``[0, V)``, or a
        ``tf.RaggedTensor`` of them (the result is ragged, as TF's).
      max_norm: if not None, each decoded row whose L2 norm is larger is
        scaled down to this norm (``tf.clip_by_norm``, as TF does).
      name: optional op name.

    Returns:
      float32 tensor of shape ``ids.shape + [D]`` (ragged for ragged ids).

    Raises:
      tf.errors.InvalidArgumentError: an id outside ``[0, V)``.
    """
    if isinstance(ids, tf.RaggedTensor):
        return tf.ragged.map_flat_values(
            lambda flat: compressed_embedding_lookup(table, flat, max_norm,
                                                     name), ids)
    rows = _op_library().compressed_embedding_lookup(
        **_table_inputs(table), ids=ids, name=name)
    if max_norm is not None:
        rows = tf.clip_by_norm(rows, max_norm, axes=[-1])
    return rows


def fused_decode_axpy(table, ids, segment_ids, weights=None, combiner: str = "sum",
                      num_segments=None, name=None):
    """Decodes and pools rows per segment in one pass.

    ``out[s] = sum_{i: segment_ids[i] == s} weights[i] * decode(table[ids[i]])``,
    divided by ``sum(weights)`` for ``"mean"`` and ``sqrt(sum(weights**2))``
    for ``"sqrtn"``; an empty segment or a zero denominator gives zeros.

    Args:
      table: a :class:`CompressedTable`.
      ids: int32/int64 ``[N]``.
      segment_ids: int32/int64 ``[N]``, sorted, in ``[0, num_segments)``.
      weights: optional float ``[N]``; None means all ones.
      combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``.
      num_segments: number of output rows; defaults to
        ``segment_ids[-1] + 1`` (0 when there are no ids).
      name: optional op name.

    Returns:
      float32 ``[num_segments, D]``.
    """
    _bags.check_combiner(combiner)
    table_inputs = _table_inputs(table)
    segment_ids = tf.convert_to_tensor(segment_ids)
    if weights is None:
        weights = tf.zeros([0], tf.float32)
    else:
        weights = _bags.float_weights(weights)
    if num_segments is None:
        num_segments = tf.maximum(
            tf.reduce_max(tf.cast(segment_ids, tf.int64)) + 1, 0)
    return _op_library().fused_decode_axpy(
        **table_inputs, ids=ids, segment_ids=segment_ids,
        weights=weights, num_segments=num_segments, combiner=combiner,
        name=name)


def _bags_of(sp_ids, sp_weights):
    """The bags of 2-D sparse or ragged ids (and their weights)."""
    names = ("sp_ids", "sp_weights")
    if isinstance(sp_ids, tf.RaggedTensor):
        return _bags.from_ragged(sp_ids, sp_weights, names=names)
    if isinstance(sp_ids, tf.SparseTensor):
        return _bags.from_sparse(sp_ids, sp_weights, names=names)
    raise TypeError(f"sp_ids must be a SparseTensor or RaggedTensor, got "
                    f"{type(sp_ids).__name__}")


def _row_major(sparse_ids, sparse_weights):
    """Both SparseTensors with their entries in row-major order (the same
    permutation for both, as they share indices)."""
    positions = tf.sparse.reorder(tf.SparseTensor(
        sparse_ids.indices, tf.range(tf.shape(sparse_ids.values)[0]),
        sparse_ids.dense_shape))
    order = positions.values
    sparse_ids = tf.SparseTensor(positions.indices,
                                 tf.gather(sparse_ids.values, order),
                                 sparse_ids.dense_shape)
    if sparse_weights is not None:
        sparse_weights = tf.SparseTensor(
            positions.indices, tf.gather(sparse_weights.values, order),
            sparse_ids.dense_shape)
    return sparse_ids, sparse_weights


def _pooling_combiner(combiner, max_norm):
    """The combiner of a tf.nn-style sparse lookup (None means "mean", as in
    TF), checked; ``max_norm`` refused."""
    combiner = _bags.check_combiner("mean" if combiner is None else combiner)
    if max_norm is not None:
        raise ValueError(
            "max_norm is not supported when pooling a compressed table (the "
            "rows are pooled as they are decoded, never materialized): clip "
            "the float32 table's rows to that norm before quantizing it "
            "(tf.clip_by_norm(table, max_norm, axes=[1])), which gives the "
            "same result up to quantization error, and pass max_norm=None")
    return combiner


def embedding_lookup_sparse(table, sp_ids, sp_weights=None, combiner="mean",
                            max_norm=None, name=None, allow_fast_lookup=False):
    """Drop-in for ``tf.nn.embedding_lookup_sparse`` on a compressed table.

    Pooling is fused with decoding (``FusedDecodeAxpy``). As in TF, for a
    ``SparseTensor`` the output has ``max(row index) + 1`` rows; for a
    ``RaggedTensor`` it has one row per ragged row.

    Args:
      table: a :class:`CompressedTable`.
      sp_ids: ``SparseTensor`` ``[batch, ?]`` of int ids (rows in order), or
        ``RaggedTensor`` ``[batch, (ids)]``.
      sp_weights: None, or weights with the same structure as ``sp_ids``.
      combiner: ``"mean"`` (default, as TF), ``"sqrtn"`` or ``"sum"``.
      max_norm: must be None (not supported: see the error's advice).
      name: optional name scope.
      allow_fast_lookup: accepted for TF's signature; no effect (the lookup
        is always the fused one, and the table gets no gradient).

    Returns:
      float32 ``[rows, D]``.

    Raises:
      ValueError: an unknown combiner, ``max_norm``, or weights whose shape
        cannot match the ids' (when known while the graph is built).
    """
    del allow_fast_lookup
    combiner = _pooling_combiner(combiner, max_norm)
    with tf.name_scope(name or "embedding_lookup_sparse"):
        bags = _bags_of(sp_ids, sp_weights)
        # As TF: a SparseTensor gives max(row index) + 1 rows.
        num_segments = (None if isinstance(sp_ids, tf.SparseTensor)
                        else bags.num_bags)
        return fused_decode_axpy(table, bags.ids, bags.segment_ids,
                                 bags.weights, combiner, num_segments)


def safe_embedding_lookup_sparse(table, sparse_ids, sparse_weights=None,
                                 combiner="mean", default_id=None,
                                 max_norm=None, name=None,
                                 allow_fast_lookup=False):
    """Drop-in for ``tf.nn.safe_embedding_lookup_sparse`` on a compressed table.

    Ids < 0 are dropped (and, for ``"mean"``/``"sqrtn"``, weights <= 0).
    A row left with no ids gives zeros, or the row ``default_id`` when it is
    given. Ids of rank > 2 are pooled over the last dimension, and the output
    has shape ``sparse_ids.dense_shape[:-1] + [D]``.

    Args:
      table: a :class:`CompressedTable`.
      sparse_ids: ``SparseTensor`` ``[d0, ..., dn]`` of int ids, or
        ``RaggedTensor`` ``[batch, (ids)]``.
      sparse_weights: None, or weights with the same structure.
      combiner: ``"mean"`` (default), ``"sqrtn"`` or ``"sum"``.
      default_id: id whose row fills empty rows; None gives zeros.
      max_norm: must be None (not supported: see the error's advice).
      name: optional name scope.
      allow_fast_lookup: accepted for TF's signature; no effect.

    The entries of ``sparse_ids`` may be in any order, as TF allows here.
    """
    del allow_fast_lookup
    combiner = _pooling_combiner(combiner, max_norm)
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        if isinstance(sparse_ids, tf.RaggedTensor):
            sparse_ids = sparse_ids.to_sparse()
            if sparse_weights is not None:
                sparse_weights = sparse_weights.to_sparse()
        original_shape = sparse_ids.dense_shape
        flat_rows = tf.reduce_prod(original_shape[:-1])
        sparse_ids = tf.sparse.reshape(
            sparse_ids, tf.stack([flat_rows, original_shape[-1]]))
        if sparse_weights is not None:
            _bags.check_one_weight_per_id(sparse_ids.values,
                                          sparse_weights.values,
                                          name="sp_weights")
            sparse_weights = tf.SparseTensor(
                sparse_ids.indices, sparse_weights.values,
                sparse_ids.dense_shape)
        # TF's version takes entries in any order (its fill of empty rows
        # sorts them); the op needs sorted segment ids.
        sparse_ids, sparse_weights = _row_major(sparse_ids, sparse_weights)
        keep = sparse_ids.values >= 0
        if sparse_weights is not None and combiner != "sum":
            keep = tf.logical_and(keep, sparse_weights.values > 0)
        sparse_ids = tf.sparse.retain(sparse_ids, keep)
        if sparse_weights is not None:
            sparse_weights = tf.sparse.retain(sparse_weights, keep)
        if default_id is not None:
            sparse_ids, _ = tf.sparse.fill_empty_rows(
                sparse_ids, tf.cast(default_id, sparse_ids.dtype))
            if sparse_weights is not None:
                sparse_weights, _ = tf.sparse.fill_empty_rows(
                    sparse_weights, tf.cast(1.0, sparse_weights.dtype))
        bags = _bags.from_sparse(sparse_ids, sparse_weights,
                                 names=("sparse_ids", "sp_weights"))
        pooled = fused_decode_axpy(table, bags.ids, bags.segment_ids,
                                   bags.weights, combiner, bags.num_bags)
        out_shape = tf.concat(
            [tf.cast(original_shape[:-1], tf.int64),
             tf.shape(pooled, out_type=tf.int64)[1:]], 0)
        return tf.reshape(pooled, out_shape)


def _per_feature(value, count, name):
    """``value`` repeated ``count`` times when it is a single value, else the
    list itself, which must have ``count`` entries."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name} must have one entry per feature "
                             f"({count}), got {len(value)}")
        return list(value)
    return [value] * count


def batched_embedding_lookup_sparse(tables, sp_ids, sp_weights=None,
                                    combiners="mean", concat=False,
                                    feature_names=None, name=None):
    """Pools many features, each over its own compressed table, in one op.

    The results of one :func:`embedding_lookup_sparse` per feature, computed
    by one ``BatchedFusedDecodeAxpy`` node: a model with many sparse features
    pays TensorFlow's per-node cost once instead of once per feature, and the
    op spreads the features' bags over the intra-op threads.

    Args:
      tables: list of :class:`CompressedTable` (of any formats and dims), one
        per feature; features may share a table (pass it again).
      sp_ids: list of ids, one per feature: ``RaggedTensor`` ``[batch,
        (ids)]``, ``SparseTensor`` ``[batch, ?]`` with row-major entries, or
        a dense int ``Tensor`` ``[batch, L]`` padded with negative ids (row
        b's ids >= 0 are bag b; the padded input models take in place of
        ``tf.where(ids >= 0)`` and ``tf.gather_nd``).
      sp_weights: None, or a list with None (unweighted) or weights of the
        same structure as that feature's ids (``[batch, L]`` floats for
        dense ids).
      combiners: ``"mean"`` (default), ``"sqrtn"`` or ``"sum"``, or a list
        of them, one per feature.
      concat: if True, return one ``[batch, sum of dims]`` tensor with the
        features' results side by side, in order (every feature must have
        the same batch size); else a list of ``[batch_f, D_f]`` tensors.
      feature_names: optional list of names, used in error messages.
      name: optional op name.

    Returns:
      A list of float32 ``[rows_f, D_f]`` tensors, or one float32
      ``[batch, sum D_f]`` tensor when ``concat``. A ragged or dense feature
      has one row per row of ids; a sparse one ``dense_shape[0]`` rows (where
      ``embedding_lookup_sparse``, as TF's, gives ``max(row index) + 1``),
      so that features line up side by side.

    Raises:
      ValueError: lists of different lengths, an unknown combiner, or ids
        that are not 2-D sparse or ragged.
      tf.errors.InvalidArgumentError: bad ids or bags, naming the feature.
    """
    tables = list(tables)
    sp_ids = list(sp_ids)
    count = len(tables)
    if count == 0:
        raise ValueError("tables must hold at least one table")
    if len(sp_ids) != count:
        raise ValueError(f"sp_ids must have one entry per table ({count}), "
                         f"got {len(sp_ids)}")
    sp_weights = _per_feature(sp_weights, count, "sp_weights")
    combiners = [_bags.check_combiner(c)
                 for c in _per_feature(combiners, count, "combiners")]
    if feature_names is not None:
        if (not isinstance(feature_names, (list, tuple))
                or len(feature_names) != count):
            raise ValueError(f"feature_names must be a list of one name per "
                             f"table ({count}), got {feature_names!r}")
        feature_names = [str(n) for n in feature_names]
    with tf.name_scope(name or "batched_embedding_lookup_sparse"):
        features = []
        for f, (ids, weights) in enumerate(zip(sp_ids, sp_weights)):
            names = (f"sp_ids[{f}]", f"sp_weights[{f}]")
            if isinstance(ids, tf.RaggedTensor):
                values, weight_values = _bags.ragged_values(ids, weights,
                                                            names=names)
                features.append(BatchedBags("row_splits", values, ids.row_splits,
                                            weight_values))
            elif isinstance(ids, tf.SparseTensor):
                bags = _bags.from_sparse(ids, weights, names=names)
                features.append(BatchedBags("segment_ids", bags.ids, bags.segment_ids,
                                            bags.weights,
                                            tf.cast(bags.num_bags, tf.int64)))
            else:
                bags = _bags.from_padded(ids, weights, names=names)
                features.append(BatchedBags("padded", bags.ids, None, bags.weights))
        return batched_pool(tables, features, combiners, concat, feature_names)


class BatchedBags(collections.namedtuple(
        "BatchedBags", ["kind", "ids", "splits", "weights", "num_bags"],
        defaults=(None, None))):
    """One feature's bags as BatchedFusedDecodeAxpy takes them: `kind` (a
    bag kind of the op), its ids, bag splits (None: none, for 'dense' and
    'padded'), weights (None: unweighted) and num_bags (None: the rows of
    the bag structure)."""


def batched_pool(tables, features, combiners, concat=False, feature_names=None):
    """One BatchedFusedDecodeAxpy node pooling `features` (BatchedBags) over
    `tables` with `combiners` (a list, checked); the outputs as
    :func:`batched_embedding_lookup_sparse` returns them. A table that
    features share is read once; the node has only the inputs each feature
    needs (_batched_inputs), and reads the tables held in variables itself.
    """
    table_inputs = {}
    op_features = []
    for table, bags, combiner in zip(tables, features, combiners):
        if id(table) not in table_inputs:
            table_inputs[id(table)] = _table_inputs(table, handles=True)
        inputs = table_inputs[id(table)]
        table_dtype = inputs.get("table_dtype", inputs["table"].dtype)
        row_format = inputs.get("row_format", "plain")
        scales = inputs["scales"]
        if (not _batched_inputs.has_scales(table_dtype.name, row_format)
                and _is_empty_float32(scales)):
            scales = None  # a non-empty one goes in: the op refuses it
        op_features.append(_batched_inputs.Feature(
            table=inputs["table"], ids=bags.ids, bag_kind=bags.kind,
            row_format=row_format, dim=inputs.get("dim", -1),
            combiner=combiner, scales=scales, bag_splits=bags.splits,
            weights=bags.weights,
            num_bags=(_batched_inputs.ROWS_OF_BAGS if bags.num_bags is None
                      else bags.num_bags),
            table_dtype=table_dtype))
    outputs = _op_library().batched_fused_decode_axpy(
        **_batched_inputs.layout(op_features), concat=bool(concat),
        num_outputs=1 if concat else len(features),
        feature_names=feature_names or [])
    return outputs[0] if concat else list(outputs)

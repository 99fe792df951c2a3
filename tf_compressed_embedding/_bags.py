"""Bags of ids: the one reduction of pooled-lookup inputs to what the op takes.

A bag is the ids pooled into one output row. The tf.nn-style wrappers
(``SparseTensor`` / ``RaggedTensor`` ids) and the Keras layer (also dense
padded ids with a mask) reduce their inputs to the four tensors
``FusedDecodeAxpy`` takes: :class:`Bags`. Error messages start with
``owner`` (the layer says which layer) and use the caller's argument names.
"""
import collections

import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")

# ids [N]; segment_ids [N] int64, sorted; weights float32 [N] or None (all
# ones); num_bags int64 scalar, the number of output rows. from_padded is
# the exception: the batched op's 'padded' bags keep ids (and weights) as
# [batch, length] matrices, with segment_ids and num_bags None.
Bags = collections.namedtuple("Bags",
                              ["ids", "segment_ids", "weights", "num_bags"])


def check_combiner(combiner, allow_none=False):
    """Returns ``combiner`` if it is one of :data:`COMBINERS` (or None when
    ``allow_none``), else raises ValueError."""
    if combiner in COMBINERS or (allow_none and combiner is None):
        return combiner
    choices = ", ".join(repr(c) for c in COMBINERS)
    if allow_none:
        choices = "None, " + choices
    raise ValueError(f"combiner must be one of {choices}, got {combiner!r}")


def float_weights(weights, owner="", name="weights"):
    """``weights`` as float32; a non-floating dtype is a TypeError."""
    weights = tf.convert_to_tensor(weights)
    if not weights.dtype.is_floating:
        raise TypeError(f"{owner}{name} must be floating point, got "
                        f"{weights.dtype.name}")
    return tf.cast(weights, tf.float32)


def from_ragged(ids, weights=None, owner="", names=("ids", "weights")):
    """Bags of ``RaggedTensor`` ids ``[batch, (ids)]``, one per row;
    ``weights`` must be a RaggedTensor with the same row lengths."""
    values, weight_values = ragged_values(ids, weights, owner, names)
    return Bags(values, ids.value_rowids(), weight_values, ids.nrows())


def ragged_values(ids, weights=None, owner="", names=("ids", "weights")):
    """The flat ids and float32 weights (None: unweighted) of ``RaggedTensor``
    ids ``[batch, (ids)]``, checked as :func:`from_ragged` checks them; the
    row splits stay the caller's (the batched op takes them as they are,
    with no segment ids to build)."""
    ids_name, weights_name = names
    if ids.ragged_rank != 1 or ids.flat_values.shape.rank != 1:
        raise ValueError(
            f"{owner}{ids_name} (a RaggedTensor) must have shape "
            f"[batch, (ids)], got {ids.shape} with ragged_rank "
            f"{ids.ragged_rank}")
    values = None
    if weights is not None:
        _check_like(weights, tf.RaggedTensor, owner, names)
        values = _same_layout(
            weights.flat_values, ids.flat_values,
            (weights.row_splits,
             tf.cast(ids.row_splits, weights.row_splits.dtype)),
            owner, f"{weights_name} must have the row lengths of {ids_name}",
            weights_name)
    return ids.flat_values, values


def from_sparse(ids, weights=None, owner="", names=("ids", "weights")):
    """Bags of ``SparseTensor`` ids, one per index of the first dimension
    (row-major entries, as ``tf.nn.embedding_lookup_sparse`` needs);
    ``weights`` must be a SparseTensor with one value per id."""
    values = None
    if weights is not None:
        _check_like(weights, tf.SparseTensor, owner, names)
        values = _same_layout(
            weights.values, ids.values,
            (tf.shape(weights.values), tf.shape(ids.values)),
            owner, f"{names[1]} must have one value per id", names[1])
    return Bags(ids.values, ids.indices[:, 0], values, ids.dense_shape[0])


def from_dense(ids, weights=None, mask=None, owner=""):
    """Bags of dense padded ids ``[batch, length]``, one per row; positions
    where ``mask`` ([batch, length], or broadcastable) is False are dropped,
    before the ids are checked (padding may hold any value)."""
    ids = tf.convert_to_tensor(ids)
    shape = tf.shape(ids, out_type=tf.int64)
    # Row b's ids get segment id b; flattening keeps them sorted.
    segment_ids = tf.reshape(
        tf.broadcast_to(tf.range(shape[0])[:, None], shape), [-1])
    values = None
    if weights is not None:
        if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(
                f"{owner}weights must be a dense [batch, length] tensor like "
                f"the ids, got {type(weights).__name__}")
        weights = float_weights(weights, owner)
        check = tf.debugging.assert_equal(
            tf.shape(weights), tf.shape(ids),
            message=f"{owner}weights must have the shape of the ids")
        with tf.control_dependencies([check]):
            values = tf.reshape(weights, [-1])
    bags = Bags(tf.reshape(ids, [-1]), segment_ids, values, shape[0])
    if mask is None:
        return bags
    mask = tf.convert_to_tensor(mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return _keep(bags, tf.reshape(tf.broadcast_to(mask, tf.shape(ids)), [-1]))


def from_padded(ids, weights=None, owner="", names=("ids", "weights")):
    """Dense ids ``[batch, length]`` padded with negative ids, one bag per
    row, as the batched op's 'padded' bag kind takes them: ``ids`` stays a
    matrix, ``segment_ids`` and ``num_bags`` are None (the op counts the
    rows) and ``weights``, if given, must have its shape."""
    ids_name, weights_name = names
    if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) or not (
            tf.is_tensor(ids) or isinstance(ids, (list, tuple))
            or hasattr(ids, "__array__")):
        raise TypeError(f"{owner}{ids_name} must be a SparseTensor, a "
                        f"RaggedTensor or a dense int tensor [batch, length], "
                        f"got {type(ids).__name__}")
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"{owner}{ids_name} must hold int32 or int64 ids, got "
                        f"{ids.dtype.name}")
    if ids.shape.rank is not None and ids.shape.rank != 2:
        raise ValueError(f"{owner}{ids_name} must be a dense [batch, length] "
                         f"matrix of ids (negative ids are padding), got "
                         f"shape {ids.shape}")
    if weights is not None:
        if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(
                f"{owner}{weights_name} must be a dense [batch, length] "
                f"tensor like {ids_name}, got {type(weights).__name__}")
        weights = float_weights(weights, owner, weights_name)
        if not weights.shape.is_compatible_with(ids.shape):
            raise ValueError(f"{owner}{weights_name} must have the shape of "
                             f"{ids_name}, {ids.shape}, got {weights.shape}")
    return Bags(ids, None, weights, None)


def without_id(bags, padding_id=0):
    """``bags`` with every ``padding_id`` dropped (Keras' ``mask_zero``)."""
    return _keep(bags, tf.not_equal(bags.ids,
                                    tf.constant(padding_id, bags.ids.dtype)))


def _keep(bags, keep):
    weights = (None if bags.weights is None
               else tf.boolean_mask(bags.weights, keep))
    return Bags(tf.boolean_mask(bags.ids, keep),
                tf.boolean_mask(bags.segment_ids, keep), weights,
                bags.num_bags)


def _check_like(weights, kind, owner, names):
    if not isinstance(weights, kind):
        # Without an owner, in the words of TF's own message.
        either = "" if owner else "None or "
        raise TypeError(
            f"{owner}{names[1]} must be {either}a {kind.__name__} like "
            f"{names[0]}, got {type(weights).__name__}")


def check_one_weight_per_id(ids, weights, owner="", name="weights"):
    """A ValueError while the graph is built (as TF raises) when the static
    shapes of the ids' and the weights' values cannot match."""
    if not ids.shape.is_compatible_with(weights.shape):
        raise ValueError(
            f"{owner}{name} must have one weight per id: the ids' values "
            f"have shape {ids.shape}, the weights' {weights.shape}")


def _same_layout(values, ids, layouts, owner, message, name):
    """float32 ``values``, checked to have the ids' layout: statically,
    then when the graph runs."""
    check_one_weight_per_id(ids, values, owner, name)
    check = tf.debugging.assert_equal(*layouts, message=f"{owner}{message}")
    with tf.control_dependencies([check]):
        return tf.identity(float_weights(values, owner, name))

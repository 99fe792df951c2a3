"""The layer's inputs: ids checked and wrapped as Keras does, and bags of
ids for pooling (the package's one bag reduction, with the layer's checks)."""
import tensorflow as tf

from tf_compressed_embedding import _bags


def valid_ids(ids, input_dim, layer_name):
    """Integer ids with negatives in [-V, 0) wrapped as Keras does.

    Ids below -V are left negative so the gather / op error names the id
    the caller passed.
    """
    ids = _integer_ids(ids, layer_name)
    rows = tf.constant(input_dim, ids.dtype)
    return tf.where((ids < 0) & (ids >= -rows), ids + rows, ids)


def bags(inputs, weights, mask, layer):
    """The bags of ``inputs`` (see the layer's doc), with valid ids."""
    owner = f"layer {layer.name!r}: "
    if isinstance(inputs, tf.RaggedTensor):
        _reject_mask(mask, "a RaggedTensor", owner)
        result = _bags.from_ragged(inputs, weights, owner)
    elif isinstance(inputs, tf.SparseTensor):
        if inputs.shape.rank is not None and inputs.shape.rank != 2:
            raise ValueError(
                f"{owner}sparse ids must have shape [batch, length], "
                f"got rank {inputs.shape.rank}")
        _reject_mask(mask, "a SparseTensor", owner)
        result = _bags.from_sparse(inputs, weights, owner)
    else:
        dense = tf.convert_to_tensor(inputs)
        if dense.shape.rank != 2:
            raise ValueError(
                f"{owner}(combiner={layer.combiner!r}) pools rows of ids: "
                f"dense ids must be [batch, length], got shape "
                f"{dense.shape}")
        result = _bags.from_dense(dense, weights, mask, owner)
    if layer.mask_zero:
        result = _bags.without_id(result)
    return _bags.Bags(valid_ids(result.ids, layer.input_dim, layer.name),
                      tf.cast(result.segment_ids, tf.int64), result.weights,
                      tf.cast(result.num_bags, tf.int64))


def _reject_mask(mask, kind, owner):
    if mask is not None:
        raise ValueError(
            f"{owner}`mask` is for dense padded ids; "
            f"{kind} holds only real ids (leave mask=None)")


def _integer_ids(ids, layer_name):
    """int32/int64 ids; whole-number floats are converted, others refused."""
    if ids.dtype in (tf.int32, tf.int64):
        return ids
    if ids.dtype.is_integer:
        return tf.cast(ids, tf.int64)
    if ids.dtype.is_floating:
        as_int = tf.cast(ids, tf.int64)
        # NaN, fractions and values beyond int64 all fail the round trip.
        check = tf.debugging.assert_equal(
            tf.cast(as_int, ids.dtype), ids,
            message=f"layer {layer_name!r}: ids must be whole numbers, got "
                    f"{ids.dtype.name} ids with a fractional part (or NaN)")
        with tf.control_dependencies([check]):
            return tf.identity(as_int)
    raise TypeError(f"layer {layer_name!r}: ids must be integers, got "
                    f"dtype {ids.dtype.name}")

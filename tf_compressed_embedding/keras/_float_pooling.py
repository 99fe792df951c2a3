"""Pooling a float32 table with stock ops: the layer's training path."""
import tensorflow as tf


def pool(table, bags, combiner):
    """FusedDecodeAxpy's semantics on a float32 table, differentiable.

    ``tf.gather`` of the table variable makes its gradient IndexedSlices (as
    for Keras' Embedding); the weights get gradients through the products
    and sums. Zero denominators give zeros, with zero (not NaN) gradients.

    Args:
      table: float ``[V, D]`` tensor or variable.
      bags: a ``tf_compressed_embedding._bags.Bags``.
      combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"``.
    """
    ids, segment_ids, weights, num_segments = bags
    rows = tf.gather(table, ids)
    if weights is not None:
        weights = tf.cast(weights, rows.dtype)
        rows = rows * weights[:, None]
    total = tf.math.unsorted_segment_sum(rows, segment_ids, num_segments)
    if combiner == "sum":
        return total
    if weights is None:
        weights = tf.ones(tf.shape(ids), rows.dtype)
    if combiner == "mean":
        denom = tf.math.unsorted_segment_sum(weights, segment_ids,
                                             num_segments)
    else:
        squares = tf.math.unsorted_segment_sum(weights * weights, segment_ids,
                                               num_segments)
        positive = squares > 0
        # sqrt's gradient at 0 is infinite: take it only where positive.
        denom = tf.where(positive,
                         tf.sqrt(tf.where(positive, squares, 1)), 0)
    return tf.math.divide_no_nan(total, denom[:, None])

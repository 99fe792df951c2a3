"""Gradient registrations, made by the loader once the library is loaded.

FusedDecodeAxpy is differentiable with respect to ``weights`` only;
compressed tables are not trainable, so the table inputs get no gradient.
"""
import tensorflow as tf

_ops_module = None  # the loaded op library, for the lookup the gradient runs


def register(ops_module):
    """Registers the ops' gradients (once per process)."""
    global _ops_module
    if _ops_module is None:
        _ops_module = ops_module
        tf.no_gradient("CompressedEmbeddingLookup")
        tf.RegisterGradient("FusedDecodeAxpy")(_fused_decode_axpy_grad)


def _fused_decode_axpy_grad(op, grad):
    """d out[s] / d w_i for the three combiners (x_i = decoded row i).

    sum:   x_i
    mean:  (x_i - out[s]) / W_s                      W_s = sum w
    sqrtn: (x_i - out[s] * w_i / R_s) / R_s          R_s = sqrt(sum w^2)
    A zero denominator (where the output is defined as 0) gives 0.
    """
    table, scales, ids, segment_ids, weights, num_segments = op.inputs
    no_grads = [None] * 5

    def weights_grad():
        combiner = op.get_attr("combiner").decode()
        rows = _ops_module.compressed_embedding_lookup(
            table=table, scales=scales, ids=ids,
            row_format=op.get_attr("row_format").decode(),
            dim=op.get_attr("dim"))
        g = tf.gather(grad, segment_ids)
        if combiner == "sum":
            return tf.reduce_sum(g * rows, axis=1)
        out = tf.gather(op.outputs[0], segment_ids)
        if combiner == "mean":
            denom = tf.gather(tf.math.unsorted_segment_sum(
                weights, segment_ids, num_segments), segment_ids)
            return tf.math.divide_no_nan(tf.reduce_sum(g * (rows - out), 1),
                                         denom)
        root = tf.gather(tf.sqrt(tf.math.unsorted_segment_sum(
            weights * weights, segment_ids, num_segments)), segment_ids)
        centred = rows - out * tf.math.divide_no_nan(weights, root)[:, None]
        return tf.math.divide_no_nan(tf.reduce_sum(g * centred, 1), root)

    static_size = weights.shape.num_elements()
    if static_size == 0:  # unweighted: nothing to differentiate
        return no_grads + [None]
    if static_size is not None:
        return no_grads[:4] + [weights_grad(), None]
    dw = tf.cond(tf.size(weights) > 0, weights_grad,
                 lambda: tf.zeros_like(weights))
    return no_grads[:4] + [dw, None]

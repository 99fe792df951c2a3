"""Gradient registrations, made by the loader once the library is loaded.

FusedDecodeAxpy and BatchedFusedDecodeAxpy are differentiable with respect
to ``weights`` only; compressed tables are not trainable, so the table
inputs get no gradient.
"""
import tensorflow as tf

from tf_compressed_embedding import _batched_inputs

_ops_module = None  # the loaded op library, for the lookup the gradient runs


def register(ops_module):
    """Registers the ops' gradients (once per process)."""
    global _ops_module
    if _ops_module is None:
        _ops_module = ops_module
        tf.no_gradient("CompressedEmbeddingLookup")
        tf.RegisterGradient("FusedDecodeAxpy")(_fused_decode_axpy_grad)
        tf.RegisterGradient("BatchedFusedDecodeAxpy")(
            _batched_fused_decode_axpy_grad)


def _pooled_weights_grad(lookup, segment_ids, weights, num_segments, out,
                         grad, combiner):
    """d loss / d w_i of one pooled feature, given its decoded rows
    (`lookup()`), its ids' segment ids, its output and the output's
    gradient (x_i = decoded row i, s its segment):

    sum:   x_i
    mean:  (x_i - out[s]) / W_s                      W_s = sum w
    sqrtn: (x_i - out[s] * w_i / R_s) / R_s          R_s = sqrt(sum w^2)
    A zero denominator (where the output is defined as 0) gives 0.
    """
    rows = lookup()
    g = tf.gather(grad, segment_ids)
    if combiner == "sum":
        return tf.reduce_sum(g * rows, axis=1)
    out = tf.gather(out, segment_ids)
    if combiner == "mean":
        denom = tf.gather(tf.math.unsorted_segment_sum(
            weights, segment_ids, num_segments), segment_ids)
        return tf.math.divide_no_nan(tf.reduce_sum(g * (rows - out), 1), denom)
    root = tf.gather(tf.sqrt(tf.math.unsorted_segment_sum(
        weights * weights, segment_ids, num_segments)), segment_ids)
    centred = rows - out * tf.math.divide_no_nan(weights, root)[:, None]
    return tf.math.divide_no_nan(tf.reduce_sum(g * centred, 1), root)


def _unless_unweighted(weights, weights_grad):
    """weights_grad() for weights that may be empty (unweighted): None when
    they are statically, zeros when they are at run time."""
    static_size = weights.shape.num_elements()
    if static_size == 0:
        return None
    if static_size is not None:
        return weights_grad()
    return tf.cond(tf.size(weights) > 0, weights_grad,
                   lambda: tf.zeros_like(weights))


def _fused_decode_axpy_grad(op, grad):
    table, scales, ids, segment_ids, weights, num_segments = op.inputs

    def lookup():
        return _ops_module.compressed_embedding_lookup(
            table=table, scales=scales, ids=ids,
            row_format=op.get_attr("row_format").decode(),
            dim=op.get_attr("dim"))

    dw = _unless_unweighted(weights, lambda: _pooled_weights_grad(
        lookup, segment_ids, weights, num_segments, op.outputs[0], grad,
        op.get_attr("combiner").decode()))
    return [None] * 4 + [dw, None]


def _batched_fused_decode_axpy_grad(op, *grads):
    """Each weighted feature's weights gradient, as FusedDecodeAxpy's: its
    bags are turned into segment ids over the ids it pools (dense and padded
    ids flattened, padding left out and given gradient 0)."""
    features = _batched_inputs.features_of(op)
    concat = op.get_attr("concat")
    outputs, column = [], 0
    for f, feature in enumerate(features):  # each output and its gradient
        if not concat:
            outputs.append((op.outputs[f], grads[f]))
            continue
        width = (feature.dim if feature.dim >= 0
                 else tf.cast(_batched_inputs.table_width(feature), tf.int32))
        cols = slice(column, column + width)
        outputs.append((op.outputs[0][:, cols],
                        None if grads[0] is None else grads[0][:, cols]))
        column = column + width

    def feature_grad(f):
        feature = features[f]
        out, grad = outputs[f]
        num_segments = tf.shape(out)[0]
        ids, weights = feature.ids, feature.weights
        flat_ids, flat_weights, segment_ids = ids, weights, feature.bag_splits
        if feature.bag_kind == "row_splits":
            segment_ids = tf.ragged.row_splits_to_segment_ids(feature.bag_splits)
        elif feature.bag_kind in ("dense", "padded"):
            keep = (tf.where(tf.ones_like(ids, tf.bool))
                    if feature.bag_kind == "dense" else tf.where(ids >= 0))
            flat_ids, flat_weights = tf.gather_nd(ids, keep), tf.gather_nd(weights, keep)
            segment_ids = keep[:, 0]

        def lookup():
            return _ops_module.compressed_embedding_lookup(
                table=_batched_inputs.read_table(feature),
                scales=(tf.zeros([0]) if feature.scales is None
                        else feature.scales),
                ids=flat_ids, row_format=feature.row_format, dim=feature.dim)

        dw = _pooled_weights_grad(lookup, segment_ids, flat_weights,
                                  num_segments, out, grad, feature.combiner)
        if feature.bag_kind in ("dense", "padded"):
            dw = tf.scatter_nd(keep, dw, tf.shape(weights, out_type=tf.int64))
        return dw

    grads_by_feature = [
        None if feature.weights is None or outputs[f][1] is None
        else _unless_unweighted(feature.weights, lambda f=f: feature_grad(f))
        for f, feature in enumerate(features)]
    # Only the weights inputs (those of the weighted features, in order,
    # followed by the num_bags inputs) get a gradient.
    weight_grads = [grads_by_feature[f] for f, feature in enumerate(features)
                    if feature.weights is not None]
    num_bags_inputs = len(op.get_attr("Tnum_bags"))
    before = len(op.inputs) - len(weight_grads) - num_bags_inputs
    return [None] * before + weight_grads + [None] * num_bags_inputs

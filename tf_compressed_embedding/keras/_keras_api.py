"""The Keras internals the layer relies on, in one place (each is listed
with the versions it was checked on in docs/compatibility.md)."""
import tensorflow as tf


def entry_layer():
    """The outermost layer of the Keras call in progress (the model whose
    ``predict`` / ``fit`` is running), from Keras' call context; None outside
    one. A private Keras API (see docs/compatibility.md): if it moves, no
    model is noted, and a stale function fails loudly instead (see
    quantize)."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return None
    context = global_state.get_global_attribute("current_call_ctx")
    return getattr(context, "entry_layer", None)


def keras_mask(tensor):
    """The Keras mask a layer's output carries to the next layer's call
    (Keras passes it on itself, outside the call's arguments); None when
    there is none. Keras keeps it in the tensor's ``_keras_mask``."""
    return getattr(tensor, "_keras_mask", None)


def empty_variable(variable):
    """Assigns ``[0, D]`` to a float32 table variable: its memory is freed
    whoever still holds the variable, and a gather from it fails."""
    value = variable.value  # the tf.Variable under the Keras variable
    tf.raw_ops.AssignVariableOp(
        resource=value.handle,
        value=tf.zeros([0, *value.shape[1:]], value.dtype),
        validate_shape=False)


def to_numpy(value):
    """A numpy copy of a Keras variable or tensor (np.array() of a Keras
    variable goes through a deprecated numpy path)."""
    return tf.convert_to_tensor(value).numpy()


def float_policy(policy):
    """The float policy a (possibly Keras-quantized) layer computes in."""
    if policy.quantization_mode is None:
        return policy.name
    # QuantizedDTypePolicy "int8_from_<source>": the source float policy.
    return policy.get_config()["source_name"]

"""Keras 3 layer over compressed embedding tables: `CompressedEmbedding`.

A drop-in for ``keras.layers.Embedding`` that trains a float32 table like
Keras does and, after :meth:`CompressedEmbedding.quantize`, serves it through
the package's ops from a table in a format of
``tf_compressed_embedding.quantization`` (``"int8"``, ``"int4"``, ``"fp16"``,
``"int8_split"``; ``model.quantize("int8" | "int4")`` reaches it). With a
``combiner`` it also pools multi-valued features (padded, ragged or sparse
bags of ids) into one vector per example, fused with the decoding.

    import keras
    import tf_compressed_embedding as tfce
    from tf_compressed_embedding.layers import CompressedEmbedding

    ids = keras.Input(shape=(None,), dtype="int64")
    layer = CompressedEmbedding(10000, 32, mask_zero=True, combiner="mean")
    pooled = layer(ids)
    ...build the model, train it as usual...
    layer.quantize("int8")            # in place ("int4", "fp16"), or
    served = tfce.layers.quantize_embeddings(model, "int4")  # a copy

Ids. Ids must be integers in ``[-input_dim, input_dim)``; a negative id ``i``
means row ``input_dim + i``, as in ``keras.layers.Embedding`` (whose
``ops.take`` wraps negative indices the same way). Any other id is a
``tf.errors.InvalidArgumentError`` naming the id and the range ``[0, V)``,
raised by ``tf.gather`` for the float32 table and by the compressed ops once
quantized. Float ids are accepted when they hold whole numbers (Keras'
default ``Input`` dtype is float32); a float id with a fractional part is an
``InvalidArgumentError`` where Keras would truncate it silently. Other dtypes
are a ``TypeError``.
"""
import collections
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from tf_compressed_embedding import _bags
from tf_compressed_embedding import ops as tfce_ops
from tf_compressed_embedding import quantization, supported_versions
from tf_compressed_embedding.keras import _inputs, _layouts, _modes
from tf_compressed_embedding.keras._float_pooling import pool
from tf_compressed_embedding.keras._keras_api import (empty_variable,
                                                      entry_layer,
                                                      float_policy, to_numpy)
from tf_compressed_embedding.keras._modes import (  # noqa: F401 (re-exported)
    QUANTIZATION_MODES, UnsupportedQuantizationModeError, check_mode)

COMBINERS = _bags.COMBINERS
_NO_LORA = ("CompressedEmbedding does not support LoRA (lora_rank, "
            "lora_alpha, enable_lora): train a keras.layers.Embedding with "
            "LoRA and convert the model with quantize_embeddings()")

if supported_versions.keras_too_old(keras.__version__):
    warnings.warn(supported_versions.keras_too_old(keras.__version__),
                  stacklevel=2)

# What the ops read (see ops._table_inputs): the variables, and the format
# and dim that give the rowwise formats' attrs.
_OpTable = collections.namedtuple("_OpTable", ["data", "scales", "format", "dim"])


@keras.saving.register_keras_serializable(package="tf_compressed_embedding")
class CompressedEmbedding(keras.layers.Layer):
    """``keras.layers.Embedding`` with compressed storage and pooling.

    Float32 mode (the default) trains like ``keras.layers.Embedding``: the
    table is ``self.embeddings``, a trainable float32 ``[input_dim,
    output_dim]`` variable whose gradients are ``tf.IndexedSlices``.
    :meth:`quantize` compresses it in place to ``"int8"``, ``"int4"``,
    ``"fp16"`` or ``"int8_split"``; the float32 table is dropped and nothing
    is trainable afterwards.

    ``combiner=None``: ``ids`` of any shape give ``ids.shape + [output_dim]``
    (ragged ids a ragged result; sparse ids ``[B, L]`` a dense ``[B, L, D]``
    with row 0 where no id is given, as Keras' does)
    and, with ``mask_zero=True``, the mask ``ids != 0`` — the behaviour of
    ``keras.layers.Embedding``.

    ``combiner="sum" | "mean" | "sqrtn"``: every row of ids is a bag, pooled
    to one vector: ``out[b] = sum_i w_bi x_bi`` divided by ``sum_i w_bi``
    (mean) or ``sqrt(sum_i w_bi**2)`` (sqrtn), ``x_bi`` the row of id
    ``ids[b, i]`` and ``w_bi`` its weight (1 without ``weights``) — the
    semantics of ``tf.nn.embedding_lookup_sparse``. An empty bag (or a zero
    denominator) gives zeros. Inputs:

    - a dense ``[B, L]`` tensor of padded ids. Padding is excluded with
      ``mask_zero=True`` (id 0 is padding: the same result as
      ``keras.layers.Embedding(mask_zero=True)`` followed by a masked
      ``GlobalAveragePooling1D`` for ``"mean"``) and/or the ``mask`` call
      argument, a ``[B, L]`` boolean tensor that is True for real ids;
    - a ``tf.RaggedTensor`` ``[B, (ids)]``;
    - a ``tf.SparseTensor`` ``[B, L]`` with indices in row-major order (as
      ``tf.nn.embedding_lookup_sparse`` requires); every one of the ``B``
      rows gets an output row, empty ones included.

    With ``mask_zero=True`` id 0 is dropped from the bags of every input
    kind. The output is ``[B, output_dim]`` and carries no mask.

    Args:
      input_dim: number of rows ``V`` (vocabulary size), a positive int.
      output_dim: embedding size ``D``, a positive int.
      embeddings_initializer: initializer of the float32 table.
      embeddings_regularizer: regularizer of the float32 table.
      embeddings_constraint: constraint of the float32 table.
      mask_zero: whether id 0 is padding (see above).
      weights: optional initial values: the float32 table ``[V, D]`` (or a
        one-element list of it), or ``[data, scales]`` when constructed with
        ``quantization_mode``.
      lora_rank, lora_alpha: must be None (LoRA is not supported).
      quantization_config: must be None (the formats are fixed, see
        ``tf_compressed_embedding.quantization``).
      combiner: None, ``"sum"``, ``"mean"`` or ``"sqrtn"``.
      quantization_mode: None (float32), ``"int8"``, ``"int4"``, ``"fp16"``
        or ``"int8_split"``: creates the layer directly in compressed mode,
        with zero-filled variables that ``load_own_variables`` /
        ``set_weights`` then fill (how ``from_config`` rebuilds a quantized
        layer). A Keras quantized dtype policy (``"int8_from_float32"``,
        ``"int4_from_float32"``) means its mode.
      **kwargs: base ``keras.layers.Layer`` arguments (``name``, ``dtype``,
        ``trainable``, ...).

    Call arguments:
      inputs: ids, as described above.
      weights: optional per-id float weights with the structure of
        ``inputs`` (dense ``[B, L]``, ragged or sparse with the same
        layout); only with a combiner. Gradients flow to them.
      mask: optional ``[B, L]`` boolean tensor for dense ids with a
        combiner. Ignored with ``combiner=None``, as Keras' Embedding does.
        An upstream layer's mask on the ids is used when none is given.
      inputs_mask: where Keras passes that upstream mask when the call has
        ``weights`` too (it names the mask after the tensor argument);
        not for passing by hand.

    Raises (at call time):
      TypeError: ids of a non-numeric dtype, or weights not matching ids.
      ValueError: dense ids not of rank 2 with a combiner; ``weights``
        without a combiner.
      tf.errors.InvalidArgumentError: an id outside ``[-V, V)``, or a float
        id that is not a whole number.
    """

    def __init__(self, input_dim, output_dim,
                 embeddings_initializer="uniform", embeddings_regularizer=None,
                 embeddings_constraint=None, mask_zero=False, weights=None,
                 lora_rank=None, lora_alpha=None, quantization_config=None,
                 combiner=None, quantization_mode=None, **kwargs):
        for arg, value in (("input_dim", input_dim),
                           ("output_dim", output_dim)):
            if (not isinstance(value, (int, np.integer))
                    or isinstance(value, bool) or value <= 0):
                raise ValueError(f"`{arg}` must be a positive integer, got "
                                 f"{value!r} (of type {type(value).__name__})")
        if lora_rank is not None or lora_alpha is not None:
            raise NotImplementedError(_NO_LORA)
        if quantization_config is not None:
            raise NotImplementedError(
                "CompressedEmbedding takes no quantization_config: its "
                "formats are fixed (see tf_compressed_embedding.quantization);"
                f" use quantize(mode), mode one of {_modes.modes_text()}")
        _bags.check_combiner(combiner, allow_none=True)
        if quantization_mode is not None:
            check_mode(quantization_mode)
        if kwargs.pop("input_length", None) is not None:
            warnings.warn("Argument `input_length` is deprecated (as in "
                          "keras.layers.Embedding). Just remove it.", stacklevel=2)
        super().__init__(**kwargs)
        policy_mode = getattr(self.dtype_policy, "quantization_mode", None)
        if policy_mode is not None:
            # A Keras quantized policy ("int8_from_float32", what a
            # Keras-quantized layer's config carries): its mode, computing
            # in its float source policy.
            if quantization_mode not in (None, policy_mode):
                raise ValueError(
                    f"quantization_mode={quantization_mode!r} contradicts "
                    f"dtype={self.dtype_policy.name!r}; give one of them")
            quantization_mode = check_mode(policy_mode)
            self.dtype_policy = float_policy(self.dtype_policy)
        # Keras wraps every layer's quantize() (in Layer.__new__) with checks
        # that only know Keras' own modes and configs, which would refuse
        # "fp16" and "int8_split"; quantize() below does its own checks, so
        # unwrap it.
        vars(self).pop("quantize", None)
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(
            embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(
            embeddings_constraint)
        self.mask_zero = bool(mask_zero)
        self.combiner = combiner
        # Pooled outputs carry no mask, but pooling consumes incoming masks.
        self.supports_masking = self.mask_zero or combiner is not None
        # Ids are not cast to the compute dtype; the output is, at the end.
        self.autocast = False
        # XLA cannot compile the compressed ops, nor segment sums whose
        # number of segments is only known at run time.
        self.supports_jit = False
        self._quantization_mode = quantization_mode
        # Models that ran this layer in float32 mode (see _note_model).
        self._models_run_in = weakref.WeakSet()
        if weights is not None:
            self.build()
            if not (isinstance(weights, list)
                    and len(weights) == len(self.weights)):
                weights = [weights]
            self.set_weights(weights)

    # ---------------------------------------------------------------- state

    def build(self, input_shape=None):
        """Creates the float32 table, or the compressed variables when the
        layer was constructed with ``quantization_mode``. Input shapes are
        not needed (any id shape works)."""
        if self.built:
            return
        if self._quantization_mode is None:
            self._embeddings = self.add_weight(
                shape=(self.input_dim, self.output_dim),
                initializer=self.embeddings_initializer,
                name="embeddings",
                regularizer=self.embeddings_regularizer,
                constraint=self.embeddings_constraint,
                trainable=True,
                # Under mixed precision, gather and pool in float32 and cast
                # the result (not the whole table) to the compute dtype.
                autocast=False)
        else:
            self._add_compressed_weights(self._quantization_mode)
        self.built = True

    def _add_compressed_weights(self, mode, data=None, scales=None):
        """Adds the non-trainable (data, scales) variables in the layout of
        ``CompressedTable`` (``quantization.data_shape``: records ``[V, R]``
        for the rowwise formats), initialized with ``data``/``scales`` if
        given (so quantize() holds the encoded table once, not zeros plus
        it)."""
        rows = self.input_dim
        data_shape = quantization.data_shape(mode, rows, self.output_dim)
        scales_shape = quantization.scales_shape(mode, rows)
        self.embeddings_data = self.add_weight(
            shape=data_shape,
            initializer=_value_or_zeros(data),
            dtype=quantization.storage_dtype(mode).name,
            name="embeddings_data",
            trainable=False,
            autocast=False)
        self.embeddings_scales = self.add_weight(
            shape=scales_shape,
            initializer=_value_or_zeros(scales),
            dtype="float32",
            name="embeddings_scales",
            trainable=False,
            # The ops take float32 scales, whatever the compute dtype.
            autocast=False)

    @property
    def embeddings(self):
        """The trainable float32 table ``[input_dim, output_dim]`` (float32
        mode only; a quantized layer keeps no float32 copy)."""
        if not self.built:
            raise AttributeError(
                "You must build the layer before accessing `embeddings`.")
        if self._quantization_mode is not None:
            raise AttributeError(
                f"layer {self.name!r} is quantized to "
                f"{self._quantization_mode!r} and keeps no float32 table: "
                f"use `embeddings_data` / `embeddings_scales`, or "
                f"`dequantize()` for the decoded values")
        return self._embeddings

    @property
    def quantization_mode(self):
        """None (float32 table) or the format's name (``"int8"``, ``"int4"``,
        ``"fp16"``, ``"int8_split"``)."""
        return self._quantization_mode

    def _state_variables(self):
        if self._quantization_mode is None:
            return [self._embeddings]
        return [self.embeddings_data, self.embeddings_scales]

    def enable_lora(self, rank, lora_alpha=None, **kwargs):
        """Refused: LoRA adapters are not supported (see ``_NO_LORA``)."""
        raise NotImplementedError(_NO_LORA)

    def quantize(self, mode=None, type_check=True, config=None):
        """Compresses the float32 table in place (Keras' ``quantize`` API).

        The table is encoded with ``tf_compressed_embedding.quantization``
        (``"int8"``: each row's int8 values after its float32 scale;
        ``"int4"``: 16 levels over a per-row range chosen by the greedy error
        search, a float16 scale and bias per row; ``"fp16"``: float16 rows;
        ``"int8_split"``: int8 values and a separate scales array), the
        float32 variable is dropped, and later calls use the compressed ops.
        Nothing is trainable afterwards. Also called by
        ``keras.Model.quantize("int8")`` and ``("int4")``.

        Functions traced before, on the float32 table: the ``predict`` /
        ``evaluate`` / ``fit`` functions of every model that ran this layer
        are reset (as ``keras.Model.quantize`` does), so they are traced
        again on the compressed table. The float32 variable is emptied (to
        ``[0, output_dim]``), which frees its memory even while an optimizer
        or a stale trace holds it, and makes any other function traced on it
        (your own ``tf.function``, a concrete function) fail loudly with
        ``indices[...] = i is not in [0, 0)`` instead of computing in
        float32: trace those again after quantizing.

        Args:
          mode: ``"int8"``, ``"int4"``, ``"fp16"`` or ``"int8_split"``.
          type_check: accepted for ``keras.Model.quantize``; unused.
          config: None, or a Keras config for ``mode`` without a custom
            weight quantizer (the formats are fixed); an
            ``Int4QuantizationConfig``'s ``block_size`` must be None, -1 or
            at least ``output_dim`` (int4 rows have one scale and bias).

        Raises:
          ValueError: the layer is not built, is already quantized, or its
            table holds NaN/Inf (or values beyond float16 for ``"fp16"``,
            rows whose float16 scale or bias would overflow for ``"int4"``),
            or ``config`` asks for what the format cannot do.
          UnsupportedQuantizationModeError (a ValueError): another mode.
        """
        del type_check  # a Keras Model.quantize argument; no subclasses here
        check_mode(mode)
        _modes.check_config(mode, config, self.output_dim)
        if not self.built:
            raise ValueError(
                f"Cannot quantize layer {self.name!r}: it is not built yet "
                f"(call it on some ids or call build() first)")
        if self._quantization_mode is not None:
            raise ValueError(
                f"layer {self.name!r} is already quantized to "
                f"{self._quantization_mode!r}; quantize a float32 layer")
        # Encode before touching the layer, so a refused table (NaN, fp16
        # overflow) leaves it as it was.
        data, scales = quantization.encode(
            to_numpy(self._embeddings), mode)
        float_table = self._embeddings
        self._tracker.unlock()
        try:
            del self._embeddings  # untracks the float32 table
            self._add_compressed_weights(mode, data, scales)
        finally:
            self._tracker.lock()
        self._quantization_mode = mode
        self._is_quantized = True  # Keras' marker of quantized layers
        empty_variable(float_table)
        for model in list(self._models_run_in):
            model.train_function = None
            model.test_function = None
            model.predict_function = None
        self._models_run_in.clear()

    def dequantize(self):
        """The decoded table as a float32 numpy array ``[V, D]`` (the float32
        table itself when the layer is not quantized)."""
        if self._quantization_mode is None:
            return to_numpy(self.embeddings)
        return quantization.decode(
            to_numpy(self.embeddings_data),
            to_numpy(self.embeddings_scales),
            self._quantization_mode, self.output_dim)

    def save_own_variables(self, store):
        """Saves the float32 table as ``"0"``, or the compressed data and
        scales as ``"0"`` and ``"1"`` (no float32 copy)."""
        if not self.built:
            return
        for i, variable in enumerate(self._state_variables()):
            store[str(i)] = variable

    def load_own_variables(self, store):
        """Loads what :meth:`save_own_variables` saved; the layer must have
        been created with the same ``quantization_mode`` (``from_config``
        does that).

        An ``"int8"`` layer also loads what version 0.1.0 saved as
        ``"int8"``: int8 ``[V, D]`` values and float32 ``[V]`` scales (the
        ``"int8_split"`` layout), packed into ``"int8"`` records as they are:
        the decoded table is the same bit for bit.
        """
        if not self.built:
            return
        variables = self._state_variables()
        if self._quantization_mode == "int8" and len(store.keys()) == 2:
            saved = [np.asarray(store[str(i)]) for i in range(2)]
            if _layouts.is_int8_split(saved, self.input_dim, self.output_dim):
                store = {"0": _layouts.int8_records(*saved),
                         "1": np.zeros(quantization.scales_shape(
                             "int8", self.input_dim), np.float32)}
        if len(store.keys()) != len(variables):
            raise ValueError(
                f"layer {self.name!r} "
                f"({_modes.mode_name(self._quantization_mode)}) "
                f"expects {len(variables)} saved variable(s), found "
                f"{len(store.keys())}: the file was saved from a layer in "
                f"another quantization mode")
        for i, variable in enumerate(variables):
            value = np.asarray(store[str(i)])
            if (value.shape != tuple(variable.shape)
                    or value.dtype != np.dtype(variable.dtype)):
                raise ValueError(
                    f"layer {self.name!r}: saved variable {i} is "
                    f"{value.dtype}{list(value.shape)}, expected "
                    f"{variable.dtype}{list(variable.shape)} for "
                    f"{variable.name!r}")
            variable.assign(value)

    def get_config(self):
        """The constructor arguments, with ``quantization_mode``."""
        config = super().get_config()
        config.update({
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "embeddings_initializer": keras.initializers.serialize(
                self.embeddings_initializer),
            "embeddings_regularizer": keras.regularizers.serialize(
                self.embeddings_regularizer),
            "activity_regularizer": keras.regularizers.serialize(
                self.activity_regularizer),
            "embeddings_constraint": keras.constraints.serialize(
                self.embeddings_constraint),
            "mask_zero": self.mask_zero,
            "combiner": self.combiner,
            "quantization_mode": self._quantization_mode,
        })
        return config

    # ----------------------------------------------------------------- call

    def call(self, inputs, weights=None, mask=None, inputs_mask=None):
        """Looks up (``combiner=None``) or pools ids; see the class doc."""
        if mask is None:
            mask = inputs_mask
        if self._quantization_mode is None:
            self._note_model()
        if self.combiner is None:
            if weights is not None:
                raise ValueError(
                    f"layer {self.name!r}: `weights` need a combiner "
                    f"('sum', 'mean' or 'sqrtn'); this layer has none")
            if isinstance(inputs, tf.RaggedTensor):
                # A ragged row per id, as keras.layers.Embedding gives.
                return tf.ragged.map_flat_values(self._rows, inputs)
            if isinstance(inputs, tf.SparseTensor):
                # As keras.layers.Embedding: dense [B, L, D], positions
                # without an id get row 0.
                inputs = tf.sparse.to_dense(inputs)
            return self._rows(tf.convert_to_tensor(inputs))

        bags = self._bags(inputs, weights, mask)
        if self._quantization_mode is None:
            out = pool(self._embeddings.value, bags, self.combiner)
        else:
            out = tfce_ops.fused_decode_axpy(
                self._op_table(), *bags[:3], self.combiner, bags.num_bags)
        # The ops cannot infer the number of bags; the input often can.
        shape = getattr(inputs, "shape", None)
        batch = shape[0] if shape is not None and shape.rank else None
        out = tf.ensure_shape(out, [batch, self.output_dim])
        return tf.cast(out, self.compute_dtype)

    def quantized_call(self, *args, **kwargs):
        """What Keras runs instead of call() once ``quantization_mode`` is set
        (it dispatches on it to ``_int8_call`` etc.); call() handles both
        modes."""
        return self.call(*args, **kwargs)

    def _rows(self, ids):
        """``ids.shape + [D]``: the table's rows, in the compute dtype."""
        ids = self._valid_ids(ids)
        if self._quantization_mode is None:
            # ResourceGather: the table's gradient is IndexedSlices.
            out = tf.gather(self._embeddings.value, ids)
        else:
            out = tfce_ops.compressed_embedding_lookup(self._op_table(), ids)
        return tf.cast(out, self.compute_dtype)

    def _note_model(self):
        """Remembers the model this call runs in, so that quantize() can
        reset the functions that model traced on the float32 table."""
        model = entry_layer()
        if isinstance(model, keras.Model) and model is not self:
            self._models_run_in.add(model)

    def _op_table(self):
        # .value is the tf.Variable itself, which ops._read reads without
        # a copy (a Keras Variable would be converted to a dense tensor).
        return _OpTable(self.embeddings_data.value,
                        self.embeddings_scales.value,
                        self._quantization_mode, self.output_dim)

    def _valid_ids(self, ids):
        return _inputs.valid_ids(ids, self.input_dim, self.name)

    def _bags(self, inputs, weights, mask):
        return _inputs.bags(inputs, weights, mask, self)

    def compute_mask(self, inputs, mask=None):
        """``ids != 0`` with ``mask_zero`` and no combiner (as Keras'
        Embedding); pooled outputs have no mask."""
        if not self.mask_zero or self.combiner is not None:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        """``input_shape + (D,)``, or ``(B, D)`` with a combiner."""
        if self.combiner is None:
            return (*input_shape, self.output_dim)
        return (input_shape[0], self.output_dim)

    def compute_output_spec(self, inputs, weights=None, mask=None,
                            inputs_mask=None):
        """The symbolic output (for functional models): ragged for ragged
        ids without a combiner, dense otherwise."""
        # Only Keras versions with ragged KerasTensors (3.6 on) give ragged
        # inputs, and only they take the argument.
        ragged = self.combiner is None and getattr(inputs, "ragged", False)
        return keras.KerasTensor(self.compute_output_shape(inputs.shape),
                                 dtype=self.compute_dtype,
                                 **({"ragged": True} if ragged else {}))


def _value_or_zeros(value):
    if value is None:
        return "zeros"
    return lambda shape, dtype=None: value


__all__ = ["CompressedEmbedding", "UnsupportedQuantizationModeError"]

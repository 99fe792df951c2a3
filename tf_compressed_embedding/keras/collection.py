"""Many pooled embedding layers in one op call: `CompressedEmbeddingCollection`.

A model with a hundred sparse features has a hundred pooled
``CompressedEmbedding`` layers whose outputs usually meet in one
``Concatenate``. Served, each is its own ``FusedDecodeAxpy`` node and pays
TensorFlow's per-node cost; the collection pools all of them in one
``BatchedFusedDecodeAxpy`` call and returns their outputs side by side, the
``Concatenate``'s result. :func:`quantize_embeddings` (``batch=True``, the
default) puts one in place of each such group.
"""
import keras
import tensorflow as tf

from tf_compressed_embedding import ops as tfce_ops
from tf_compressed_embedding.keras.layer import CompressedEmbedding


@keras.saving.register_keras_serializable(package="tf_compressed_embedding")
class CompressedEmbeddingCollection(keras.layers.Layer):
    """Pools the features of several quantized, pooling ``CompressedEmbedding``
    layers in one op call: ``collection([ids_0, ids_1, ...])`` is
    ``concatenate([layer_0(ids_0), layer_1(ids_1), ...])``, bit for bit,
    computed by one ``BatchedFusedDecodeAxpy`` node.

    Each feature's ids (dense, ragged or sparse) and weights are read as its
    layer reads them (negative ids wrapped, ``mask_zero``, float ids); the
    layers keep their tables and are saved with the collection.

    Args:
      embeddings: two or more ``CompressedEmbedding`` layers, each quantized
        (``quantization_mode`` set) and with a ``combiner``.
      **kwargs: as for any Keras layer (name, ...).

    Call arguments:
      inputs: a list of ids, one per layer.
      weights: None, or a list with None or weights per layer (as the layer
        takes them).

    Raises:
      ValueError: fewer than two layers, a layer that is not a quantized,
        pooling CompressedEmbedding, or inputs of another length.
    """

    def __init__(self, embeddings, **kwargs):
        super().__init__(**kwargs)
        embeddings = list(embeddings)
        if len(embeddings) < 2:
            raise ValueError(f"a CompressedEmbeddingCollection needs two or "
                             f"more layers, got {len(embeddings)}")
        for layer in embeddings:
            if (not isinstance(layer, CompressedEmbedding)
                    or layer.combiner is None
                    or layer.quantization_mode is None):
                raise ValueError(
                    f"every layer of a CompressedEmbeddingCollection must be "
                    f"a quantized CompressedEmbedding with a combiner; "
                    f"{getattr(layer, 'name', layer)!r} is not")
        self.embeddings = embeddings

    def build(self, input_shape=None):
        self.built = True

    def call(self, inputs, weights=None):
        inputs = list(inputs)
        count = len(self.embeddings)
        if len(inputs) != count:
            raise ValueError(f"layer {self.name!r}: inputs must hold one ids "
                             f"tensor per layer ({count}), got {len(inputs)}")
        weights = [None] * count if weights is None else list(weights)
        if len(weights) != count:
            raise ValueError(f"layer {self.name!r}: weights must hold one "
                             f"entry per layer ({count}), got {len(weights)}")
        features = []
        for layer, ids, w in zip(self.embeddings, inputs, weights):
            bags = layer._bags(ids, w, None)  # noqa: SLF001 - the layer's own reading
            features.append(tfce_ops.BatchedBags("segment_ids", bags.ids,
                                                 bags.segment_ids, bags.weights,
                                                 bags.num_bags))
        out = tfce_ops.batched_pool(
            [layer._op_table() for layer in self.embeddings],  # noqa: SLF001
            features, [layer.combiner for layer in self.embeddings], concat=True,
            feature_names=[layer.name for layer in self.embeddings])
        batch = getattr(inputs[0], "shape", None)
        batch = batch[0] if batch is not None and batch.rank else None
        out = tf.ensure_shape(out, [batch, self._width()])
        return tf.cast(out, self.compute_dtype)

    def _width(self):
        return sum(layer.output_dim for layer in self.embeddings)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], self._width())

    def compute_output_spec(self, inputs, weights=None):
        return keras.KerasTensor((inputs[0].shape[0], self._width()),
                                 dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["embeddings"] = [keras.saving.serialize_keras_object(layer)
                                for layer in self.embeddings]
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embeddings"] = [keras.saving.deserialize_keras_object(layer)
                                for layer in config["embeddings"]]
        return cls(**config)


__all__ = ["CompressedEmbeddingCollection"]

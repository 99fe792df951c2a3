"""Keras 3: the `CompressedEmbedding` layer and model conversion.

Importing this registers `CompressedEmbedding` with ``keras.saving`` (the
package does it as soon as Keras is imported, see its docstring).
"""
from tf_compressed_embedding.keras.collection import \
    CompressedEmbeddingCollection
from tf_compressed_embedding.keras.convert import (keras_int4_to_tfce,
                                                   keras_int8_to_tfce,
                                                   quantize_embeddings)
from tf_compressed_embedding.keras.layer import (
    CompressedEmbedding, UnsupportedQuantizationModeError)

__all__ = ["CompressedEmbedding", "CompressedEmbeddingCollection",
           "UnsupportedQuantizationModeError",
           "keras_int4_to_tfce", "keras_int8_to_tfce", "quantize_embeddings"]

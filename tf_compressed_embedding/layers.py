"""The Keras layer under its public name: ``tfce.layers.CompressedEmbedding``
(defined in :mod:`tf_compressed_embedding.keras`)."""
from tf_compressed_embedding.keras import (CompressedEmbedding,
                                           CompressedEmbeddingCollection,
                                           UnsupportedQuantizationModeError,
                                           quantize_embeddings)

__all__ = ["CompressedEmbedding", "CompressedEmbeddingCollection",
           "UnsupportedQuantizationModeError",
           "quantize_embeddings"]

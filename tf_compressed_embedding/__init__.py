"""Compressed (INT8 / FP16) embedding tables for TensorFlow CPU serving.

Rows stay compressed in memory and only the rows a request touches are
decoded, fused with the pooling::

    import tf_compressed_embedding as tfce
    ct = tfce.quantize(table, "int8")
    rows = tfce.compressed_embedding_lookup(ct, ids)
    pooled = tfce.embedding_lookup_sparse(ct, sp_ids, combiner="mean")
"""
from tf_compressed_embedding import _gradients  # noqa: F401  (registers)
from tf_compressed_embedding import _loader
from tf_compressed_embedding._loader import (OpLibraryError, active_isa,
                                             supported_isas)
from tf_compressed_embedding.compressed_table import CompressedTable, quantize
from tf_compressed_embedding.ops import (compressed_embedding_lookup,
                                         embedding_lookup_sparse,
                                         fused_decode_axpy,
                                         safe_embedding_lookup_sparse)
# The Keras 3 layer; importing it registers CompressedEmbedding with
# keras.saving, so .keras files load after `import tf_compressed_embedding`.
from tf_compressed_embedding import layers

__version__ = "0.1.0"

# Registers the ops now, so SavedModels that use them load after an import;
# a failure is raised by the first op call instead (see _loader).
_loader.try_load()

__all__ = [
    "CompressedTable",
    "OpLibraryError",
    "active_isa",
    "compressed_embedding_lookup",
    "embedding_lookup_sparse",
    "fused_decode_axpy",
    "layers",
    "quantize",
    "safe_embedding_lookup_sparse",
    "supported_isas",
]

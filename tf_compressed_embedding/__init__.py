"""Compressed (INT8 / FP16) embedding tables for TensorFlow CPU serving.

Rows stay compressed in memory and only the rows a request touches are
decoded, fused with the pooling::

    import tf_compressed_embedding as tfce
    ct = tfce.quantize(table, "int8")
    rows = tfce.compressed_embedding_lookup(ct, ids)
    pooled = tfce.embedding_lookup_sparse(ct, sp_ids, combiner="mean")

Importing the package is cheap and does not import TensorFlow: the names
below are loaded on first use, and ``tf_compressed_embedding.quantization``
(the storage formats, numpy only) can be used without TensorFlow. The ops
are registered with TensorFlow as soon as TensorFlow is imported (or at
once, if it already is), so SavedModels that use them load after
``import tf_compressed_embedding``, whichever of the two is imported first;
likewise the Keras layer is registered with ``keras.saving`` once Keras is
imported. A library that cannot be loaded is reported by the first op call
(or at once by :func:`load_ops`).
"""
import importlib

from tf_compressed_embedding import _after_import
from tf_compressed_embedding.version import __version__  # noqa: F401

# Public name -> the module that defines it (imported on first access).
_LAZY = {
    "CompressedTable": "tf_compressed_embedding.compressed_table",
    "quantize": "tf_compressed_embedding.compressed_table",
    "batched_embedding_lookup_sparse": "tf_compressed_embedding.ops",
    "compressed_embedding_lookup": "tf_compressed_embedding.ops",
    "embedding_lookup_sparse": "tf_compressed_embedding.ops",
    "fused_decode_axpy": "tf_compressed_embedding.ops",
    "safe_embedding_lookup_sparse": "tf_compressed_embedding.ops",
    "OpLibraryError": "tf_compressed_embedding._loader",
    "active_isa": "tf_compressed_embedding._loader",
    "load_ops": "tf_compressed_embedding._loader",
    "supported_isas": "tf_compressed_embedding._loader",
}
# Submodules reachable as attributes (``tfce.layers.CompressedEmbedding``).
_SUBMODULES = ("keras", "layers", "ops", "quantization")

__all__ = sorted([*_LAZY, "layers", "quantization", "__version__"])


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


def _register_ops():
    # A failure is kept by the loader and raised by the first op call:
    # this runs inside somebody's `import tensorflow`, which must not fail.
    from tf_compressed_embedding import _loader
    _loader.try_load()


def _register_keras_layer():
    # TensorFlow imports Keras while it initializes itself: the layer (which
    # needs both) is imported once TensorFlow is complete.
    _after_import.when_imported("tensorflow", _import_keras_layer)


def _import_keras_layer():
    try:
        importlib.import_module("tf_compressed_embedding.keras.layer")
    except Exception:  # noqa: BLE001 - raised again by `tfce.layers`
        pass


_after_import.when_imported("tensorflow", _register_ops)
_after_import.when_imported("keras", _register_keras_layer)

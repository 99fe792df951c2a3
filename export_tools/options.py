"""The export's choices and defaults, importable without TensorFlow (the
CLI builds its ``--help`` from them before TensorFlow loads)."""
from tf_compressed_embedding.quantization import FORMATS

# "fused": this package's ops; "stock": stock TF ops only (unmodified TF
# Serving).
OPS_MODES = ("fused", "stock")
# `--dtype auto`: a format per table, the smallest of these (or the table
# left FP32) that keeps the outputs within `--max-error`.
AUTO = "auto"
AUTO_FORMATS = ("int4", "int8", "fp16")
DTYPES = FORMATS + (AUTO,)
# Smaller tables stay FP32: their bytes do not matter, and an op per
# lookup of a tiny table costs more than the gather it replaces.
DEFAULT_MIN_ROWS = 1000
DEFAULT_CHUNK_BYTES = 64 << 20   # FP32 bytes read per chunk

__all__ = ["AUTO", "AUTO_FORMATS", "DEFAULT_CHUNK_BYTES", "DEFAULT_MIN_ROWS", "DTYPES",
           "FORMATS", "OPS_MODES"]

"""What the Keras layer tests share: sizes, modes, a table setter, and
what the installed Keras has."""
import inspect

import numpy as np
from keras.quantizers import Int4QuantizationConfig

from tf_compressed_embedding import quantization

V, D, B, L = 50, 12, 7, 5
EPS32 = np.finfo(np.float32).eps
# The layer's quantization modes: every storage format.
MODES = quantization.FORMATS
# Keras 3.15 quantizes int4 in groups of block_size values, with a zero point
# ("int4/<block_size>" policies); Keras 3.13 only per row, without one.
KERAS_INT4_BLOCKS = "block_size" in inspect.signature(
    Int4QuantizationConfig).parameters
NO_INT4_BLOCKS = "this Keras has per-channel int4 only (no block_size)"


def set_table(layer, table):
    """Builds a float32 ``layer`` and gives it ``table``."""
    layer.build()
    layer.embeddings.assign(table)

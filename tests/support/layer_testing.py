"""What the Keras layer tests share: sizes, modes and a table setter."""
import numpy as np

from tf_compressed_embedding import quantization

V, D, B, L = 50, 12, 7, 5
EPS32 = np.finfo(np.float32).eps
# The layer's quantization modes: every storage format.
MODES = quantization.FORMATS


def set_table(layer, table):
    """Builds a float32 ``layer`` and gives it ``table``."""
    layer.build()
    layer.embeddings.assign(table)

"""What the Keras layer tests share: sizes and a table setter."""
import numpy as np

V, D, B, L = 50, 12, 7, 5
EPS32 = np.finfo(np.float32).eps


def set_table(layer, table):
    """Builds a float32 ``layer`` and gives it ``table``."""
    layer.build()
    layer.embeddings.assign(table)

"""The layer's quantization modes (the storage formats) and the checks of a
mode and of a Keras quantization config."""
from tf_compressed_embedding import quantization

# "int8" and "int4" are also Keras' own mode names: keras.Model.quantize
# reaches the layer with them.
QUANTIZATION_MODES = quantization.FORMATS


class UnsupportedQuantizationModeError(ValueError, NotImplementedError):
    """A quantization mode this layer does not implement.

    A ``ValueError`` for callers of :meth:`CompressedEmbedding.quantize`;
    also a ``NotImplementedError`` so that ``keras.Model.quantize("float8")``
    (which skips layers raising that, with a warning) still quantizes the
    other layers of a model that contains this one.
    """


def modes_text():
    return ", ".join(repr(m) for m in QUANTIZATION_MODES)


def check_mode(mode):
    """Returns ``mode`` if it is a quantization mode, else raises
    UnsupportedQuantizationModeError."""
    if mode not in QUANTIZATION_MODES:
        raise UnsupportedQuantizationModeError(
            f"CompressedEmbedding quantization mode must be one of "
            f"{modes_text()}, got {mode!r}")
    return mode


def check_config(mode, config, output_dim):
    """Refuses a Keras quantization config that asks for what the format
    cannot do: a custom quantizer, another mode, or int4 groups narrower
    than a row. Keras' default configs pass (int4's default block_size, 128,
    for rows of at most 128 values).
    """
    if config is None:
        return
    if (getattr(config, "weight_quantizer", None) is not None
            or getattr(config, "mode", mode) != mode):
        raise ValueError(
            "CompressedEmbedding.quantize takes no custom quantization "
            "config: its formats are fixed (see "
            "tf_compressed_embedding.quantization)")
    block_size = getattr(config, "block_size", None)
    if block_size not in (None, -1) and block_size < output_dim:
        raise ValueError(
            f"CompressedEmbedding int4 rows have one scale and bias per row: "
            f"block_size={block_size} would split the {output_dim} values of "
            f"a row into groups; quantize with mode='int4' and no config (or "
            f"block_size=-1)")


def mode_name(mode):
    return "float32" if mode is None else mode

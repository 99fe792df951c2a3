"""Rewrites a trained SavedModel so its FP32 embedding tables are stored
compressed (a format of ``tf_compressed_embedding.quantization``: int8, int4,
fp16, int8_split; or per table the smallest that keeps the outputs within a
bound), with the same signatures.

    from export_tools import compress_saved_model
    report = compress_saved_model("model_fp32", "model_int8", dtype="int8")
    report = compress_saved_model("model_fp32", "model_auto", dtype="auto",
                                  max_error=1e-3)

or on the command line: ``tfce-export SRC DST --dtype int8`` or
``tfce-export SRC DST --dtype auto --max-error 1e-3`` (see ``--help``).
"""
from export_tools.errors import ExportError

__all__ = ["ExportError", "ExportReport", "compress_saved_model"]


def __getattr__(name):
    # Lazy, so `tfce-export` can quiet TensorFlow's logging before TF loads.
    if name == "compress_saved_model":
        from export_tools.compress import compress_saved_model
        return compress_saved_model
    if name == "ExportReport":
        from export_tools.report import ExportReport
        return ExportReport
    raise AttributeError(f"module 'export_tools' has no attribute {name!r}")

"""Rewrites a trained SavedModel so its FP32 embedding tables are stored
compressed (INT8 + per-row scales, or FP16). The rewriter itself is not built
yet; the CLI entry point `tfce-export` is declared so the interface is fixed.
"""

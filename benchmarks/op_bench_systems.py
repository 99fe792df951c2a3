"""The systems op_bench.py times: names, labels, kinds and storage formats
(op_bench_tf.py and op_bench_torch.py build them; op_bench_report.py
reports them)."""

# name -> (label, framework, kind, format)
#   kind: "pool" (weighted-sum pooling, [B, D] out), "pool1t" (the same,
#   capped at 1 thread inside a multi-thread process, for same-process
#   thread scaling; timed only there and at L >= 20), "nopool" (L=1 gather +
#   decode, [B*L, D] out) or "floor" (the empty TF loop, for reference)
#   format: a tfce format of tf_compressed_embedding/quantization.py (int8
#   and int4 rowwise, fp16, int8_split: 0.1.0's int8), "fp32", FBGEMM's own
#   "fbgemm8" / "fbgemm4" rowwise rows, or "none".
SYSTEMS = {
    "tf_elsparse_fp32": ("TF embedding_lookup_sparse fp32", "tf", "pool", "fp32"),
    "tf_gather_segsum_fp32": ("TF gather+segment_sum fp32", "tf", "pool", "fp32"),
    "tf_naive_fp16": ("TF gather fp16+cast+segment_sum", "tf", "pool", "fp16"),
    "tf_naive_int8": ("TF gather int8+cast*scale+segment_sum (split layout)",
                      "tf", "pool", "int8_split"),
    "tfce_fp16": ("tfce fused_decode_axpy fp16", "tf", "pool", "fp16"),
    "tfce_int8": ("tfce fused_decode_axpy int8 (rowwise)", "tf", "pool", "int8"),
    "tfce_int4": ("tfce fused_decode_axpy int4 (rowwise)", "tf", "pool", "int4"),
    "tfce_int8_split": ("tfce fused_decode_axpy int8_split (0.1.0's int8)",
                        "tf", "pool", "int8_split"),
    "pt_fp32_bag": ("FBGEMM embedding_bag fp32", "torch", "pool", "fp32"),
    "pt_fp16_bag": ("FBGEMM embedding_bag fp16", "torch", "pool", "fp16"),
    "pt_int8_bag": ("FBGEMM byte rowwise int8", "torch", "pool", "fbgemm8"),
    "pt_int4_bag": ("FBGEMM 4-bit rowwise", "torch", "pool", "fbgemm4"),
    "tfce_fp16_1t": ("tfce fused_decode_axpy fp16, 1 thread", "tf", "pool1t", "fp16"),
    "tfce_int8_1t": ("tfce fused_decode_axpy int8, 1 thread", "tf", "pool1t", "int8"),
    "tfce_int4_1t": ("tfce fused_decode_axpy int4, 1 thread", "tf", "pool1t", "int4"),
    "pt_fp16_bag_1t": ("FBGEMM embedding_bag fp16, 1 thread", "torch", "pool1t", "fp16"),
    "pt_int8_bag_1t": ("FBGEMM byte rowwise int8, 1 thread", "torch", "pool1t", "fbgemm8"),
    "pt_int4_bag_1t": ("FBGEMM 4-bit rowwise, 1 thread", "torch", "pool1t", "fbgemm4"),
    "tf_gather_fp32": ("tf.gather fp32", "tf", "nopool", "fp32"),
    "keras_int8": ("Keras Embedding int8", "tf", "nopool", "int8"),
    "tf_naive_lookup_fp16": ("TF gather fp16+cast", "tf", "nopool", "fp16"),
    "tf_naive_lookup_int8": ("TF gather int8+cast*scale (split layout)", "tf",
                             "nopool", "int8_split"),
    "tfce_lookup_fp16": ("tfce compressed_embedding_lookup fp16", "tf", "nopool", "fp16"),
    "tfce_lookup_int8": ("tfce compressed_embedding_lookup int8", "tf", "nopool", "int8"),
    "tfce_lookup_int4": ("tfce compressed_embedding_lookup int4", "tf", "nopool", "int4"),
    "tf_loop_floor": ("TF while_loop floor (no op)", "tf", "floor", "none"),
}
REF = "tf_elsparse_fp32"
NOPOOL_REF = "tf_gather_fp32"
SHORT = {
    "tf_elsparse_fp32": "TF elsparse fp32",
    "tf_gather_segsum_fp32": "TF gather+seg fp32",
    "tf_naive_fp16": "TF naive fp16",
    "tf_naive_int8": "TF naive int8 split",
    "tfce_fp16": "tfce fp16",
    "tfce_int8": "tfce int8",
    "tfce_int4": "tfce int4",
    "tfce_int8_split": "tfce int8 split",
    "pt_fp32_bag": "FBGEMM fp32",
    "pt_fp16_bag": "FBGEMM fp16",
    "pt_int8_bag": "FBGEMM int8",
    "pt_int4_bag": "FBGEMM int4",
    "tfce_fp16_1t": "tfce fp16 1t",
    "tfce_int8_1t": "tfce int8 1t",
    "tfce_int4_1t": "tfce int4 1t",
    "pt_fp16_bag_1t": "FBGEMM fp16 1t",
    "pt_int8_bag_1t": "FBGEMM int8 1t",
    "pt_int4_bag_1t": "FBGEMM int4 1t",
    "tf_gather_fp32": "tf.gather fp32",
    "keras_int8": "Keras int8",
    "tf_naive_lookup_fp16": "TF naive lookup fp16",
    "tf_naive_lookup_int8": "TF naive lookup int8 split",
    "tfce_lookup_fp16": "tfce lookup fp16",
    "tfce_lookup_int8": "tfce lookup int8",
    "tfce_lookup_int4": "tfce lookup int4",
    "tf_loop_floor": "TF loop floor",
}


def row_bytes(fmt, dim):
    """Logical bytes of one row, its scale and bias included: int8 (rowwise)
    4 + D, int4 4 + ceil(D/2), int8_split D + its separate 4-byte scale
    (tfce's, as quantization.row_bytes); FBGEMM's 8-bit rows D + 8 (fp32
    scale and bias), its 4-bit rows ceil(D/2) + 4 (fp16 scale and bias)."""
    nibbles = (dim + 1) // 2
    return {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim + 4,
            "int4": nibbles + 4, "int8_split": dim + 4,
            "fbgemm8": dim + 8, "fbgemm4": nibbles + 4, "none": 0}[fmt]

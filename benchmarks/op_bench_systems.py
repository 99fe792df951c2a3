"""The systems op_bench.py times: names, labels, kinds and storage formats
(op_bench_tf.py and op_bench_torch.py build them; op_bench_report.py
reports them)."""

# name -> (label, framework, kind, format)
#   kind: "pool" (weighted-sum pooling, [B, D] out), "pool1t" (the same,
#   capped at 1 thread inside a multi-thread process, for same-process
#   thread scaling; timed only there and at L >= 20), "nopool" (L=1 gather +
#   decode, [B*L, D] out) or "floor" (the empty TF loop, for reference)
SYSTEMS = {
    "tf_elsparse_fp32": ("TF embedding_lookup_sparse fp32", "tf", "pool", "fp32"),
    "tf_gather_segsum_fp32": ("TF gather+segment_sum fp32", "tf", "pool", "fp32"),
    "tf_naive_fp16": ("TF gather fp16+cast+segment_sum", "tf", "pool", "fp16"),
    "tf_naive_int8": ("TF gather int8+cast*scale+segment_sum", "tf", "pool", "int8"),
    "tfce_fp16": ("tfce fused_decode_axpy fp16", "tf", "pool", "fp16"),
    "tfce_int8": ("tfce fused_decode_axpy int8", "tf", "pool", "int8"),
    "pt_fp32_bag": ("FBGEMM embedding_bag fp32", "torch", "pool", "fp32"),
    "pt_fp16_bag": ("FBGEMM embedding_bag fp16", "torch", "pool", "fp16"),
    "pt_int8_bag": ("FBGEMM byte rowwise int8", "torch", "pool", "fbgemm8"),
    "tfce_fp16_1t": ("tfce fused_decode_axpy fp16, 1 thread", "tf", "pool1t", "fp16"),
    "tfce_int8_1t": ("tfce fused_decode_axpy int8, 1 thread", "tf", "pool1t", "int8"),
    "pt_fp16_bag_1t": ("FBGEMM embedding_bag fp16, 1 thread", "torch", "pool1t", "fp16"),
    "pt_int8_bag_1t": ("FBGEMM byte rowwise int8, 1 thread", "torch", "pool1t", "fbgemm8"),
    "tf_gather_fp32": ("tf.gather fp32", "tf", "nopool", "fp32"),
    "keras_int8": ("Keras Embedding int8", "tf", "nopool", "int8"),
    "tf_naive_lookup_fp16": ("TF gather fp16+cast", "tf", "nopool", "fp16"),
    "tf_naive_lookup_int8": ("TF gather int8+cast*scale", "tf", "nopool", "int8"),
    "tfce_lookup_fp16": ("tfce compressed_embedding_lookup fp16", "tf", "nopool", "fp16"),
    "tfce_lookup_int8": ("tfce compressed_embedding_lookup int8", "tf", "nopool", "int8"),
    "tf_loop_floor": ("TF while_loop floor (no op)", "tf", "floor", "none"),
}
REF = "tf_elsparse_fp32"
NOPOOL_REF = "tf_gather_fp32"
SHORT = {
    "tf_elsparse_fp32": "TF elsparse fp32",
    "tf_gather_segsum_fp32": "TF gather+seg fp32",
    "tf_naive_fp16": "TF naive fp16",
    "tf_naive_int8": "TF naive int8",
    "tfce_fp16": "tfce fp16",
    "tfce_int8": "tfce int8",
    "pt_fp32_bag": "FBGEMM fp32",
    "pt_fp16_bag": "FBGEMM fp16",
    "pt_int8_bag": "FBGEMM int8",
    "tfce_fp16_1t": "tfce fp16 1t",
    "tfce_int8_1t": "tfce int8 1t",
    "pt_fp16_bag_1t": "FBGEMM fp16 1t",
    "pt_int8_bag_1t": "FBGEMM int8 1t",
    "tf_gather_fp32": "tf.gather fp32",
    "keras_int8": "Keras int8",
    "tf_naive_lookup_fp16": "TF naive lookup fp16",
    "tf_naive_lookup_int8": "TF naive lookup int8",
    "tfce_lookup_fp16": "tfce lookup fp16",
    "tfce_lookup_int8": "tfce lookup int8",
    "tf_loop_floor": "TF loop floor",
}


def row_bytes(fmt, dim):
    """Logical bytes of one row: int8 counts its fp32 scale, FBGEMM's 8-bit
    rows their inline fp32 scale and bias."""
    return {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim + 4,
            "fbgemm8": dim + 8, "none": 0}[fmt]

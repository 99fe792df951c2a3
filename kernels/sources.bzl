# The op library's C++ sources, each with the compiler flags it alone gets
# (beyond the flags every file gets). Paths are relative to kernels/.
#
# The one table of both builds: kernels/BUILD load()s it (the rules are made
# from it by kernels/build_defs.bzl), setup.py and tools/kernel_objects.py
# read it with ast.literal_eval. So it stays one plain dict literal, valid
# Starlark and valid Python: no expressions, no other statements.
#
#   core/  TF-free: the kernels, dispatch, CPU detection (std only)
#   tf/    the TensorFlow glue: ops, OpKernels, threading, the C ABI
#
# ISA flags are given per file, never globally: a global -mavx2 lets the
# compiler put AVX2 into code that runs at load time, which kills the process
# with SIGILL on CPUs without it. A file with flags of its own is a kernel
# variant: the scalar reference rounds "multiply, then add", never fused;
# each ISA file gets its ISA's flags, and only it. No file contracts
# a * b + c on its own: FMAs are written out where they are meant. The CPU
# features each variant needs are in core/kernel_variants.inc.
KERNEL_SOURCES = {
    "core/cpu_features.cc": [],
    "core/dispatch.cc": [],
    "core/prefetch_policy.cc": [],
    "core/batched_pool.cc": [],
    "core/kernel_scalar.cc": ["-ffp-contract=off"],
    "core/kernel_sse.cc": ["-ffp-contract=off", "-msse4.1"],
    "core/kernel_avx2.cc": ["-ffp-contract=off", "-mavx2", "-mfma", "-mf16c"],
    "core/kernel_avx512.cc": [
        "-ffp-contract=off",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx2",
        "-mfma",
        "-mf16c",
    ],
    "tf/ops.cc": [],
    "tf/compressed_embedding_lookup_op.cc": [],
    "tf/fused_decode_axpy_op.cc": [],
    "tf/batched_fused_decode_axpy_op.cc": [],
    "tf/batched_attrs.cc": [],
    "tf/batched_features.cc": [],
    "tf/bag_inputs.cc": [],
    "tf/op_util.cc": [],
    "tf/table_format.cc": [],
    "tf/parallel_run.cc": [],
    "tf/huge_pages.cc": [],
    "tf/c_api.cc": [],
}

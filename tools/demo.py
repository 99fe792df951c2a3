"""The demo: a recommender-sized embedding table, compressed INT8 and FP16,
looked up and pooled with the fused ops next to TF's stock FP32 ops.

Prints table sizes, the error against FP32 and per-batch latencies (medians
of repeated runs, measured side by side in this process).

    python tools/demo.py [--rows 500000] [--dim 16] [--bags 512] [--ids-per-bag 20]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import tf_compressed_embedding as tfce  # noqa: E402


def median_ms(fn, repeats, inner):
    fn()  # trace / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return 1e3 * float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--bags", type=int, default=512)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    console = Console()

    rng = np.random.default_rng(0)
    with console.status("building the demo table"):
        table = rng.standard_normal((args.rows, args.dim), np.float32) * 0.05
        fp32 = tf.Variable(table, trainable=False)
    with console.status("quantizing INT8 and FP16"):
        compressed = {fmt: tfce.quantize(table, fmt) for fmt in ("int8", "fp16")}

    n = args.bags * args.ids_per_bag
    ids = tf.constant(rng.integers(0, args.rows, n), tf.int64)
    segment_ids = tf.constant(np.repeat(np.arange(args.bags), args.ids_per_bag),
                              tf.int64)
    weights = tf.constant(rng.uniform(0.5, 1.5, n).astype(np.float32))
    sp_ids = tf.SparseTensor(
        tf.stack([segment_ids, tf.tile(tf.range(args.ids_per_bag, dtype=tf.int64),
                                       [args.bags])], 1), ids,
        [args.bags, args.ids_per_bag])
    sp_weights = tf.SparseTensor(sp_ids.indices, weights, sp_ids.dense_shape)

    @tf.function
    def stock_pool():
        return tf.nn.embedding_lookup_sparse(fp32, sp_ids, sp_weights, "mean")

    @tf.function
    def stock_gather():
        return tf.gather(fp32, ids)

    def fused_pool(ct):
        return tf.function(lambda: tfce.fused_decode_axpy(
            ct, ids, segment_ids, weights, "mean", args.bags))

    def lookup(ct):
        return tf.function(lambda: tfce.compressed_embedding_lookup(ct, ids))

    want_pool, want_rows = stock_pool().numpy(), stock_gather().numpy()
    report = Table(title=f"table {args.rows:,} x {args.dim}, batch of "
                         f"{args.bags} bags x {args.ids_per_bag} ids "
                         f"(ops on the '{tfce.active_isa()}' kernels)")
    for col in ("format", "MiB", "size", "pool err", "lookup err",
                "pool ms", "lookup ms"):
        report.add_column(col, justify="right")
    runs = {"fp32 tf.nn": (stock_pool, stock_gather, table.nbytes)}
    runs.update({f"{fmt} tfce": (fused_pool(ct), lookup(ct), ct.nbytes)
                 for fmt, ct in compressed.items()})
    inner = max(1, 2000 // max(1, args.bags * args.ids_per_bag // 1000))
    for name, (pool_fn, lookup_fn, nbytes) in runs.items():
        pool_err = np.abs(pool_fn().numpy() - want_pool).max()
        rows_err = np.abs(lookup_fn().numpy() - want_rows).max()
        report.add_row(
            name, f"{nbytes / 2**20:.1f}", f"{nbytes / table.nbytes:.2f}x",
            f"{pool_err:.2e}", f"{rows_err:.2e}",
            f"{median_ms(pool_fn, args.repeats, min(inner, 50)):.3f}",
            f"{median_ms(lookup_fn, args.repeats, min(inner, 50)):.3f}")
    console.print(report)
    console.print("err: max |output - FP32 output|; pool: weighted mean of "
                  "each bag (FusedDecodeAxpy vs tf.nn.embedding_lookup_sparse)"
                  "; lookup: gather only (CompressedEmbeddingLookup vs "
                  "tf.gather).")
    console.print("Latencies are medians of per-call times, side by side in "
                  "this process; the machine is shared, so treat differences "
                  "under ~20% as noise.")


if __name__ == "__main__":
    main()

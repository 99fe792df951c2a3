"""Proof that no op reads a table with a copy: latency for the same ids must
not grow with the table's size.

    python benchmarks/table_size.py
    python benchmarks/table_size.py --quick   # smoke test: 10k and 100k rows,
                                              # prints, RESULTS.md untouched

Times FusedDecodeAxpy (int8 rowwise records, dim 64, 512 bags x 20 ids, all
ids in rows [0, 1000)) on tables of 10k to 10M rows, in-graph. As a control it repeats
the largest table after a tf.gather on its variable has put it in
copy-on-read mode: first read the plain way (a dense read that copies the
whole table on every call: what a copy costs), then the way tfce reads it
(read_value_no_copy(), as TF's own embedding_lookup_sparse does), which must
stay flat. Writes the table_size section of benchmarks/RESULTS.md.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_compressed_embedding as tfce  # noqa: E402

from _harness import markdown, results  # noqa: E402  (beside this script)
from _harness.timing import median_time  # noqa: E402

DIM, BAGS, PER_BAG, HOT_ROWS, STEPS = 64, 512, 20, 1000, 50


class PlainRead:
    """A table whose .data is read with a plain dense read (the control)."""

    def __init__(self, ct):
        self.ct = ct

    @property
    def data(self):
        return self.ct.data.value()

    @property
    def scales(self):
        return self.ct.scales.value()

    @property
    def format(self):
        return self.ct.format

    @property
    def dim(self):
        return self.ct.dim


def int8_records(rng, rows):
    """An int8 (rowwise) table of random values, scale 0.01: uint8 records
    [float32 scale][DIM int8 values] (tf_compressed_embedding/quantization.py)."""
    data = np.empty((rows, 4 + DIM), np.uint8)
    data[:, :4] = np.full((rows, 1), 0.01, "<f4").view(np.uint8)
    data[:, 4:] = rng.integers(-127, 128, (rows, DIM), dtype=np.int8).view(
        np.uint8)
    return data


def time_per_call(ct, ids, seg, w):
    @tf.function
    def loop():
        def body(i, acc):
            out = tfce.fused_decode_axpy(ct, ids, seg, w, "sum", BAGS)
            return i + 1, acc + out[0, 0]
        return tf.while_loop(lambda i, _: i < STEPS, body,
                             [tf.constant(0), tf.constant(0.0)],
                             parallel_iterations=1)[1]

    return 1e6 * median_time(lambda: loop().numpy(), 7, per_call=STEPS)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="10k and 100k rows only; prints, writes nothing")
    args = parser.parse_args(argv)
    sizes = ((10_000, 100_000) if args.quick
             else (10_000, 100_000, 1_000_000, 10_000_000))
    rng = np.random.default_rng(0)
    n = BAGS * PER_BAG
    ids = tf.constant(rng.integers(0, HOT_ROWS, n), tf.int64)
    seg = tf.constant(np.repeat(np.arange(BAGS), PER_BAG), tf.int64)
    w = tf.constant(rng.uniform(0.5, 1.5, n).astype(np.float32))
    lines = ["Same ids (all in rows [0, 1000)), int8 (rowwise records), dim "
             "64, 512 bags x 20 "
             "ids, 1 call = 1 batch timed in-graph; median µs per call.", "",
             *markdown.header(["table rows", "table MiB", "µs per call"])]
    ct = None
    for rows in sizes:
        ct = tfce.CompressedTable(int8_records(rng, rows),
                                  np.zeros(0, np.float32), "int8", dim=DIM)
        us = time_per_call(ct, ids, seg, w)
        lines.append(f"| {rows:,} | {ct.nbytes / 2**20:,.1f} | {us:,.1f} |")
        print(lines[-1], flush=True)
    # A sparse read puts the variable in copy-on-read mode. Control first:
    # a plain dense read then copies the table on every call.
    tf.gather(ct.data, [0])
    us = time_per_call(PlainRead(ct), ids, seg, w)
    lines.append(f"| {rows:,} in copy-on-read mode, plain dense read (control:"
                 f" what a per-call copy costs) | {ct.nbytes / 2**20:,.1f} | "
                 f"{us:,.1f} |")
    print(lines[-1], flush=True)
    # The op's own read (read_value_no_copy) leaves the mode and never copies.
    tf.gather(ct.data, [0])
    us = time_per_call(ct, ids, seg, w)
    lines.append(f"| {rows:,} in copy-on-read mode, tfce's read | "
                 f"{ct.nbytes / 2**20:,.1f} | {us:,.1f} |")
    print(lines[-1], flush=True)
    if args.quick:
        return
    results.replace_section(
        "table_size", "Latency does not grow with table size "
        "(`python benchmarks/table_size.py`)", "\n".join(lines))


if __name__ == "__main__":
    main()

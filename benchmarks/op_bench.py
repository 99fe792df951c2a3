#!/usr/bin/env python3
"""Op-level side-by-side benchmark: tfce vs stock TF / Keras vs FBGEMM (PyTorch).

Run from the repo root:

    python benchmarks/op_bench.py            # full grid, 1 and 2 threads (~20-30 min on 2 cores)
    python benchmarks/op_bench.py --quick    # smoke test, < 1 min; writes *_quick files only

Subsets: --rows 2M --dims 12,64 --lens 20 --dists uniform,zipf --threads 1
(--systems takes name substrings, e.g. --systems tfce,elsparse,pt_int8).

Outputs (full/subset runs): benchmarks/results/op_bench.csv, the
``op_bench`` section of benchmarks/RESULTS.md (between the markers, replaced on
rerun) and benchmarks/results/op_bench.png. --quick writes
benchmarks/results/op_bench_quick.{csv,md,png} and leaves RESULTS.md alone;
--tag NAME writes op_bench_NAME.{csv,md,png} likewise.

PyTorch (FBGEMM) is a benchmark-only extra: ``pip install --no-deps
torch==2.13.0`` (the CPU wheel; never plain ``pip install torch``, which pulls
the multi-GB CUDA build). Without torch the FBGEMM systems are skipped.
matplotlib (for the chart) is optional too.

Method (same as the design team's perf anchors, see README in this folder):
every system is timed in-graph (TF: one tf.function runs n consecutive batches
in a sequential tf.while_loop, parallel_iterations=1; torch: a Python loop
under inference_mode) over a pool of ~1M pre-generated ids split into batches
of 512 bags x L ids, rotating so consecutive batches touch different rows.
Per system: one untimed call, >= 50 ms warm-up, n calibrated to ~15 ms per
repeat; then 7 repeats round-robin over all systems of the cell in one
process, plus up to 7 more for systems whose median > 1.5x their best repeat.
Reported: median time per batch / (512*L) = ns per looked-up row; GB/s of
logical table bytes touched; speedup = TF embedding_lookup_sparse fp32 time /
system time, measured in the same process. One process per thread count
(TF's intra/inter-op threads must be set before TF initialises): the script
re-invokes itself with --worker and merges the results.
"""
import argparse
import csv
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_md  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
TITLE = ("Op-level side by side: tfce vs TF stock vs FBGEMM "
         "(`python benchmarks/op_bench.py`)")

BAGS = 512
SEED = 20240601

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
    return {"fp32": 4 * dim, "fp16": 2 * dim, "int8": dim + 4,
            "fbgemm8": dim + 8, "none": 0}[fmt]


# --------------------------------------------------------------------------
# command line


def parse_rows(text):
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        mult = 1
        if tok.endswith("k"):
            mult, tok = 1000, tok[:-1]
        elif tok.endswith("m"):
            mult, tok = 1000000, tok[:-1]
        out.append(int(float(tok) * mult))
    return out


def parse_ints(text):
    return [int(t) for t in text.split(",") if t.strip()]


def parse_list(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python benchmarks/op_bench.py --rows 2M --dims 12,64 "
               "--lens 20 --threads 1")
    p.add_argument("--quick", action="store_true",
                   help="tiny grid and short timing, for smoke tests (<1 min); "
                        "writes results/op_bench_quick.* only")
    p.add_argument("--rows", type=parse_rows, default=None,
                   help="table rows, e.g. 100k,2M (default 100k,2M)")
    p.add_argument("--dims", type=parse_ints, default=None,
                   help="embedding dims (default 12,16,32,64,128)")
    p.add_argument("--lens", type=parse_ints, default=None,
                   help="ids per bag L (default 1,20,80)")
    p.add_argument("--dists", type=parse_list, default=None,
                   help="id distributions: uniform,zipf (default both)")
    p.add_argument("--threads", type=parse_ints, default=None,
                   help="thread counts, one process each (default 1,2)")
    p.add_argument("--systems", type=parse_list, default=None,
                   help="only systems whose name contains one of these "
                        "substrings (the reference tf_elsparse_fp32 and, at "
                        "L=1, tf_gather_fp32 are always kept); names: "
                        + ", ".join(SYSTEMS))
    p.add_argument("--torch", choices=["inproc", "subprocess", "off"],
                   default="inproc",
                   help="run FBGEMM/torch in the TF process (default; "
                        "same-process ratios), in a separate process per "
                        "thread count (ratios then cross-process), or not")
    p.add_argument("--bags", type=int, default=BAGS)
    p.add_argument("--zipf-a", type=float, default=1.05)
    p.add_argument("--pool-ids", type=int, default=1 << 20,
                   help="ids pre-generated per cell (default ~1M)")
    p.add_argument("--repeats", type=int, default=None, help="default 7")
    p.add_argument("--target-ms", type=float, default=None,
                   help="calibrated time per repeat (default 15)")
    p.add_argument("--warmup-ms", type=float, default=None,
                   help="minimum warm-up per system (default 50)")
    p.add_argument("--tag", default=None,
                   help="write results/op_bench_TAG.{csv,md,png} instead of "
                        "the canonical files and RESULTS.md")
    p.add_argument("--no-chart", action="store_true")
    # internal: one worker process per thread count
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--frameworks", default="tf,torch", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--proc-id", default="0", help=argparse.SUPPRESS)
    return p


def finish_args(args):
    if args.quick:
        defaults = dict(rows=[100000], dims=[16], lens=[1, 20],
                        dists=["uniform"], threads=[1, 2], repeats=3,
                        target_ms=5.0, warmup_ms=20.0)
        if args.tag is None:
            args.tag = "quick"
    else:
        defaults = dict(rows=[100000, 2000000], dims=[12, 16, 32, 64, 128],
                        lens=[1, 20, 80], dists=["uniform", "zipf"],
                        threads=[1, 2], repeats=7, target_ms=15.0,
                        warmup_ms=50.0)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for d in args.dists:
        if d not in ("uniform", "zipf"):
            raise SystemExit(f"unknown distribution {d!r} (uniform, zipf)")
    return args


def system_selected(args, name):
    if not args.systems:
        return True
    if name in (REF, NOPOOL_REF):
        return True
    return any(s in name for s in args.systems)


# --------------------------------------------------------------------------
# data (numpy only: identical in every process for the same seed)


def make_table(rows, dim):
    """U(-sqrt 3, sqrt 3): unit variance, and 3x faster to make than normal."""
    rng = np.random.default_rng([SEED, rows, dim])
    t = rng.random((rows, dim), dtype=np.float32)
    t *= np.float32(2 * math.sqrt(3))
    t -= np.float32(math.sqrt(3))
    return t


_PERM_CACHE = {}


def zipf_perm_cdf(rows, a):
    key = (rows, a)
    if key not in _PERM_CACHE:
        _PERM_CACHE.clear()
        perm = np.random.default_rng([SEED, rows, 7]).permutation(rows)
        p = np.arange(1, rows + 1, dtype=np.float64) ** (-a)
        cdf = np.cumsum(p)
        cdf /= cdf[-1]
        _PERM_CACHE[key] = (perm, cdf)
    return _PERM_CACHE[key]


def make_pool(rows, dist, length, bags, pool_ids, zipf_a):
    """ids [nb, bags*L] int64 and weights [nb, bags*L] float32, nb >= 2."""
    n = bags * length
    nb = max(2, pool_ids // n)
    rng = np.random.default_rng([SEED, rows, length, 0 if dist == "uniform" else 1])
    if dist == "uniform":
        ids = rng.integers(0, rows, size=nb * n, dtype=np.int64)
    else:
        perm, cdf = zipf_perm_cdf(rows, zipf_a)
        ranks = np.searchsorted(cdf, rng.random(nb * n), side="right")
        ids = perm[np.minimum(ranks, rows - 1)].astype(np.int64)
    w = rng.uniform(0.5, 1.5, size=nb * n).astype(np.float32)
    return ids.reshape(nb, n), w.reshape(nb, n)


class RowStats:
    """Per-row magnitudes for the quantization error bounds."""

    def __init__(self, table):
        hi = table.max(axis=1).astype(np.float64)
        lo = table.min(axis=1).astype(np.float64)
        self.maxabs = np.maximum(hi, -lo)
        self.range = hi - lo


def reference(table, ids, w, bags, pooled):
    rows = table[ids].astype(np.float64)
    if not pooled:
        return rows
    return (rows * w[:, None]).reshape(bags, -1, table.shape[1]).sum(axis=1)


def error_bound(stats, ids, w, bags, fmt, system, ref):
    """Per-output-element tolerance: sum over the bag of |w| * row error."""
    m = stats.maxabs[ids]
    if fmt == "int8":      # symmetric abs-max: error <= max|row| / 254
        e = m / 254.0
    elif fmt == "fbgemm8":  # asymmetric: error <= (max - min) / 255 / 2
        e = stats.range[ids] / 510.0
    elif fmt == "fp16":
        e = m * 2.0 ** -11
        if system == "pt_fp16_bag":  # fp16 weights as well
            e = e * 2.0
    else:
        e = np.zeros_like(m)
    f32 = 1e-5 * m  # float32 accumulation, generous
    tol = np.abs(w).astype(np.float64) * (1.001 * e + f32)
    tol = tol.reshape(bags, -1).sum(axis=1)[:, None] + 1e-6
    if system == "pt_fp16_bag":  # fp16 output rounding
        tol = tol + np.abs(ref) * 2.0 ** -10
    return tol


# --------------------------------------------------------------------------
# timing harness


class Timed:
    """A system bound to a cell: run(n, start) runs n batches from start."""

    def __init__(self, name, run, output):
        self.name = name
        self.run = run
        self.output = output
        self.start = 0
        self.n = 1
        self.times = []  # seconds per batch, one per repeat

    def call(self, n):
        t0 = time.perf_counter()
        self.run(n, self.start)
        dt = time.perf_counter() - t0
        self.start += n
        return dt


def calibrate(sysm, warmup_s, target_s):
    sysm.call(1)  # untimed: tracing, first touch
    n, spent, per = 1, 0.0, None
    while True:
        dt = sysm.call(n)
        spent += dt
        per = dt / n
        if spent >= warmup_s and dt >= min(target_s, warmup_s) * 0.5:
            break
        if dt < target_s:
            n = min(n * 2, max(1, int(2 * target_s / max(per, 1e-9))))
    sysm.n = max(1, int(round(target_s / per)))


def measure(systems, repeats, warmup_s, target_s, on_step=None):
    for s in systems:
        if on_step:
            on_step(f"warm-up {s.name}")
        calibrate(s, warmup_s, target_s)
    for r in range(repeats):
        if on_step:
            on_step(f"repeat {r + 1}/{repeats}")
        k = r % len(systems)
        for s in systems[k:] + systems[:k]:
            s.times.append(s.call(s.n) / s.n)
    # stability pass: up to `repeats` more where the median is far off the best
    unstable = [s for s in systems
                if statistics.median(s.times) > 1.5 * min(s.times)]
    for r in range(repeats if unstable else 0):
        if on_step:
            on_step(f"stability {r + 1}/{repeats} ({len(unstable)} systems)")
        for s in unstable:
            s.times.append(s.call(s.n) / s.n)


# --------------------------------------------------------------------------
# TensorFlow systems


class TFTables:
    """Every variable a TF system reads, for one (rows, dim) table.

    Each variable is read in one way only: the tfce ops and Keras read theirs
    densely (no copy: nothing ever gathers from them, so they never enter
    copy-on-read mode); the stock paths have their own copies and read them
    only with ResourceGather (tf.gather on a ResourceVariable)."""

    def __init__(self, tf, tfce, table, want):
        self.dim = table.shape[1]
        self.ct8 = self.ct16 = self.keras = None
        if "keras_int8" in want:
            # first: Keras' quantize() has the largest temporaries, and the
            # memory it frees is reused by the copies below (lower peak)
            import keras
            emb = keras.layers.Embedding(table.shape[0], self.dim,
                                         embeddings_initializer="zeros",
                                         name="keras_emb")
            emb.build((None,))
            emb.embeddings.assign(table)
            emb.quantize("int8")
            self.keras = emb
        self.v32 = tf.Variable(table, trainable=False, name="fp32")
        need8 = any(n in want for n in ("tfce_int8", "tfce_int8_1t",
                                        "tfce_lookup_int8", "tf_naive_int8"))
        need16 = any(n in want for n in ("tfce_fp16", "tfce_fp16_1t",
                                         "tfce_lookup_fp16", "tf_naive_fp16"))
        if need8:
            self.ct8 = tfce.quantize(table, "int8")
            # stock naive int8: its own copies of the same bytes
            self.q8 = tf.Variable(self.ct8.data.numpy(), trainable=False)
            self.s8 = tf.Variable(self.ct8.scales.numpy(), trainable=False)
        if need16:
            self.ct16 = tfce.quantize(table, "fp16")
            self.h16 = tf.Variable(self.ct16.data.numpy(), trainable=False)


def tf_step_fns(tf, tfce, tabs, bags):
    """name -> step(ids, w, seg, sp_idx) building the graph for one batch."""
    v32 = tabs.v32

    def elsparse(ids, w, seg, sp_idx):
        shape = tf.stack([tf.constant(bags, tf.int64),
                          tf.cast(tf.size(ids) // bags, tf.int64)])
        sp_ids = tf.SparseTensor(sp_idx, ids, shape)
        sp_w = tf.SparseTensor(sp_idx, w, shape)
        return tf.nn.embedding_lookup_sparse(v32, sp_ids, sp_w, combiner="sum")

    def gather_segsum(ids, w, seg, sp_idx):
        return tf.math.segment_sum(tf.gather(v32, ids) * w[:, None], seg)

    def naive_int8(ids, w, seg, sp_idx):
        q = tf.cast(tf.gather(tabs.q8, ids), tf.float32)
        s = tf.gather(tabs.s8, ids)
        return tf.math.segment_sum(q * (s * w)[:, None], seg)

    def naive_fp16(ids, w, seg, sp_idx):
        h = tf.cast(tf.gather(tabs.h16, ids), tf.float32)
        return tf.math.segment_sum(h * w[:, None], seg)

    def fused(ct, max_threads=0):
        def f(ids, w, seg, sp_idx):
            out = tfce.fused_decode_axpy(ct, ids, seg, w, "sum",
                                         num_segments=bags)
            if max_threads:
                # The ops' internal thread cap (kernels/parallel_run.h).
                from tf_compressed_embedding.ops import _with_max_threads
                out = _with_max_threads(out, max_threads)
            return out
        return f

    def lookup(ct):
        def f(ids, w, seg, sp_idx):
            return tfce.compressed_embedding_lookup(ct, ids)
        return f

    def gather(ids, w, seg, sp_idx):
        return tf.gather(v32, ids)

    def naive_lookup_int8(ids, w, seg, sp_idx):
        q = tf.cast(tf.gather(tabs.q8, ids), tf.float32)
        return q * tf.gather(tabs.s8, ids)[:, None]

    def naive_lookup_fp16(ids, w, seg, sp_idx):
        return tf.cast(tf.gather(tabs.h16, ids), tf.float32)

    def keras_int8(ids, w, seg, sp_idx):
        return tabs.keras(ids)

    def floor(ids, w, seg, sp_idx):
        return tf.reshape(tf.cast(ids[0], tf.float32), [1, 1])

    fns = {"tf_elsparse_fp32": elsparse,
           "tf_gather_segsum_fp32": gather_segsum,
           "tf_gather_fp32": gather, "tf_loop_floor": floor}
    if tabs.ct8 is not None:
        fns.update(tf_naive_int8=naive_int8, tfce_int8=fused(tabs.ct8),
                   tfce_int8_1t=fused(tabs.ct8, max_threads=1),
                   tfce_lookup_int8=lookup(tabs.ct8),
                   tf_naive_lookup_int8=naive_lookup_int8)
    if tabs.ct16 is not None:
        fns.update(tf_naive_fp16=naive_fp16, tfce_fp16=fused(tabs.ct16),
                   tfce_fp16_1t=fused(tabs.ct16, max_threads=1),
                   tfce_lookup_fp16=lookup(tabs.ct16),
                   tf_naive_lookup_fp16=naive_lookup_fp16)
    if tabs.keras is not None:
        fns["keras_int8"] = keras_int8
    return fns


def tf_timed(tf, name, step, ids_pool, w_pool, seg, sp_idx):
    """Timed wrapper: one call = n batches in a sequential while_loop."""
    nb, n_ids = ids_pool.shape

    spec = [tf.TensorSpec([None, None], tf.int64),
            tf.TensorSpec([None, None], tf.float32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, 2], tf.int64)]

    def batch(ids_pool, w_pool, b):
        # Slice (not Gather) of whole aligned rows aliases the pool: no copy.
        ids = tf.reshape(tf.slice(ids_pool, [b, 0], [1, -1]), [-1])
        w = tf.reshape(tf.slice(w_pool, [b, 0], [1, -1]), [-1])
        return ids, w

    @tf.function(jit_compile=False, input_signature=spec + [
        tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])
    def loop(ids_pool, w_pool, seg, sp_idx, n, start):
        nbt = tf.shape(ids_pool)[0]

        def body(i, acc):
            ids, w = batch(ids_pool, w_pool, tf.math.floormod(start + i, nbt))
            out = step(ids, w, seg, sp_idx)
            return i + 1, acc + out[0, 0]  # keeps the op alive, costs nothing

        _, acc = tf.while_loop(lambda i, acc: i < n, body,
                               [tf.constant(0), tf.constant(0.0)],
                               parallel_iterations=1)
        return acc

    @tf.function(jit_compile=False, input_signature=spec + [
        tf.TensorSpec([], tf.int32)])
    def one(ids_pool, w_pool, seg, sp_idx, b):
        ids, w = batch(ids_pool, w_pool, b)
        return step(ids, w, seg, sp_idx)

    ids_t = tf.constant(ids_pool)
    w_t = tf.constant(w_pool)
    seg_t = tf.constant(seg)
    sp_t = tf.constant(sp_idx)

    def run(n, start):
        loop(ids_t, w_t, seg_t, sp_t, tf.constant(n, tf.int32),
             tf.constant(start % nb, tf.int32)).numpy()

    def output(b):
        return one(ids_t, w_t, seg_t, sp_t, tf.constant(b, tf.int32)).numpy()

    return Timed(name, run, output)


# --------------------------------------------------------------------------
# PyTorch / FBGEMM systems


class TorchTables:
    def __init__(self, torch, table, want):
        self.w32 = torch.from_numpy(table)  # shares the numpy table
        self.w16 = (self.w32.half() if any(n.startswith("pt_fp16_bag")
                                           for n in want) else None)
        self.p8 = (torch.ops.quantized.embedding_bag_byte_prepack(self.w32)
                   if any(n.startswith("pt_int8_bag") for n in want) else None)


def torch_timed(torch, name, tabs, ids_pool, w_pool, bags):
    """FBGEMM system `name`; a "_1t" name runs on 1 thread (set around each
    timed call) inside a multi-thread process."""
    one_thread = name.endswith("_1t")
    name = name.removesuffix("_1t")
    F = torch.nn.functional
    nb, n_ids = ids_pool.shape
    length = n_ids // bags
    offsets = torch.arange(0, n_ids, length, dtype=torch.int64)
    ids_b = [torch.from_numpy(ids_pool[b]) for b in range(nb)]
    w_b = [torch.from_numpy(w_pool[b]) for b in range(nb)]
    if name == "pt_fp32_bag":
        table = tabs.w32

        def step(b):
            return F.embedding_bag(ids_b[b], table, offsets, mode="sum",
                                   per_sample_weights=w_b[b])
    elif name == "pt_fp16_bag":
        table = tabs.w16
        w_b = [w.half() for w in w_b]

        def step(b):
            return F.embedding_bag(ids_b[b], table, offsets, mode="sum",
                                   per_sample_weights=w_b[b])
    elif name == "pt_int8_bag":
        packed = tabs.p8
        op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets

        def step(b):
            return op(packed, ids_b[b], offsets, False, 0, False, w_b[b],
                      None, False)
    else:
        raise KeyError(name)

    def run(n, start):
        threads = torch.get_num_threads()
        if one_thread:
            torch.set_num_threads(1)
            if torch.get_num_threads() != 1:  # some backends ignore it
                raise RuntimeError(f"{name}_1t: torch did not go to 1 thread")
        try:
            with torch.inference_mode():
                for k in range(n):
                    step((start + k) % nb)
        finally:
            torch.set_num_threads(threads)

    def output(b):
        with torch.inference_mode():
            return step(b).float().numpy()

    return Timed(name + ("_1t" if one_thread else ""), run, output)


# --------------------------------------------------------------------------
# worker: one process, one thread count


def worker_main(args):
    threads = args.threads[0]
    frameworks = set(args.frameworks.split(","))
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                               TextColumn, TimeElapsedColumn)
    console = Console()  # stdout; the parent keeps stderr (TF logs) aside
    meta = {"threads": threads, "proc": args.proc_id,
            "frameworks": sorted(frameworks),
            "loadavg_start": os.getloadavg()[0]}
    tf = tfce = torch = None
    if "tf" in frameworks:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf.get_logger().setLevel("ERROR")  # one tf.function per system: no
        # retracing warnings
        import keras
        import tf_compressed_embedding as tfce
        meta.update(tensorflow=tf.__version__, keras=keras.__version__,
                    tfce_isa=tfce.active_isa())
    if "torch" in frameworks:
        try:
            import torch
        except ImportError:
            console.print("[yellow]torch is not installed: FBGEMM systems "
                          "skipped (pip install --no-deps torch==2.13.0)")
            torch = None
        else:
            torch.set_num_threads(threads)
            try:
                torch.set_num_interop_threads(threads)
            except RuntimeError:
                pass
            meta.update(torch=torch.__version__,
                        torch_cpu=torch.backends.cpu.get_cpu_capability())
    bags = args.bags
    warmup_s, target_s = args.warmup_ms / 1e3, args.target_ms / 1e3
    cells = [(r, d, dist, L) for r in args.rows for d in args.dims
             for dist in args.dists for L in args.lens]
    results = []
    t_start = time.time()
    with Progress(TextColumn(f"[bold]{threads} thread(s)[/] "
                             f"{'+'.join(sorted(frameworks))}"),
                  BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console,
                  transient=False) as progress:
        task = progress.add_task("", total=len(cells))
        current = None
        for (rows, dim, dist, length) in cells:
            cell_name = (f"R={rows:,} D={dim} L={length} {dist}")
            if current != (rows, dim):
                # free the previous table's copies before making the next
                tabs_tf = tabs_pt = table = stats = fns = None
                gc.collect()
                progress.update(task, description=f"{cell_name}: tables")
                table = make_table(rows, dim)
                stats = RowStats(table)
                want = [n for n in SYSTEMS if system_selected(args, n)
                        and (SYSTEMS[n][2] != "nopool" or 1 in args.lens)]
                if tf is not None:
                    tabs_tf = TFTables(tf, tfce, table, want)
                if torch is not None:
                    tabs_pt = TorchTables(torch, table, want)
                current = (rows, dim)
            progress.update(task, description=f"{cell_name}: ids")
            ids_pool, w_pool = make_pool(rows, dist, length, bags,
                                         args.pool_ids, args.zipf_a)
            seg = np.repeat(np.arange(bags, dtype=np.int32), length)
            sp_idx = np.stack([np.repeat(np.arange(bags), length),
                               np.tile(np.arange(length), bags)],
                              axis=1).astype(np.int64)
            systems = []
            fns = tf_step_fns(tf, tfce, tabs_tf, bags) if tf is not None else {}
            for name, (label, fw, kind, fmt) in SYSTEMS.items():
                if not system_selected(args, name):
                    continue
                if kind == "nopool" and length != 1:
                    continue
                if kind == "pool1t" and (threads == 1 or length < 20):
                    continue
                if fw == "tf" and tf is not None:
                    if name in fns:
                        systems.append(tf_timed(tf, name, fns[name], ids_pool,
                                                w_pool, seg, sp_idx))
                elif fw == "torch" and torch is not None:
                    systems.append(torch_timed(torch, name, tabs_pt, ids_pool,
                                               w_pool, bags))
            if not systems:
                progress.advance(task)
                continue
            # correctness, once per cell, on batch 0
            progress.update(task, description=f"{cell_name}: check")
            checks = {}
            refs = {}
            tf_ref_out = None
            for s in systems:
                kind, fmt = SYSTEMS[s.name][2], SYSTEMS[s.name][3]
                if kind == "floor":
                    continue
                pooled = kind in ("pool", "pool1t")
                if pooled not in refs:
                    refs[pooled] = reference(table, ids_pool[0], w_pool[0],
                                             bags, pooled)
                ref = refs[pooled]
                w = w_pool[0] if pooled else np.ones_like(w_pool[0])
                out = s.output(0).astype(np.float64).reshape(ref.shape)
                if s.name == REF:
                    tf_ref_out = out
                tol = error_bound(stats, ids_pool[0], w, bags if pooled
                                  else ids_pool.shape[1], fmt, s.name, ref)
                diff = np.abs(out - ref)
                checks[s.name] = dict(
                    max_abs_err=float(diff.max()),
                    err_over_bound=float((diff / tol).max()),
                    check_ok=bool(np.all(diff <= tol)
                                  and np.all(np.isfinite(out))))
                if not checks[s.name]["check_ok"]:
                    console.print(
                        f"[bold red]WARNING[/] {cell_name} {s.name}: max abs "
                        f"err {diff.max():.4g} exceeds the format's error "
                        f"bound ({checks[s.name]['err_over_bound']:.3g}x)")
            if tf_ref_out is not None:
                for s in systems:
                    if s.name in checks and SYSTEMS[s.name][2] == "pool":
                        out = s.output(0).astype(np.float64)
                        checks[s.name]["max_abs_diff_vs_tf_fp32"] = float(
                            np.abs(out - tf_ref_out).max())
            # timing
            measure(systems, args.repeats, warmup_s, target_s,
                    on_step=lambda m: progress.update(
                        task, description=f"{cell_name}: {m}"))
            for s in systems:
                rec = dict(threads=threads, rows=rows, dim=dim, L=length,
                           dist=dist, bags=bags, system=s.name,
                           n_per_repeat=s.n, proc=args.proc_id,
                           times_s=s.times, pool_batches=ids_pool.shape[0])
                rec.update(checks.get(s.name, {}))
                results.append(rec)
            progress.advance(task)
            med = {s.name: statistics.median(s.times) for s in systems}
            if REF in med:
                tf_time = med[REF] / (bags * length) * 1e9
                best = {k: med[REF] / v for k, v in med.items()
                        if k in ("tfce_int8", "tfce_fp16", "tf_naive_int8",
                                 "pt_int8_bag", "tfce_lookup_int8")}
                progress.console.print(
                    f"  {cell_name}: elsparse {tf_time:.1f} ns/row; speedup "
                    + ", ".join(f"{SHORT[k]} {v:.2f}x" for k, v in best.items()))
            del systems
    meta["seconds"] = time.time() - t_start
    meta["loadavg_end"] = os.getloadavg()[0]
    if tfce is not None:
        from tf_compressed_embedding import _loader
        # Settings the tfce numbers depend on (see kernels/dispatch.h,
        # kernels/parallel_run.h and kernels/huge_pages.h); "off": no table
        # was backed by huge pages.
        for name in ("TFCE_PREFETCH_ROWS", "TFCE_STANDBY_US",
                     "TFCE_MIN_PARALLEL_COST"):
            meta[name.lower()] = os.environ.get(name, "default")
        meta["tfce_huge_pages"] = ("on" if _loader.huge_page_bytes() > 0
                                   else "off")
    with open(args.worker_out, "w") as f:
        json.dump({"meta": meta, "results": results}, f)


# --------------------------------------------------------------------------
# parent: run workers, merge, write CSV / markdown / chart


def worker_cmd(args, threads, frameworks, out, proc_id):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker",
           "--threads", str(threads), "--frameworks", frameworks,
           "--worker-out", out, "--proc-id", proc_id,
           "--rows", ",".join(map(str, args.rows)),
           "--dims", ",".join(map(str, args.dims)),
           "--lens", ",".join(map(str, args.lens)),
           "--dists", ",".join(args.dists),
           "--bags", str(args.bags), "--zipf-a", str(args.zipf_a),
           "--pool-ids", str(args.pool_ids), "--repeats", str(args.repeats),
           "--target-ms", str(args.target_ms),
           "--warmup-ms", str(args.warmup_ms)]
    if args.systems:
        cmd += ["--systems", ",".join(args.systems)]
    return cmd


def summarise(results, torch_mode):
    """Adds medians, ns/row, GB/s and same-process speedups; returns rows."""
    by_cell = {}
    for r in results:
        key = (r["threads"], r["rows"], r["dim"], r["L"], r["dist"])
        by_cell.setdefault(key, {})[r["system"]] = r
    rows = []
    for key, systems in sorted(by_cell.items()):
        threads, nrows, dim, length, dist = key
        ref = systems.get(REF)
        nref = systems.get(NOPOOL_REF)
        for name in SYSTEMS:
            if name not in systems:
                continue
            r = systems[name]
            label, fw, kind, fmt = SYSTEMS[name]
            ts = r["times_s"]
            med = statistics.median(ts)
            n_rows = r["bags"] * length
            rb = row_bytes(fmt, dim)
            out = dict(
                threads=threads, rows=nrows, dim=dim, L=length, dist=dist,
                bags=r["bags"], system=name, label=label, framework=fw,
                kind=kind, format=fmt, row_bytes=rb,
                n_per_repeat=r["n_per_repeat"], repeats=len(ts),
                median_us_per_batch=med * 1e6, min_us_per_batch=min(ts) * 1e6,
                spread=(max(ts) - min(ts)) / med,
                ns_per_row=med / n_rows * 1e9,
                gbps=n_rows * rb / med / 1e9 if rb else "",
                speedup_vs_tf_elsparse="", same_process_as_ref="",
                speedup_vs_tf_gather="",
                max_abs_err=r.get("max_abs_err", ""),
                err_over_bound=r.get("err_over_bound", ""),
                max_abs_diff_vs_tf_fp32=r.get("max_abs_diff_vs_tf_fp32", ""),
                check_ok=r.get("check_ok", ""),
                torch_mode=torch_mode if fw == "torch" else "",
                proc=r["proc"])
            if ref is not None and kind != "floor":
                out["speedup_vs_tf_elsparse"] = (
                    statistics.median(ref["times_s"]) / med)
                out["same_process_as_ref"] = ref["proc"] == r["proc"]
            if nref is not None and kind == "nopool":
                out["speedup_vs_tf_gather"] = (
                    statistics.median(nref["times_s"]) / med)
            rows.append(out)
    return rows


CSV_FIELDS = ["threads", "rows", "dim", "L", "dist", "bags", "system", "label",
              "framework", "kind", "format", "row_bytes", "n_per_repeat",
              "repeats", "median_us_per_batch", "min_us_per_batch", "spread",
              "ns_per_row", "gbps", "speedup_vs_tf_elsparse",
              "same_process_as_ref", "speedup_vs_tf_gather", "max_abs_err",
              "err_over_bound", "max_abs_diff_vs_tf_fp32", "check_ok",
              "torch_mode", "proc"]


def write_csv(path, rows):
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6g}"
        return v
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: fmt(r[k]) for k in CSV_FIELDS})


def fmt_rows(n):
    return f"{n // 1000000}M" if n % 1000000 == 0 else f"{n // 1000}k"


def fmt_num(v):
    if v == "" or v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def geomean(xs):
    xs = [x for x in xs if x not in ("", None) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def loop_floors(rows, threads):
    """{L: median ns/row of the empty TF loop over the cells of this thread
    count}: one value per bag length, as the floor touches no table and its
    per-cell values differ only by noise."""
    by_len = {}
    for r in rows:
        if r["system"] == "tf_loop_floor" and r["threads"] == threads:
            by_len.setdefault(r["L"], []).append(r["ns_per_row"])
    return {L: statistics.median(v) for L, v in by_len.items()}


def pair_speedup(rows, index, a, b, threads, minus_floor=False):
    """Geometric mean over the cells with both of b's time / a's time, as
    "1.23×" (or "–"). minus_floor: the empty TF loop's time (`loop_floors`)
    taken out of both first, for pairs of TF systems; cells where either is
    not above it are left out, and then the text says how many were used."""
    floors = loop_floors(rows, threads) if minus_floor else {}
    rs, cells = [], 0
    for r in rows:
        if r["system"] != a or r["threads"] != threads:
            continue
        other = index.get((threads, r["rows"], r["dim"], r["L"], r["dist"], b))
        if not other:
            continue
        cells += 1
        floor = floors.get(r["L"], 0.0)
        mine, theirs = r["ns_per_row"] - floor, other["ns_per_row"] - floor
        if minus_floor and (r["L"] not in floors or mine <= 0 or theirs <= 0):
            continue
        rs.append(theirs / mine)
    g = geomean(rs)
    if not g:
        return "–"
    used = f" ({len(rs)} of {cells} cells)" if len(rs) < cells else ""
    return f"{g:.2f}×{used}"


SCALING = (("tfce_int8", "tfce int8"), ("tfce_fp16", "tfce fp16"),
           ("pt_int8_bag", "FBGEMM int8"), ("pt_fp16_bag", "FBGEMM fp16"))


def thread_scaling_lines(rows, index):
    """Same-process thread scaling: each system's 1-thread time over its
    N-thread time, both timed round-robin in the N-thread process."""
    multi = sorted({r["threads"] for r in rows if r["kind"] == "pool1t"})
    out = []
    for t in multi:
        cells = sorted({(r["rows"], r["dim"], r["L"], r["dist"]) for r in rows
                        if r["threads"] == t and r["kind"] == "pool1t"},
                       key=lambda c: (c[0], c[3], c[2], c[1]))

        def ratio(cell, name):
            many = index.get((t, *cell, name))
            one = index.get((t, *cell, name + "_1t"))
            return one["ns_per_row"] / many["ns_per_row"] if many and one else None

        def fmt(v):
            return f"{v:.2f}×" if v else "–"

        out += [f"### Thread scaling in one process: {t} threads over 1\n",
                f"In the {t}-thread process, each system also ran capped at 1 "
                "thread (tfce: the ops' internal `_tfce_max_threads` node "
                "attribute; FBGEMM: `torch.set_num_threads(1)` around the "
                "timed loop), interleaved in the same round-robin; cells "
                f"show 1-thread time / {t}-thread time (> 1: the threads "
                "help). Cells with L >= 20; the target rows are the 2M-row "
                "tables at L = 80.\n",
                "| R | D | L | ids | " + " | ".join(n for _, n in SCALING) + " |",
                "|---|---|---|---|" + "---|" * len(SCALING)]
        target = [c for c in cells if c[0] == max(c[0] for c in cells)
                  and c[2] == 80]
        for cell in target:
            R, D, L, dist = cell
            out.append(f"| {fmt_rows(R)} | {D} | {L} | {dist} | " + " | ".join(
                fmt(ratio(cell, n)) for n, _ in SCALING) + " |")
        for label, group in (("geometric mean, these rows", target),
                             (f"geometric mean, the {len(cells)} cells with "
                              "L >= 20", cells)):
            if not group:
                continue
            out.append(f"| {label} | | | | " + " | ".join(
                fmt(geomean([ratio(c, n) or "" for c in group]))
                for n, _ in SCALING) + " |")
        out.append("")
    return out


def markdown(rows, metas, args, elapsed, torch_mode, chart_rel):
    lines = []
    add = lines.append
    threads_list = sorted({r["threads"] for r in rows})
    meta = {}
    for m in metas:
        meta.update({k: v for k, v in m.items()
                     if k not in ("threads", "proc", "frameworks", "seconds",
                                  "loadavg_start", "loadavg_end")})
    cmd = "python benchmarks/op_bench.py " + " ".join(
        a for a in sys.argv[1:])
    add(f"## {TITLE}\n")
    add(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by "
        f"`{cmd.strip()}` in {elapsed / 60:.1f} min at commit "
        f"{args._git}. "
        f"Machine: {results_md.cpu_model()}, {os.cpu_count()} CPUs (shared and noisy: "
        "treat differences under ~20 % as noise). Versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(meta.items())) + ". "
        "1-min load average at the start / end of each worker process "
        "(a value near or above the thread count means other work competed "
        "for the cores): "
        + ", ".join(f"{m['proc']} {m['loadavg_start']:.1f} / "
                    f"{m['loadavg_end']:.1f}" for m in metas) + ".\n")
    add(f"Each number is the median of ≥ {args.repeats} repeats of "
        f"~{args.target_ms:g} ms (after ≥ {args.warmup_ms:g} ms warm-up), "
        "timed in-graph "
        "(TF: n batches per call in a sequential `tf.while_loop`; torch: a "
        "Python loop under `inference_mode`), round-robin over all systems of "
        f"a cell in one process. {args.bags} bags × L ids per batch, "
        "weighted sum (w ~ U[0.5, 1.5)), ids rotate through a ~1M-id pool, "
        f"tables U(−√3, √3) fp32 (unit variance) before compression; Zipf a = {args.zipf_a} with "
        "ranks spread by a fixed permutation. Cells show **ns per looked-up "
        "row** and, in parentheses, the **speedup vs TF "
        "`embedding_lookup_sparse` fp32** measured in the same process "
        "(> 1 = faster). The TF numbers include the while-loop cost "
        "(`TF loop floor`, ns/row of an empty loop body).\n")
    if torch_mode == "subprocess":
        add("**FBGEMM (torch) ran in a separate process from TF: its speedups "
            "are cross-process ratios** (they carry machine-speed drift "
            "between the two processes).\n")
    elif torch_mode == "inproc":
        add("FBGEMM (torch) ran in the same process as TF, interleaved in "
            "the same round-robin, so its speedups are same-process ratios.\n")
    pooled = [n for n in SYSTEMS if SYSTEMS[n][2] == "pool"]
    nopool = [n for n in SYSTEMS if SYSTEMS[n][2] == "nopool"]

    def cells_of(t):
        return sorted({(r["rows"], r["dim"], r["L"], r["dist"])
                       for r in rows if r["threads"] == t},
                      key=lambda c: (c[0], c[3], c[2], c[1]))

    index = {(r["threads"], r["rows"], r["dim"], r["L"], r["dist"],
              r["system"]): r for r in rows}
    # summary
    add("### Summary: geometric-mean speedup over the cells run\n")
    add("Pooled systems vs TF `embedding_lookup_sparse` fp32; the L = 1 "
        "no-pooling systems vs `tf.gather` fp32 (their speedup vs "
        "elsparse is in the CSV). > 1 = faster.\n")
    present = [n for n in pooled + nopool
               if any(r["system"] == n for r in rows)]
    add("| system | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}"
                                    for t in threads_list) + " |")
    add("|---|" + "---|" * len(threads_list))
    for n in present:
        vals = []
        for t in threads_list:
            col = ("speedup_vs_tf_gather" if SYSTEMS[n][2] == "nopool"
                   else "speedup_vs_tf_elsparse")
            g = geomean([r[col] for r in rows
                         if r["system"] == n and r["threads"] == t])
            vals.append(f"{g:.2f}×" if g else "–")
        ref_name = (" (vs tf.gather)" if SYSTEMS[n][2] == "nopool"
                    else "")
        add(f"| {SYSTEMS[n][0]}{ref_name} | " + " | ".join(vals) + " |")
    for a, b in (("tfce_int8", "pt_int8_bag"), ("tfce_fp16", "pt_fp16_bag"),
                 ("tfce_int8", "tf_naive_int8"), ("tfce_int8", "pt_fp32_bag"),
                 ("tfce_lookup_int8", "tf_naive_lookup_int8"),
                 ("tfce_lookup_fp16", "tf_naive_lookup_fp16")):
        vals = [pair_speedup(rows, index, a, b, t)
                for t in threads_list]
        if any(v != "–" for v in vals):
            add(f"| *{SHORT[a]} speedup over {SHORT[b]}* | "
                + " | ".join(vals) + " |")
    floor_pairs = (("tfce_int8", "tf_elsparse_fp32"),
                   ("tfce_fp16", "tf_elsparse_fp32"),
                   ("tfce_lookup_int8", "tf_naive_lookup_int8"),
                   ("tfce_lookup_fp16", "tf_naive_lookup_fp16"))
    floor_rows = [(a, b, [pair_speedup(rows, index, a, b, t, True)
                          for t in threads_list])
                  for a, b in floor_pairs]
    floor_rows = [x for x in floor_rows if any(v != "–" for v in x[2])]
    if floor_rows:
        add("")
        add("The same ratios for TF pairs with the empty loop's time "
            "taken out of both (`TF loop floor`, its median over the cells "
            "of the same thread count and L), i.e. the per-call cost of the "
            "ops themselves; at L = 1 the loop is most of a batch's time. "
            "Derived from the numbers above, not a separate measurement, and "
            "noisier than they are (a difference of two noisy times):\n")
        add("| pair, loop floor taken out | " + " | ".join(
            f"{t} thread{'s' if t > 1 else ''}" for t in threads_list) + " |")
        add("|---|" + "---|" * len(threads_list))
        for a, b, vals in floor_rows:
            add(f"| *{SHORT[a]} speedup over {SHORT[b]}* | "
                + " | ".join(vals) + " |")
    add("")
    for t in threads_list:
        cells = cells_of(t)
        cols = [n for n in pooled if any(r["system"] == n and r["threads"] == t
                                         for r in rows)]
        add(f"### {t} thread{'s' if t > 1 else ''}: weighted-sum pooling, "
            "ns/row (speedup vs TF elsparse fp32)\n")
        add("| R | D | L | ids | " + " | ".join(SHORT[c] for c in cols)
            + " | TF loop floor |")
        add("|---|---|---|---|" + "---|" * (len(cols) + 1))
        for (R, D, L, dist) in cells:
            vals = []
            for c in cols:
                r = index.get((t, R, D, L, dist, c))
                if r is None:
                    vals.append("–")
                elif c == REF:
                    vals.append(f"**{fmt_num(r['ns_per_row'])}**")
                else:
                    sp = r["speedup_vs_tf_elsparse"]
                    mark = "" if r["check_ok"] in (True, "") else " ⚠"
                    vals.append(f"{fmt_num(r['ns_per_row'])} "
                                f"({sp:.2f}){mark}" if sp != "" else
                                fmt_num(r["ns_per_row"]))
            fl = index.get((t, R, D, L, dist, "tf_loop_floor"))
            vals.append(fmt_num(fl["ns_per_row"]) if fl else "–")
            add(f"| {fmt_rows(R)} | {D} | {L} | {dist} | "
                + " | ".join(vals) + " |")
        add("")
        add(f"GB/s of logical table bytes touched ({t} thread"
            f"{'s' if t > 1 else ''}; fp32 4D, fp16 2D, int8 D+4 incl. the "
            "scale, FBGEMM int8 D+8):\n")
        add("| R | D | L | ids | " + " | ".join(SHORT[c] for c in cols) + " |")
        add("|---|---|---|---|" + "---|" * len(cols))
        for (R, D, L, dist) in cells:
            vals = []
            for c in cols:
                r = index.get((t, R, D, L, dist, c))
                vals.append(f"{r['gbps']:.2f}" if r else "–")
            add(f"| {fmt_rows(R)} | {D} | {L} | {dist} | "
                + " | ".join(vals) + " |")
        add("")
        np_cells = [c for c in cells if c[2] == 1]
        ncols = [n for n in nopool if any(r["system"] == n and r["threads"] == t
                                          for r in rows)]
        if np_cells and ncols:
            add(f"### {t} thread{'s' if t > 1 else ''}: L = 1 without pooling "
                "(gather + decode, [512, D] out), ns/row (speedup vs "
                "tf.gather fp32)\n")
            add("| R | D | ids | " + " | ".join(SHORT[c] for c in ncols)
                + " | TF elsparse fp32 (pooled) |")
            add("|---|---|---|" + "---|" * (len(ncols) + 1))
            for (R, D, L, dist) in np_cells:
                vals = []
                for c in ncols:
                    r = index.get((t, R, D, L, dist, c))
                    if r is None:
                        vals.append("–")
                    elif c == NOPOOL_REF:
                        vals.append(f"**{fmt_num(r['ns_per_row'])}**")
                    else:
                        mark = "" if r["check_ok"] in (True, "") else " ⚠"
                        vals.append(f"{fmt_num(r['ns_per_row'])} "
                                    f"({r['speedup_vs_tf_gather']:.2f}){mark}")
                ref = index.get((t, R, D, L, dist, REF))
                vals.append(fmt_num(ref["ns_per_row"]) if ref else "–")
                add(f"| {fmt_rows(R)} | {D} | {dist} | " + " | ".join(vals)
                    + " |")
            add("")
    bad = [r for r in rows if r["check_ok"] is False]
    lines.extend(thread_scaling_lines(rows, index))
    add("### Correctness\n")
    add("Once per cell, each system's output for one batch is compared with a "
        "float64 numpy reference on the fp32 table, against the format's "
        "worst-case quantization bound (Σ|w|·row error: int8 max|row|/254, "
        "FBGEMM int8 (max−min)/510, fp16 max|row|·2⁻¹¹, plus fp32 rounding). "
        "The CSV has max_abs_err, err_over_bound (≤ 1 passes) and, for pooled "
        "systems, max_abs_diff_vs_tf_fp32. A fixed threshold such as 0.05 "
        "would flag int8 from L = 20 on unit-variance tables (the rounding "
        "errors of 20–80 weighted rows add up to 0.05–0.15 at the tails); "
        "the bound scales with L and the rows' magnitudes.\n")
    if bad:
        add(f"**{len(bad)} system-cells exceeded their bound (⚠):** "
            + ", ".join(f"{r['system']} @ {fmt_rows(r['rows'])}/D{r['dim']}/"
                        f"L{r['L']}/{r['dist']}/{r['threads']}t "
                        f"({r['err_over_bound']:.3g}×)" for r in bad[:20])
            + "\n")
    else:
        mx = {}
        for r in rows:
            if r["max_abs_err"] != "":
                mx[r["format"]] = max(mx.get(r["format"], 0), r["max_abs_err"])
        add("All outputs within their bounds. Largest max abs error by "
            "format: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                   sorted(mx.items())) + ".\n")
    if chart_rel:
        add(f"![ns per row]({chart_rel})\n")
    add("Full data (per system: median/min µs per batch, spread, ns/row, "
        "GB/s, speedups, errors): `" + os.path.relpath(
            args._csv_path, HERE) + "`.\n")
    return "\n".join(lines)


def chart(path, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return False
    pooled = [r for r in rows if r["kind"] == "pool"]
    if not pooled:
        return False
    R = max(r["rows"] for r in pooled)
    lens = sorted({r["L"] for r in pooled if r["rows"] == R})
    L = 20 if 20 in lens else max(lens)
    dims_all = sorted({r["dim"] for r in pooled if r["rows"] == R and r["L"] == L})
    dims = [d for d in (12, 32, 128) if d in dims_all] or dims_all
    if len(dims) < 2 and len(dims_all) > len(dims):
        dims = dims_all
    threads = sorted({r["threads"] for r in pooled})
    dists = [d for d in ("uniform", "zipf")
             if any(r["dist"] == d for r in pooled)]
    systems = [n for n in SYSTEMS if SYSTEMS[n][2] == "pool"
               and any(r["system"] == n for r in pooled)]
    colors = {"tf_elsparse_fp32": "#7f7f7f", "tf_gather_segsum_fp32": "#bcbd22",
              "tf_naive_fp16": "#c5b0d5", "tf_naive_int8": "#9467bd",
              "tfce_fp16": "#98df8a", "tfce_int8": "#2ca02c",
              "pt_fp32_bag": "#aec7e8", "pt_fp16_bag": "#6baed6",
              "pt_int8_bag": "#1f77b4"}
    fig, axes = plt.subplots(len(threads), len(dists), squeeze=False,
                             figsize=(5.5 * len(dists) + 1.5,
                                      3.6 * len(threads)), sharey=True)
    idx = {(r["threads"], r["dist"], r["dim"], r["system"]): r
           for r in pooled if r["rows"] == R and r["L"] == L}
    width = 0.8 / len(systems)
    for i, t in enumerate(threads):
        for j, dist in enumerate(dists):
            ax = axes[i][j]
            for k, s in enumerate(systems):
                xs, ys = [], []
                for x, d in enumerate(dims):
                    r = idx.get((t, dist, d, s))
                    if r:
                        xs.append(x - 0.4 + (k + 0.5) * width)
                        ys.append(r["ns_per_row"])
                ax.bar(xs, ys, width, label=SHORT[s], color=colors.get(s))
            ax.set_yscale("log")
            ax.set_xticks(range(len(dims)))
            ax.set_xticklabels([f"D={d}" for d in dims])
            ax.set_title(f"{fmt_rows(R)} rows, L={L}, {dist} ids, "
                         f"{t} thread{'s' if t > 1 else ''}", fontsize=10)
            ax.grid(axis="y", which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("ns per looked-up row (log, lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / (5.5 * len(dists) + 1.5), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def git_state():
    try:
        root = os.path.dirname(HERE)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                              cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--",
                                "kernels", "tf_compressed_embedding"],
                               cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (kernels/ or package modified)" if dirty else "")


def parent_main(args):
    from rich.console import Console
    console = Console()
    t0 = time.time()
    args._git = git_state()
    load = os.getloadavg()[0]
    if load >= 0.75:
        console.print(f"[yellow]note: 1-min load average is {load:.1f} "
                      "before the benchmark starts: other work competes for "
                      "the cores, timings will be noisy (2-thread FBGEMM, "
                      "whose OpenMP threads wait for each other, suffers "
                      "most)")
    torch_mode = args.torch
    if torch_mode != "off":
        try:
            import importlib.util
            if importlib.util.find_spec("torch") is None:
                raise ImportError
        except ImportError:
            console.print("[yellow]torch is not installed: FBGEMM systems "
                          "skipped. Install the CPU wheel with "
                          "`pip install --no-deps torch==2.13.0`.")
            torch_mode = "off"
    if args.systems and not any(
            SYSTEMS[n][1] == "torch" and system_selected(args, n)
            for n in SYSTEMS):
        torch_mode = "off"
    runs = []
    for t in args.threads:
        if torch_mode == "inproc":
            runs.append((t, "tf,torch", f"t{t}"))
        elif torch_mode == "subprocess":
            runs += [(t, "tf", f"t{t}-tf"), (t, "torch", f"t{t}-torch")]
        else:
            runs.append((t, "tf", f"t{t}"))
    ncells = (len(args.rows) * len(args.dims) * len(args.lens)
              * len(args.dists))
    console.print(f"[bold]op_bench[/]: {ncells} cells x {len(args.threads)} "
                  f"thread counts, torch {torch_mode}, "
                  f"{len(runs)} worker process(es)")
    results, metas = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for threads, fws, proc_id in runs:
            out = os.path.join(tmp, f"{proc_id}.json")
            env = dict(os.environ)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            env["OMP_NUM_THREADS"] = str(threads)
            log = os.path.join(tmp, f"{proc_id}.log")
            with open(log, "w") as err:
                rc = subprocess.call(
                    worker_cmd(args, threads, fws, out, proc_id), env=env,
                    stderr=err)
            if rc != 0:
                with open(log) as err:
                    tail = err.read()[-6000:]
                console.print(tail, markup=False, highlight=False)
                raise SystemExit(f"worker for {threads} thread(s) ({fws}) "
                                 f"failed with exit code {rc} (its stderr "
                                 "is above)")
            with open(out) as f:
                data = json.load(f)
            results += data["results"]
            metas.append(data["meta"])
    elapsed = time.time() - t0
    rows = summarise(results, torch_mode)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    stem = "op_bench" if args.tag is None else f"op_bench_{args.tag}"
    csv_path = os.path.join(RESULTS_DIR, stem + ".csv")
    args._csv_path = csv_path
    write_csv(csv_path, rows)
    png_path = os.path.join(RESULTS_DIR, stem + ".png")
    chart_rel = None
    if not args.no_chart and chart(png_path, rows):
        chart_rel = os.path.relpath(png_path, HERE)
    section = markdown(rows, metas, args, elapsed, torch_mode, chart_rel)
    if args.tag is None:
        md_path = results_md.PATH
        title_line = f"## {TITLE}\n"
        assert section.startswith(title_line)
        results_md.replace_section("op_bench", TITLE,
                                   section[len(title_line):].lstrip("\n"))
    else:
        md_path = os.path.join(RESULTS_DIR, stem + ".md")
        with open(md_path, "w") as f:
            f.write(section.replace("](results/", "](") + "\n")
    bad = [r for r in rows if r["check_ok"] is False]
    if bad:
        console.print(f"[bold red]WARNING: {len(bad)} system-cells exceeded "
                      "their quantization error bound (see the CSV)")
    console.print(f"done in {elapsed:.0f} s: {csv_path}, {md_path}"
                  + (f", {png_path}" if chart_rel else ""))


def main(argv=None):
    args = finish_args(build_parser().parse_args(argv))
    if args.worker:
        worker_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Op-level side-by-side benchmark: tfce vs stock TF / Keras vs FBGEMM (PyTorch).

Run from the repo root:

    python benchmarks/op_bench.py            # full grid, 1 and 2 threads (~10-15 min on 2 cores)
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

This file: the command line, the workloads (tables, ids, reference outputs
and error bounds) and the parent process. The worker's loop over cells:
op_bench_worker.py; the systems: op_bench_systems.py (names),
op_bench_tf.py, op_bench_torch.py; the report: op_bench_report.py; timing,
worker processes and results: _harness/.
"""
import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time

import numpy as np

import op_bench_report as report
from _harness import host, results, workers
from op_bench_systems import NOPOOL_REF, REF, SYSTEMS

HERE = os.path.dirname(os.path.abspath(__file__))
BAGS = 512
SEED = 20240601


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
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
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


def table_cache(cache_dir, rows, dim):
    """``cached(key, make)`` for the encodings of the (rows, dim) table:
    make()'s numpy array, saved in ``cache_dir`` by the first worker that
    makes it and loaded by the others (None: no cache, always make())."""
    def cached(key, make):
        if cache_dir is None:
            return make()
        path = os.path.join(cache_dir, f"{key}_{rows}x{dim}_{SEED}.npy")
        if os.path.exists(path):
            return np.load(path)
        array = make()
        np.save(path + ".part.npy", array)
        os.replace(path + ".part.npy", path)
        return array
    return cached


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


def _formats():
    """tf_compressed_embedding/quantization.py, the formats' one definition
    (numpy only), loaded on its own: importing the package would load
    TensorFlow and the op library into the torch-only worker of --torch
    subprocess."""
    path = os.path.join(os.path.dirname(HERE), "tf_compressed_embedding",
                        "quantization.py")
    spec = importlib.util.spec_from_file_location("tfce_formats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FORMATS = _formats()


def fbgemm4_row_error(maxabs, row_range, search):
    """The largest |decode - x| in an FBGEMM 4-bit row (a tfce-independent
    derivation from FBGEMM's prepack): the row's range [a, b] (its min/max,
    or what the range search kept: at least (min_bins - 1) of its
    FBGEMM4_NBINS steps, min_bins = int(NBINS * (1 - RATIO)), so at most
    clip = (NBINS - min_bins + 1) / NBINS of the row's range is cut off);
    bias = fp16(a), scale = fp16((b - bias) / 15). A value inside [bias,
    bias + 15 scale] is within half a step, range / 30 (scale's float16
    rounding included below); one outside (clipped) is within its distance
    to the range, at most clip * range, plus the float16 roundings of the
    bias (|a| 2^-11) and of the range's top (15 scale vs b - bias:
    range 2^-11). The sum of all the terms bounds both cases."""
    from op_bench_torch import FBGEMM4_NBINS, FBGEMM4_RATIO
    clip = 0.0
    if search:
        min_bins = int(FBGEMM4_NBINS * (1.0 - FBGEMM4_RATIO))
        clip = (FBGEMM4_NBINS - min_bins + 1) / FBGEMM4_NBINS
    return (row_range / 30.0 + clip * row_range
            + (maxabs + row_range) * 2.0 ** -10)


def error_bound(stats, ids, w, bags, fmt, system, ref, fbgemm4_search=True):
    """Per-output-element tolerance: sum over the bag of |w| * row error.

    ``fbgemm4_search``: FBGEMM's 4-bit rows were packed with its range
    search (op_bench_torch.fbgemm4_search), which may clip."""
    m = stats.maxabs[ids]
    system = system.removesuffix("_1t")
    if fmt in FORMATS.FORMATS:  # tfce's formats (stock TF and FBGEMM fp16
        # store the same float16 values, the stock int8 path int8_split's)
        e = FORMATS.max_decode_error(fmt, m)
        if system == "pt_fp16_bag":  # fp16 weights as well
            e = e * 2.0
    elif fmt == "fbgemm8":
        # FBGEMM's own asymmetric 8-bit rows, not a tfce format: scale =
        # (max - min) / 255 and a bias, so the error is at most half a step,
        # (max - min) / 510 (embedding_bag_byte_prepack in FBGEMM's
        # QuantUtils).
        e = stats.range[ids] / 510.0
    elif fmt == "fbgemm4":
        e = fbgemm4_row_error(m, stats.range[ids], fbgemm4_search)
    else:
        e = np.zeros_like(m)
    f32 = 1e-5 * m  # float32 accumulation, generous
    tol = np.abs(w).astype(np.float64) * (1.001 * e + f32)
    tol = tol.reshape(bags, -1).sum(axis=1)[:, None] + 1e-6
    if system == "pt_fp16_bag":  # fp16 output rounding
        tol = tol + np.abs(ref) * 2.0 ** -10
    return tol


# --------------------------------------------------------------------------
# correctness: each system against a float64 reference, within its bound


def check_outputs(systems, table, stats, ids_pool, w_pool, bags, warn,
                  fbgemm4_search=True):
    """Each system's output for batch 0 against the float64 reference,
    within its format's error bound; {system: check columns}."""
    checks, refs = {}, {}
    tf_ref_out = None
    for s in systems:
        kind, fmt = SYSTEMS[s.name][2], SYSTEMS[s.name][3]
        if kind == "floor":
            continue
        pooled = kind in ("pool", "pool1t")
        if pooled not in refs:
            refs[pooled] = reference(table, ids_pool[0], w_pool[0], bags,
                                     pooled)
        ref = refs[pooled]
        w = w_pool[0] if pooled else np.ones_like(w_pool[0])
        out = s.output(0).astype(np.float64).reshape(ref.shape)
        if s.name == REF:
            tf_ref_out = out
        tol = error_bound(stats, ids_pool[0], w, bags if pooled
                          else ids_pool.shape[1], fmt, s.name, ref,
                          fbgemm4_search)
        diff = np.abs(out - ref)
        checks[s.name] = dict(
            max_abs_err=float(diff.max()),
            err_over_bound=float((diff / tol).max()),
            check_ok=bool(np.all(diff <= tol) and np.all(np.isfinite(out))))
        if not checks[s.name]["check_ok"]:
            warn(f"{s.name}: max abs err {diff.max():.4g} exceeds the "
                 f"format's error bound "
                 f"({checks[s.name]['err_over_bound']:.3g}x)")
    if tf_ref_out is not None:
        for s in systems:
            if s.name in checks and SYSTEMS[s.name][2] == "pool":
                out = s.output(0).astype(np.float64)
                checks[s.name]["max_abs_diff_vs_tf_fp32"] = float(
                    np.abs(out - tf_ref_out).max())
    return checks


# --------------------------------------------------------------------------
# parent: run workers, merge, write CSV / markdown / chart


def worker_cmd(args, threads, frameworks, out, proc_id, cache_dir):
    cmd = [sys.executable, os.path.join(HERE, "op_bench_worker.py"),
           "--worker", "--cache-dir", cache_dir,
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


def worker_runs(args, console):
    """(threads, frameworks, process id) of each worker to run, and the
    torch mode the report states."""
    torch_mode = args.torch
    if torch_mode != "off" and importlib.util.find_spec("torch") is None:
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
    return runs, torch_mode


def parent_main(args):
    from rich.console import Console
    console = Console()
    t0 = time.time()
    args.git_commit = host.commit()
    load = os.getloadavg()[0]
    if load >= 0.75:
        console.print(f"[yellow]note: 1-min load average is {load:.1f} "
                      "before the benchmark starts: other work competes for "
                      "the cores, timings will be noisy (2-thread FBGEMM, "
                      "whose OpenMP threads wait for each other, suffers "
                      "most)")
    runs, torch_mode = worker_runs(args, console)
    ncells = (len(args.rows) * len(args.dims) * len(args.lens)
              * len(args.dists))
    console.print(f"[bold]op_bench[/]: {ncells} cells x {len(args.threads)} "
                  f"thread counts, torch {torch_mode}, "
                  f"{len(runs)} worker process(es)")
    records, metas = [], []
    with tempfile.TemporaryDirectory() as tmp:
        # Encoded tables that are slow to make (int4's and FBGEMM 4-bit's
        # range searches), shared by the workers.
        cache_dir = os.path.join(tmp, "tables")
        os.makedirs(cache_dir)
        for threads, fws, proc_id in runs:
            out = os.path.join(tmp, f"{proc_id}.json")
            data = workers.run_worker(
                worker_cmd(args, threads, fws, out, proc_id, cache_dir),
                workers.child_env(threads), out,
                os.path.join(tmp, f"{proc_id}.log"),
                f"worker for {threads} thread(s) ({fws})")
            records += data["results"]
            metas.append(data["meta"])
    elapsed = time.time() - t0
    rows = report.summarise(records, torch_mode)
    stem = "op_bench" if args.tag is None else f"op_bench_{args.tag}"
    csv_path = os.path.join(results.RESULTS_DIR, stem + ".csv")
    args.csv_path = csv_path
    results.write_csv(csv_path, rows, fields=report.CSV_FIELDS,
                      float_format="{:.6g}")
    png_path = os.path.join(results.RESULTS_DIR, stem + ".png")
    chart_rel = None
    if not args.no_chart and report.chart(png_path, rows):
        chart_rel = os.path.relpath(png_path, HERE)
    section = report.markdown(rows, metas, args, elapsed, torch_mode,
                              chart_rel)
    if args.tag is None:
        md_path = results.PATH
        title_line = f"## {report.TITLE}\n"
        assert section.startswith(title_line)
        results.replace_section("op_bench", report.TITLE,
                                section[len(title_line):].lstrip("\n"))
    else:
        md_path = os.path.join(results.RESULTS_DIR, stem + ".md")
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
        import op_bench_worker
        op_bench_worker.worker_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()

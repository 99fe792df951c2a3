"""The main job on a built-in demo model.

Builds a DLRM-style ranking model (8 multi-valued sparse features, tables of
10k-500k rows, an MLP) as an FP32 SavedModel, exports it with `tfce-export`'s
library INT8, INT4 and FP16 with the fused ops, and INT8 with stock TF ops
only; every export is verified in fresh processes. Then serves one request
stream (batches of 256 candidates) through all five SavedModels in this
process and
prints sizes, errors against FP32 and latencies (medians, measured side by
side in one run).

    python tools/demo.py [--workdir DIR] [--batch 256] [--repeats 7]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import recommender_model  # noqa: E402
import tf_compressed_embedding as tfce  # noqa: E402
from export_tools import compress_saved_model  # noqa: E402
from export_tools.cli import RichProgress, print_summary  # noqa: E402
from export_tools.report import directory_bytes  # noqa: E402

VARIANTS = [("int8", "fused"), ("int4", "fused"), ("fp16", "fused"), ("int8", "stock")]


def median_ms(fn, feeds, repeats):
    fn(**feeds[0])  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for feed in feeds:
            fn(**feed)
        times.append((time.perf_counter() - start) / len(feeds))
    return 1e3 * float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="keep the SavedModels here (default: a "
                                          "temporary directory, removed at the end)")
    parser.add_argument("--batch", type=int, default=256, help="candidates per request")
    parser.add_argument("--requests", type=int, default=20, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    console = Console()
    workdir = args.workdir or tempfile.mkdtemp(prefix="tfce-demo-")
    os.makedirs(workdir, exist_ok=True)
    try:
        run(args, console, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, console, workdir):
    features = recommender_model.demo_features()
    fp32_path = os.path.join(workdir, "fp32")
    with console.status("building the FP32 demo model"):
        shutil.rmtree(fp32_path, ignore_errors=True)
        recommender_model.save(recommender_model.RankingModel(features), fp32_path)
    rows = sum(f.rows for f in features)
    console.print(f"FP32 model: {len(features)} sparse features, {rows:,} embedding rows, "
                  f"{directory_bytes(fp32_path) / 2**20:.1f} MiB on disk → {fp32_path}")

    paths, reports = {"fp32": fp32_path}, {}
    for dtype, ops in VARIANTS:
        name = f"{dtype} {ops}"
        paths[name] = os.path.join(workdir, f"{dtype}_{ops}")
        console.rule(f"tfce-export {fp32_path} {paths[name]} --dtype {dtype} --ops {ops}")
        with RichProgress(console) as progress:
            reports[name] = compress_saved_model(fp32_path, paths[name], dtype=dtype,
                                                 ops=ops, overwrite=True,
                                                 progress=progress)
        print_summary(console, reports[name])

    feeds = [{k: tf.constant(v) for k, v in feed.items()}
             for feed in recommender_model.requests(features, args.batch, args.requests)]
    models = {name: tf.saved_model.load(path).signatures["serving_default"]
              for name, path in paths.items()}
    want = models["fp32"](**feeds[0])["score"].numpy()
    timings = {name: [] for name in models}
    with console.status("serving requests through every model, side by side"):
        for _ in range(args.repeats):  # interleaved, so noise hits all alike
            for name, fn in models.items():
                timings[name].append(median_ms(fn, feeds, 1))
    base = float(np.median(timings["fp32"]))
    table = Table(title=f"demo model, requests of {args.batch} candidates "
                        f"(fused ops on the '{tfce.active_isa()}' kernels)")
    for column in ("model", "checkpoint MiB", "tables MiB", "max |score - FP32|",
                   "p50 ms / request", "vs FP32"):
        table.add_column(column, justify="left" if column == "model" else "right")
    fp32_tables = next(iter(reports.values())).table_bytes_before
    for name, fn in models.items():
        report = reports.get(name)
        diff = float(np.abs(fn(**feeds[0])["score"].numpy() - want).max())
        ms = float(np.median(timings[name]))
        variables_mib = directory_bytes(os.path.join(paths[name], "variables")) / 2**20
        table.add_row(name, f"{variables_mib:.1f}",
                      f"{(report.table_bytes_after if report else fp32_tables) / 2**20:.1f}",
                      f"{diff:.2e}", f"{ms:.2f}", f"{ms / base:.2f}x")
    console.print(table)
    console.print("Latency: median over repeats of the mean per-request time; models run "
                  "interleaved in one process. The machine is shared: treat differences "
                  "under ~10% as noise."
                  + (f" Models kept in {workdir}." if args.workdir else ""))


if __name__ == "__main__":
    main()

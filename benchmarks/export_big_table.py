"""Proof that `compress_saved_model` streams: its peak memory is bounded by
the chunk size (about 64 MiB of FP32 rows), not by the table's size.

    python benchmarks/export_big_table.py [--rows N --dim D] [--dtypes int8,fp16]
                                          [--verify] [--workdir DIR --keep]

Builds a SavedModel holding one FP32 embedding table (default 33,554,432 x 32
= 4 GiB) and a small dense variable, in a child process that fills a
zero-initialized variable chunk by chunk (the table is never in memory twice).
Then, each in a fresh child process: a baseline that only imports
tensorflow, tf_compressed_embedding and export_tools; and one export per
dtype (`ops="fused"`, `verify=False`; `--verify` also runs the verification,
which loads both models in processes of its own, and times it separately).
Each child reports its peak RSS (VmHWM) and wall time. The target is
peak - baseline < 1536 MiB. Prints a table, writes
benchmarks/results/export_big_table.csv. Needs ~4 GiB (source) + ~1-2 GiB
(per export) of disk in the work dir, deleted at the end unless --keep.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from _harness import host, results, workers

GiB = 1 << 30
TARGET_MIB = 1536
TARGET = f"peak - baseline < {TARGET_MIB} MiB"
COLUMNS = ["dtype", "rows", "dim", "table FP32 GiB", "output GiB", "wall s", "verify s",
           "verify peak RSS MiB", "peak RSS MiB", "baseline RSS MiB",
           "peak - baseline MiB", TARGET]
FILL_ROWS = 1 << 19  # rows generated per chunk while building the source
CSV_PATH = os.path.join(results.RESULTS_DIR, "export_big_table.csv")


def memory():
    """(VmRSS, VmHWM) of this process, in MiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith("Vm"))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))


# ---------------------------------------------------------------- children
def child_build(path, rows, dim):
    import numpy as np
    import tensorflow as tf

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(tf.zeros([rows, dim]), trainable=False, name="table")
            self.dense = tf.Variable(tf.random.normal([dim, dim]), name="dense")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
        def serve(self, ids):
            return {"emb": tf.nn.embedding_lookup(self.table, ids)}

    model, rng = Model(), np.random.default_rng(0)
    # scatter_update writes in place; `table[a:b].assign(...)` would copy the
    # whole variable (copy-on-write) and double the memory.
    for start in range(0, rows, FILL_ROWS):
        count = min(FILL_ROWS, rows - start)
        rows_value = rng.standard_normal((count, dim), np.float32) * np.float32(0.05)
        model.table.scatter_update(tf.IndexedSlices(
            rows_value, tf.range(start, start + count, dtype=tf.int64)))
    tf.saved_model.save(model, path, signatures={"serving_default": model.serve})


def child_export(src, dst, dtype, verify):
    import resource
    from export_tools.compress import Progress, compress_saved_model

    class Stages(Progress):
        def __init__(self):
            self.log = []

        def stage(self, text):
            self.log.append([text.split(" /")[0], time.perf_counter(), *memory()])

    stages = Stages()
    start = time.perf_counter()
    compress_saved_model(src, dst, dtype=dtype, ops="fused", verify=verify,
                         progress=stages)
    end = time.perf_counter()
    verify_start = next((t for s, t, *_ in stages.log if s.startswith("verif")), end)
    return {"wall_s": end - start, "verify_s": end - verify_start if verify else None,
            "verify_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "stages": [[s, t - start, rss, hwm] for s, t, rss, hwm in stages.log]
            + [["done", end - start, *memory()]]}


def child(task, spec):
    start = time.perf_counter()
    if task == "build":
        child_build(**spec)
        result = {}
    else:
        import tensorflow  # noqa: F401
        import tf_compressed_embedding  # noqa: F401
        import export_tools.compress  # noqa: F401
        result = child_export(**spec) if task == "export" else {}
    result.update(total_s=time.perf_counter() - start, peak_mib=memory()[1])
    print(json.dumps(result))


def run_child(task, **spec):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    rc, out = workers.json_child([sys.executable, os.path.abspath(__file__), "_child",
                                  task, json.dumps(spec)], env)
    if rc and task != "export":
        sys.exit(f"the {task} child failed (exit {rc})")
    return out


# ---------------------------------------------------------------- parent
def disk_bytes(path):
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def print_results(rows, stages, verify):
    from rich.console import Console
    from rich.table import Table
    table = Table(title="compress_saved_model on one big table (ops=fused)")
    shown = [c for c in COLUMNS if c not in ("rows", "dim") and (verify or "verify" not in c)]
    for column in shown:
        table.add_column(column, justify="left" if column == "dtype" else "right")
    for row in rows:
        cells = [f"{row[c]:,.2f}" if isinstance(row[c], float) else str(row[c]) for c in shown]
        cells[-1] = ("[green]" if cells[-1] == "pass" else "[red]") + cells[-1]
        table.add_row(*cells)
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(table)
    detail = Table(title="export stages: time since the call, RSS and peak at stage start")
    for column in ("dtype", "stage", "t s", "RSS MiB", "peak so far MiB"):
        detail.add_column(column, justify="left" if column in ("dtype", "stage") else "right")
    for dtype, log in stages.items():
        for name, t, rss, hwm in log:
            detail.add_row(dtype, name, f"{t:.1f}", f"{rss:,.0f}", f"{hwm:,.0f}")
    console.print(detail)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=33_554_432, help="table rows")
    parser.add_argument("--dim", type=int, default=32, help="table dim")
    parser.add_argument("--dtypes", default="int8,fp16", help="comma-separated")
    parser.add_argument("--verify", action="store_true",
                        help="also verify each export (timed separately)")
    parser.add_argument("--workdir", help="where models are written (default: a "
                        "new temp dir under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the models")
    parser.add_argument("--csv", default=CSV_PATH, help=f"default: {CSV_PATH}")
    args = parser.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    table_bytes = args.rows * args.dim * 4
    workdir = args.workdir or tempfile.mkdtemp(prefix="tfce-big-table-", dir="/tmp")
    os.makedirs(workdir, exist_ok=True)
    needed = table_bytes * (1 + 0.6 * len(dtypes)) + GiB
    if shutil.disk_usage(workdir).free < needed:
        sys.exit(f"{workdir} needs about {needed / GiB:.1f} GiB free")
    src, created = os.path.join(workdir, "source"), []
    try:
        print(f"building {args.rows:,} x {args.dim} FP32 ({table_bytes / GiB:.2f} GiB) "
              f"in {src} ...", flush=True)
        created.append(src)
        build = run_child("build", path=src, rows=args.rows, dim=args.dim)
        print(f"  built in {build['total_s']:.0f} s, build peak RSS "
              f"{build['peak_mib']:,.0f} MiB", flush=True)
        baseline = run_child("baseline")["peak_mib"]
        measured, stages = [], {}
        for dtype in dtypes:
            dst = os.path.join(workdir, dtype)
            created.append(dst)
            print(f"exporting {dtype} ...", flush=True)
            out = run_child("export", src=src, dst=dst, dtype=dtype, verify=args.verify)
            row = dict.fromkeys(COLUMNS, "")
            row.update({"dtype": dtype, "rows": args.rows, "dim": args.dim,
                        "table FP32 GiB": table_bytes / GiB, "baseline RSS MiB": baseline,
                        TARGET: "FAIL (export error)"})
            if out is not None:
                stages[dtype], verify_s = out["stages"], out["verify_s"]
                delta = out["peak_mib"] - baseline
                row.update({
                    "output GiB": disk_bytes(os.path.join(dst, "variables")) / GiB,
                    "wall s": out["wall_s"] - (verify_s or 0.0),
                    "peak RSS MiB": out["peak_mib"], "peak - baseline MiB": delta,
                    TARGET: "pass" if delta < TARGET_MIB else "FAIL"})
                if args.verify:
                    row.update({"verify s": verify_s,
                                "verify peak RSS MiB": out["verify_peak_mib"]})
            measured.append(row)
    finally:
        if not args.keep:
            for path in created:
                shutil.rmtree(path, ignore_errors=True)
            if not args.workdir or not os.listdir(workdir):
                shutil.rmtree(workdir, ignore_errors=True)
    print_results(measured, stages, args.verify)
    info = host.machine_fields()
    results.write_csv(os.path.abspath(args.csv),
                      [{**row, **info} for row in measured],
                      fields=COLUMNS + list(info), float_format="{:.3f}")
    print(f"wrote {args.csv}" + ("" if args.keep else "; work dirs deleted"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        main()

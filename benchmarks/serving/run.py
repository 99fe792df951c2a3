"""End to end: a DLRM-style ranking model served the way TF Serving serves it,
FP32 against its INT8/INT4/FP16 exports, stock and fused.

    python benchmarks/serving/run.py [--workdir DIR] [--rounds 3] [--iterations 200]

1. Builds the model (benchmarks/recommender_model.py: 100 sparse features,
   dims 8-64 with 12 the most common, tables of 10k-5M rows, >= 4 GiB FP32,
   bags of 1-50 ids, an MLP) twice with the same weights: as models export it
   (`tf.nn.embedding_lookup_sparse`: Unique + gather + SparseSegmentMean) and
   as the other fast FP32 graph stock TF expresses (gather + segment_mean, no
   Unique); the faster of the two is the "fastest FP32" baseline.
2. Exports the first with tfce-export: int8, int4 and fp16, `--ops stock`
   (the naive decode) and `--ops fused`, each verified, int8_split fused
   (the 0.1.0 int8 layout, scales in a separate array), and `--dtype auto`
   fused (a format per table) with `--max-error` twice what the int8 export
   measured (`--auto-max-error` sets it).
3. Writes a request log of 256-candidate requests (PredictionLog TFRecord)
   and serves every variant in the C++ harness (serving/harness: TF's
   LoadSavedModel + Session::Run, TF Serving's loader), in rounds, variants
   interleaved, each in a fresh process: p50/p99 latency and throughput at 1
   and 2 client threads, load time, resident memory.
4. Prints the table, writes benchmarks/results/serving.csv and serving.png
   and the `serving` section of benchmarks/RESULTS.md.
Needs ~16 GiB of disk in the work dir and ~10 GiB of RAM; ~30-40 min on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _harness import charts, markdown as md, results  # noqa: E402  (benchmarks/, just above)

RESULTS = results.RESULTS_DIR
TITLE = "End to end: the ranking model served (`python benchmarks/serving/run.py`)"
# name -> (source, export dtype, export ops); source "fp32" or "fp32_segment"
VARIANTS = {
    "FP32 as exported": ("fp32", None, None),
    "FP32 gather+segment_mean": ("fp32_segment", None, None),
    "INT8 stock": ("fp32", "int8", "stock"),
    "INT4 stock": ("fp32", "int4", "stock"),
    "FP16 stock": ("fp32", "fp16", "stock"),
    "INT8 fused": ("fp32", "int8", "fused"),
    "INT4 fused": ("fp32", "int4", "fused"),
    "FP16 fused": ("fp32", "fp16", "fused"),
    # int8 with its scales in a separate array (the 0.1.0 layout): the
    # before of the rowwise int8 above.
    "INT8-split fused": ("fp32", "int8_split", "fused"),
    # A format per table (after INT8 fused, whose measured error sets its
    # default budget).
    "AUTO fused": ("fp32", "auto", "fused"),
}


def log(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def build_models(workdir, features_args):
    """Both FP32 SavedModels, each built in a child process (the tables are
    several GiB; the child's memory is returned when it exits)."""
    for name, pooling in (("fp32", "sparse"), ("fp32_segment", "segment")):
        path = os.path.join(workdir, name)
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            continue
        log(f"building {name} ({pooling} pooling)")
        code = ("import sys; sys.path.insert(0, %r); import recommender_model as r; "
                "r.save(r.RankingModel(r.dlrm_features(*%r), pooling=%r), %r)"
                % (os.path.dirname(HERE), features_args, pooling, path))
        subprocess.run([sys.executable, "-c", code], check=True)


def verified_error(report):
    """The largest float difference an export's verification measured."""
    return max(err for outputs in report["verification"].values()
               for err in outputs.values())


def export_models(workdir, auto_max_error=None):
    """Exports every variant not exported yet; returns {name: report}. An
    auto export that fails drops its variant (and says why): the others are
    still measured."""
    from export_tools import ExportError, compress_saved_model
    reports = {}
    for name, (_, dtype, ops) in list(VARIANTS.items()):
        if dtype is None:
            continue
        path = os.path.join(workdir, f"{dtype}_{ops}")
        report_path = path + ".report.json"
        if not os.path.exists(report_path):
            extra = {}
            if dtype == "auto":
                extra["max_error"] = auto_max_error or 2 * verified_error(reports["INT8 fused"])
            log(f"exporting {name} {extra}")
            try:
                compress_saved_model(os.path.join(workdir, "fp32"), path, dtype=dtype,
                                     ops=ops, overwrite=True, report=report_path, **extra)
            except ExportError as e:
                if dtype != "auto":
                    raise
                log(f"{name} not measured: the export failed: {e}")
                del VARIANTS[name]
                continue
        reports[name] = json.load(open(report_path))
    return reports


def auto_choices(report):
    """'N int4, N int8, ...' of an auto export's report."""
    counts = {}
    for table in report["auto"]["tables"]:
        counts[table["format"]] = counts.get(table["format"], 0) + 1
    return ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items()))


def write_requests(path, features, batch, count):
    import tensorflow as tf
    import recommender_model
    from export_tools.warmup import predict_log
    with tf.io.TFRecordWriter(path) as writer:
        for feed in recommender_model.requests(features, batch, count, seed=7):
            writer.write(predict_log("serving_default", feed))


def model_path(workdir, name):
    source, dtype, ops = VARIANTS[name]
    return os.path.join(workdir, source if dtype is None else f"{dtype}_{ops}")


def serve(harness, workdir, name, requests, iterations, threads):
    command = [harness, "--model", model_path(workdir, name), "--requests", requests,
               "--iterations", str(iterations), "--threads", threads, "--warmup"]
    if VARIANTS[name][2] == "fused":
        import tf_compressed_embedding._loader as loader
        command += ["--ops", loader.library_path()]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"harness failed on {name}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def directory_mib(path):
    from export_tools.report import directory_bytes
    return directory_bytes(path) / 2**20


def summarize(runs, workdir, features, reports):
    fp32_tables = sum(f.rows * f.dim * 4 for f in features)
    format_bytes = {None: fp32_tables}
    for r in reports.values():
        format_bytes[r["dtype"]] = r["table_bytes_after"]
    rows = []
    for name, measured in runs.items():
        by_threads = {}
        for result in measured:
            for run in result["runs"]:
                by_threads.setdefault(run["threads"], []).append(run)
        table_rss = statistics.median(r["rss_after_load_mib"] - r["rss_before_load_mib"]
                                      for r in measured)
        dtype = VARIANTS[name][1]
        row = {"variant": name,
               "table MiB (format)": format_bytes[dtype] / 2**20,
               "model RSS MiB": table_rss,
               "RSS / format": table_rss * 2**20 / format_bytes[dtype],
               "disk MiB": directory_mib(model_path(workdir, name)),
               "load s": statistics.median(r["load_seconds"] for r in measured)}
        for threads, items in sorted(by_threads.items()):
            row[f"p50 ms {threads}t"] = statistics.median(i["p50_ms"] for i in items)
            row[f"p99 ms {threads}t"] = statistics.median(i["p99_ms"] for i in items)
            row[f"req/s {threads}t"] = statistics.median(i["throughput_rps"] for i in items)
        rows.append(row)
    base = {r["variant"]: r for r in rows}
    # The fastest FP32 graph is whichever FP32 variant measured faster.
    fastest = min(base[v]["p50 ms 1t"]
                  for v in ("FP32 as exported", "FP32 gather+segment_mean"))
    for row in rows:
        row["p50 vs FP32"] = row["p50 ms 1t"] / base["FP32 as exported"]["p50 ms 1t"]
        row["p50 vs fastest FP32"] = row["p50 ms 1t"] / fastest
        row["RSS vs FP32"] = row["model RSS MiB"] / base["FP32 as exported"]["model RSS MiB"]
        row["tables vs FP32"] = (row["table MiB (format)"]
                                 / base["FP32 as exported"]["table MiB (format)"])
    return rows


def markdown(rows, args, features, reports):
    columns = ["variant", "p50 ms 1t", "p99 ms 1t", "p50 vs FP32", "p50 vs fastest FP32",
               "req/s 1t", "req/s 2t", "table MiB (format)", "tables vs FP32",
               "model RSS MiB", "RSS / format", "RSS vs FP32", "disk MiB", "load s"]
    total = sum(f.rows * f.dim * 4 for f in features) / 2**30
    lines = [f"{len(features)} sparse features, {sum(f.rows for f in features):,} rows, "
             f"{total:.2f} GiB of FP32 tables; requests of {args.batch} candidates; "
             f"{args.rounds} rounds x {args.iterations} requests per variant and thread "
             f"count, variants interleaved, each in a fresh harness process (TF's "
             f"LoadSavedModel + Session::Run, default thread pools, warmup replayed). "
             f"Medians over rounds. `model RSS` = resident memory after load minus before "
             f"(TF runtime excluded); `RSS / format` against the format's own bytes (FP32 "
             f"4D, INT8 4+D, INT4 4+ceil(D/2), FP16 2D, INT8-split D+4 per row); "
             f"`table MiB` and `tables vs FP32` are those bytes. `fastest FP32`: the "
             f"faster of the two FP32 graphs, as exported (Unique + gather + "
             f"SparseSegmentMean) or rewritten as a gather of every id + segment_mean "
             f"(no Unique).", ""]
    if "AUTO fused" in reports:
        auto = reports["AUTO fused"]["auto"]
        lines += [f"AUTO: `--dtype auto --max-error {auto['max_error']:.3g}` (twice the int8 "
                  f"export's measured error, unless `--auto-max-error` is given) chose "
                  f"{auto_choices(reports['AUTO fused'])} tables; its verification measured "
                  f"{auto['measured_error']:.3g}.", ""]
    lines += md.header(columns)
    for row in rows:
        cells = []
        for c in columns:
            v = row[c]
            ratio = c.startswith(("p50 vs", "RSS vs", "RSS /", "tables vs"))
            cells.append(v if isinstance(v, str) else
                         f"{v:.2f}x" if ratio else
                         f"{v:,.0f}" if "MiB" in c or "req/s" in c else f"{v:.2f}")
        lines.append(md.row(cells))
    lines += ["", "![serving](results/serving.png)", ""]
    return "\n".join(lines)


def chart(rows, path):
    plt = charts.pyplot(required=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["variant"] for r in rows]
    left.barh(names, [r["p50 vs FP32"] for r in rows], color="tab:blue")
    left.axvline(1.0, color="gray", linestyle="--")
    left.set_xlabel("p50 latency vs FP32 as exported (lower is better)")
    right.barh(names, [r["RSS vs FP32"] for r in rows], color="tab:green")
    right.set_xlabel("model resident memory vs FP32")
    right.set_yticklabels([])
    fig.tight_layout()
    charts.save(fig, path, dpi=120)


def serve_all(args, features):
    requests = os.path.join(args.workdir, f"requests_{args.batch}.tfrecord")
    if not os.path.exists(requests):
        write_requests(requests, features, args.batch, args.request_log)
    harness = subprocess.run([sys.executable, os.path.join(ROOT, "serving", "build.py")],
                             capture_output=True, text=True, check=True).stdout.split()[-1]
    runs = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        for name in VARIANTS:  # interleaved, so the machine's noise hits all alike
            log(f"round {round_index + 1}/{args.rounds}: serving {name}")
            runs[name].append(serve(harness, args.workdir, name, requests,
                                    args.iterations, args.threads))
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/tfce-serving-bench",
                        help="models are kept here and reused by later runs")
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--total-gib", type=float, default=4.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--request-log", type=int, default=50, help="distinct requests")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--auto-max-error", type=float,
                        help="the AUTO variant's --max-error (default: twice the largest "
                             "output difference the INT8 fused export's verification measured)")
    parser.add_argument("--no-results", action="store_true",
                        help="do not touch benchmarks/RESULTS.md and results/")
    parser.add_argument("--report-only", action="store_true",
                        help="only re-render results/serving_raw.json of the last run")
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    import recommender_model
    features_args = (args.total_gib, args.features)
    features = recommender_model.dlrm_features(*features_args)
    if args.report_only:
        reports = export_models(args.workdir, args.auto_max_error)  # reads the kept reports
        runs = json.load(open(os.path.join(RESULTS, "serving_raw.json")))
    else:
        build_models(args.workdir, features_args)
        reports = export_models(args.workdir, args.auto_max_error)
        runs = serve_all(args, features)
    rows = summarize(runs, args.workdir, features, reports)
    section = markdown(rows, args, features, reports)
    print(f"## {TITLE}\n\n{section}")
    if not args.no_results:
        os.makedirs(RESULTS, exist_ok=True)
        results.write_csv("serving.csv", rows)
        if not args.report_only:
            json.dump(runs, open(os.path.join(RESULTS, "serving_raw.json"), "w"), indent=1)
        chart(rows, os.path.join(RESULTS, "serving.png"))
        results.replace_section("serving", TITLE, section)


if __name__ == "__main__":
    main()

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
   (the naive decode) and `--ops fused --no-batch` (one FusedDecodeAxpy per
   pooled lookup), each verified, int8_split fused (the 0.1.0 int8 layout,
   scales in a separate array), `--dtype auto` fused (a format per table)
   with `--max-error` twice what the int8 export measured
   (`--auto-max-error` sets it), and int8 batched (the export's default:
   one BatchedFusedDecodeAxpy node for all 100 pooled lookups).
3. Writes request logs (PredictionLog TFRecord) of 256, 16 and 1 candidates
   (`--batches`) and serves every variant with the first, the FP32, INT8
   fused and INT8 batched variants with all, in the C++ harness
   (serving/harness: TF's LoadSavedModel + Session::Run, TF Serving's
   loader), in rounds, variants interleaved, each in a fresh process:
   p50/p99 latency, throughput and CPU time per request at 1 and 2 client
   threads, load time, resident memory.
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

from _harness import charts, host, markdown as md, results  # noqa: E402  (benchmarks/, just above)

RESULTS = results.RESULTS_DIR
TITLE = "End to end: the ranking model served (`python benchmarks/serving/run.py`)"
# name -> (source, export dtype, export ops, batched); source "fp32" or
# "fp32_segment". The "fused" variants have one FusedDecodeAxpy node per
# pooled lookup (tfce-export --no-batch); "batched" one
# BatchedFusedDecodeAxpy node for them all (the export's default).
VARIANTS = {
    "FP32 as exported": ("fp32", None, None, False),
    "FP32 gather+segment_mean": ("fp32_segment", None, None, False),
    "INT8 stock": ("fp32", "int8", "stock", False),
    "INT4 stock": ("fp32", "int4", "stock", False),
    "FP16 stock": ("fp32", "fp16", "stock", False),
    "INT8 fused": ("fp32", "int8", "fused", False),
    "INT4 fused": ("fp32", "int4", "fused", False),
    "FP16 fused": ("fp32", "fp16", "fused", False),
    # int8 with its scales in a separate array (the 0.1.0 layout): the
    # before of the rowwise int8 above.
    "INT8-split fused": ("fp32", "int8_split", "fused", False),
    # A format per table (after INT8 fused, whose measured error sets its
    # default budget).
    "AUTO fused": ("fp32", "auto", "fused", False),
    "INT8 batched": ("fp32", "int8", "fused", True),
}
# The variants also served with the smaller requests of --batches.
REQUEST_SIZE_VARIANTS = ("FP32 as exported", "FP32 gather+segment_mean", "INT8 fused",
                         "INT8 batched")


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
    for name, (_, dtype, ops, batch) in list(VARIANTS.items()):
        if dtype is None:
            continue
        path = model_path(workdir, name)
        report_path = path + ".report.json"
        if not os.path.exists(report_path):
            extra = {}
            if dtype == "auto":
                extra["max_error"] = auto_max_error or 2 * verified_error(reports["INT8 fused"])
            log(f"exporting {name} {extra}")
            try:
                compress_saved_model(os.path.join(workdir, "fp32"), path, dtype=dtype,
                                     ops=ops, overwrite=True, report=report_path,
                                     batch=batch, **extra)
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
    source, dtype, ops, batch = VARIANTS[name]
    if dtype is None:
        return os.path.join(workdir, source)
    return os.path.join(workdir, f"{dtype}_{ops}" + ("_batched" if batch else ""))


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


def run_facts(args):
    """What the run was measured on and how, kept with its raw results so a
    --report-only render says the same."""
    import tf_compressed_embedding as tfce
    return {"host": host.machine(), "kernels": tfce.active_isa(),
            "commit": host.commit(), "date": time.strftime("%Y-%m-%d"),
            "rounds": args.rounds, "iterations": args.iterations}


def markdown(rows, facts, batch, features, reports):
    columns = ["variant", "p50 ms 1t", "p99 ms 1t", "p50 vs FP32", "p50 vs fastest FP32",
               "req/s 1t", "req/s 2t", "table MiB (format)", "tables vs FP32",
               "model RSS MiB", "RSS / format", "RSS vs FP32", "disk MiB", "load s"]
    total = sum(f.rows * f.dim * 4 for f in features) / 2**30
    lines = [f"{len(features)} sparse features, {sum(f.rows for f in features):,} rows, "
             f"{total:.2f} GiB of FP32 tables; requests of {batch} candidates. Host: "
             f"{facts['host']}, kernels {facts['kernels']}; commit {facts['commit']}, "
             f"{facts['date']}. {facts['rounds']} rounds x {facts['iterations']} "
             f"requests per variant and thread "
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
    """{request size: {variant: [harness report per round]}}: every variant
    with requests of the first size of --batches, REQUEST_SIZE_VARIANTS
    with the others."""
    harness = subprocess.run([sys.executable, os.path.join(ROOT, "serving", "build.py")],
                             capture_output=True, text=True, check=True).stdout.split()[-1]
    runs = {}
    for size in args.batches:
        requests = os.path.join(args.workdir, f"requests_{size}.tfrecord")
        if not os.path.exists(requests):
            write_requests(requests, features, size, args.request_log)
        names = [n for n in VARIANTS
                 if size == args.batches[0] or n in REQUEST_SIZE_VARIANTS]
        runs[size] = {name: [] for name in names}
        for round_index in range(args.rounds):
            for name in names:  # interleaved, so the machine's noise hits all alike
                log(f"{size} candidates, round {round_index + 1}/{args.rounds}: "
                    f"serving {name}")
                runs[size][name].append(serve(harness, args.workdir, name, requests,
                                              args.iterations, args.threads))
    return runs


def request_size_rows(runs):
    """Per request size and variant of REQUEST_SIZE_VARIANTS: p50, p99 and
    CPU ms per request at each client thread count (medians over rounds),
    and the batched export's ratios to FP32 and to one node per lookup."""
    rows = []
    for size, by_name in sorted(runs.items(), key=lambda item: int(item[0])):
        base = {}
        for name in REQUEST_SIZE_VARIANTS:
            if name not in by_name:
                continue
            row = {"candidates": int(size), "variant": name}
            per_threads = {}
            for result in by_name[name]:
                for run in result["runs"]:
                    per_threads.setdefault(run["threads"], []).append(run)
            for threads, items in sorted(per_threads.items()):
                for key, label in (("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
                                   ("cpu_ms_per_request", "CPU ms/req")):
                    values = [i[key] for i in items if key in i]
                    row[f"{label} {threads}t"] = (statistics.median(values)
                                                  if values else None)
            base[name] = row
            rows.append(row)
        batched = base.get("INT8 batched")
        for threads in (1, 2):
            key = f"p50 ms {threads}t"
            for other, label in (("FP32 as exported", "vs FP32"),
                                 ("INT8 fused", "vs per table")):
                if batched and other in base and base[other].get(key):
                    batched[f"batched {label} {threads}t"] = (batched[key]
                                                              / base[other][key])
    return rows


def request_size_markdown(rows):
    columns = ["candidates", "variant", "p50 ms 1t", "p99 ms 1t", "CPU ms/req 1t",
               "p50 ms 2t", "p99 ms 2t", "CPU ms/req 2t", "batched vs FP32 1t",
               "batched vs per table 1t", "batched vs FP32 2t",
               "batched vs per table 2t"]
    lines = ["Request sizes: the batched export (one BatchedFusedDecodeAxpy node for "
             "the 100 pooled lookups) against one FusedDecodeAxpy node per lookup "
             "(`--no-batch`) and FP32, at 1 and 2 client threads; `CPU ms/req` is "
             "the harness process's CPU time (all threads) over the run per request. "
             "Targets (issue 20): 1 and 16 candidates, batched p50 <= 0.5x FP32 and "
             "<= 0.6x per table; 256 candidates, <= 0.85x per table.", "",
             *md.header(columns)]
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c)
            cells.append("" if v is None else v if isinstance(v, str) else
                         str(v) if isinstance(v, int) else
                         f"{v:.2f}x" if c.startswith("batched") else f"{v:.2f}")
        lines.append(md.row(cells))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/tfce-serving-bench",
                        help="models are kept here and reused by later runs")
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--total-gib", type=float, default=4.0)
    parser.add_argument("--batches", default="256,16,1",
                        help="request sizes in candidates: every variant is served with "
                             "the first, the batched comparison with all "
                             "(default %(default)s)")
    parser.add_argument("--request-log", type=int, default=50, help="distinct requests")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--auto-max-error", type=float,
                        help="the AUTO variant's --max-error (default: twice the largest "
                             "output difference the INT8 fused export's verification measured)")
    parser.add_argument("--variants",
                        help="serve only these variants, comma-separated names as in the "
                             "table (e.g. 'FP32 as exported,INT8 fused,INT8 batched'); only "
                             "they are exported, and the run prints the request-size "
                             "table only and writes no results (default: all)")
    parser.add_argument("--no-results", action="store_true",
                        help="do not touch benchmarks/RESULTS.md and results/")
    parser.add_argument("--report-only", action="store_true",
                        help="only re-render results/serving_raw.json of the last run")
    args = parser.parse_args(argv)
    if args.variants:
        chosen = [name.strip() for name in args.variants.split(",")]
        unknown = [name for name in chosen if name not in VARIANTS]
        if unknown:
            parser.error(f"--variants: no variant named {', '.join(map(repr, unknown))}; "
                         f"the variants are {', '.join(VARIANTS)}")
        for name in list(VARIANTS):
            if name not in chosen:
                del VARIANTS[name]
        args.no_results = True  # a partial table must not replace the section
    args.batches = [int(b) for b in args.batches.split(",")]
    args.batch = args.batches[0]
    os.makedirs(args.workdir, exist_ok=True)
    import recommender_model
    features_args = (args.total_gib, args.features)
    features = recommender_model.dlrm_features(*features_args)
    if args.report_only:
        reports = export_models(args.workdir, args.auto_max_error)  # reads the kept reports
        raw = json.load(open(os.path.join(RESULTS, "serving_raw.json")))
        facts, runs = raw["facts"], raw["runs"]
        runs = {int(size): by_name for size, by_name in runs.items()}
    else:
        build_models(args.workdir, features_args)
        reports = export_models(args.workdir, args.auto_max_error)
        facts = run_facts(args)
        runs = serve_all(args, features)
    if args.variants:  # the request-size table only: the full one needs every variant
        print(f"{facts}\n\n" + request_size_markdown(request_size_rows(runs)))
        return
    rows = summarize(runs[args.batch], args.workdir, features, reports)
    section = markdown(rows, facts, args.batch, features, reports)
    if len(runs) > 1 or "INT8 batched" in runs[args.batch]:
        section += "\n" + request_size_markdown(request_size_rows(runs))
    print(f"## {TITLE}\n\n{section}")
    if not args.no_results:
        os.makedirs(RESULTS, exist_ok=True)
        results.write_csv("serving.csv", rows)
        if not args.report_only:
            json.dump({"facts": facts, "runs": runs},
                      open(os.path.join(RESULTS, "serving_raw.json"), "w"), indent=1)
        chart(rows, os.path.join(RESULTS, "serving.png"))
        results.replace_section("serving", TITLE, section)


if __name__ == "__main__":
    main()

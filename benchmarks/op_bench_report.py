"""op_bench.py's report: the per-system rows of the CSV (medians, ns per
row, GB/s, same-process speedups), the markdown section and the chart."""
import csv
import datetime
import os
import statistics
import sys

from _harness import charts, host, results
from _harness import markdown as md
from _harness.timing import geomean
from op_bench_systems import NOPOOL_REF, REF, SHORT, SYSTEMS, row_bytes

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
TITLE = ("Op-level side by side: tfce vs TF stock vs FBGEMM "
         "(`python benchmarks/op_bench.py`)")


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


def ns_cell(r, ref_name, speedup_col):
    """A table cell: ns/row and, in brackets, the speedup in column
    ``speedup_col``; the reference system's in bold, ⚠ where its check
    failed, "–" where it did not run."""
    if r is None:
        return "–"
    if r["system"] == ref_name:
        return f"**{fmt_num(r['ns_per_row'])}**"
    sp = r[speedup_col]
    if sp == "":
        return fmt_num(r["ns_per_row"])
    mark = "" if r["check_ok"] in (True, "") else " ⚠"
    return f"{fmt_num(r['ns_per_row'])} ({sp:.2f}){mark}"


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


SCALING = (("tfce_int8", "tfce int8"), ("tfce_int4", "tfce int4"),
           ("tfce_fp16", "tfce fp16"), ("pt_int8_bag", "FBGEMM int8"),
           ("pt_int4_bag", "FBGEMM int4"), ("pt_fp16_bag", "FBGEMM fp16"))

# The targets: (tfce system, FBGEMM system, the largest geometric
# mean of tfce's time / FBGEMM's over the cells with L = 20 and 80, whether
# no such cell may be slower than FBGEMM).
TARGETS = (("tfce_int8", "pt_int8_bag", 0.8, True),
           ("tfce_int4", "pt_int4_bag", 1.0, False))
TARGET_LENS = (20, 80)


def time_ratio(index, cell, a, b):
    """a's time / b's time in ``cell`` ((threads, R, D, L, dist)), or None."""
    ra, rb = index.get((*cell, a)), index.get((*cell, b))
    return ra["ns_per_row"] / rb["ns_per_row"] if ra and rb else None


def target_lines(rows, index):
    """Per thread count: tfce's time over FBGEMM's for each target pair in
    every cell with L = 20 or 80, their geometric means, and the cells
    slower than FBGEMM."""
    out = []
    for t in sorted({r["threads"] for r in rows}):
        cells = sorted({(t, r["rows"], r["dim"], r["L"], r["dist"])
                        for r in rows if r["threads"] == t
                        and r["L"] in TARGET_LENS},
                       key=lambda c: (c[1], c[4], c[3], c[2]))
        pairs = [p for p in TARGETS
                 if any(time_ratio(index, c, p[0], p[1]) for c in cells)]
        if not pairs:
            continue
        out += [f"### Targets, {t} thread{'s' if t > 1 else ''}: tfce's time "
                "over FBGEMM's\n",
                "Each cell: tfce's ns/row / FBGEMM's in the same process "
                "(< 1: tfce faster; **bold**: slower than FBGEMM). Targets "
                "at 1 thread: " + "; ".join(
                    f"{SHORT[a]} / {SHORT[b]} ≤ {limit:g} (geometric mean "
                    f"over L = {' and '.join(map(str, TARGET_LENS))})"
                    + (", and no cell above 1" if strict else "")
                    for a, b, limit, strict in pairs) + ".\n",
                *md.header(["R", "D", "L", "ids", *(
                    f"{SHORT[a]} / {SHORT[b]}" for a, b, _, _ in pairs)])]
        for cell in cells:
            ratios = [time_ratio(index, cell, a, b) for a, b, _, _ in pairs]
            if not any(ratios):
                continue
            out.append(md.row([fmt_rows(cell[1]), cell[2], cell[3], cell[4], *(
                "–" if x is None else (f"**{x:.2f}**" if x > 1 else f"{x:.2f}")
                for x in ratios)]))
        summary = []
        for a, b, limit, strict in pairs:
            ratios = [time_ratio(index, c, a, b) for c in cells]
            ratios = [x for x in ratios if x]
            g = geomean(ratios)
            slower = sum(x > 1 for x in ratios)
            met = g <= limit and not (strict and slower)
            summary.append(
                f"{SHORT[a]} / {SHORT[b]}: geometric mean {g:.2f} over "
                f"{len(ratios)} cells (target ≤ {limit:g}), {slower} "
                f"cell{'s' if slower != 1 else ''} slower than FBGEMM"
                + (f" — {'met' if met else 'NOT met'}" if t == 1 else ""))
        out.append(md.row(["geometric mean", "", "", "", *(
            f"{geomean([time_ratio(index, c, a, b) or '' for c in cells]):.2f}"
            for a, b, _, _ in pairs)]))
        out += ["", "; ".join(summary) + ".", ""]
    return out


# Each system's layout in benchmarks/gather_limit.py.
LIMIT_LAYOUT = {"tfce_int8": "int8", "tfce_int4": "int4", "tfce_fp16": "fp16",
                "tfce_int8_split": "int8_split", "pt_int8_bag": "fbgemm8",
                "pt_int4_bag": "fbgemm4"}


def gather_limits(path=None):
    """{(threads, dim, pages, layout): limit ns/row} from the last
    gather_limit.py run on this machine's CPU (results/gather_limit.csv,
    2M rows, L = 80), and its row count; ({}, None) if there is none."""
    path = path or os.path.join(results.RESULTS_DIR, "gather_limit.csv")
    try:
        with open(path, newline="") as f:
            found = list(csv.DictReader(f))
    except OSError:
        return {}, None
    found = [r for r in found if r.get("cpu_model") == host.cpu_model()
             and r["what"] == "touch"]
    limits = {}
    for r in found:
        key = (int(r["threads"]), int(r["dim"]), r["pages"], r["layout"])
        ns = float(r["ns_per_row"])
        limits[key] = min(ns, limits.get(key, ns))
    return limits, (int(found[0]["rows"]) if found else None)


def limit_lines(rows, index, meta, limits, limit_rows):
    """Op-level time over the random-gather limit of each system's own
    layout (gather_limit.py, same CPU, an earlier run) on the cells of the
    same workload: the largest table, L = 80, uniform ids."""
    cells = sorted({(r["threads"], r["rows"], r["dim"], r["L"], r["dist"])
                    for r in rows if r["rows"] == limit_rows and r["L"] == 80
                    and r["dist"] == "uniform"})
    systems = [n for n in LIMIT_LAYOUT if any(r["system"] == n for r in rows)]
    if not limits or not cells or not systems:
        return []
    tfce_pages = "2M" if meta.get("tfce_huge_pages") == "on" else "4K"
    out = ["### Op-level time over the random-gather limit of its own layout\n",
           f"Cells with the {fmt_rows(limit_rows)}-row table, L = 80, uniform "
           "ids (the workload of `gather_limit.py`): ns/row and, in brackets, "
           "over the limit of the system's layout from the last "
           "`gather_limit.py` run on this CPU (results/gather_limit.csv; a "
           "separate run, so a cross-run ratio). Pages: tfce's tables "
           f"{'2 MiB' if tfce_pages == '2M' else '4 KiB'} (the ops' huge "
           "pages " + meta.get("tfce_huge_pages", "?") + "), torch's 4 KiB. "
           "Target: ≤ 1.3 for tfce int8 and int4.\n",
           *md.header(["threads", "D", *(SHORT[n] for n in systems)])]
    for cell in cells:
        t, _, dim, _, _ = cell
        parts = []
        for n in systems:
            r = index.get((*cell, n))
            pages = tfce_pages if n.startswith("tfce") else "4K"
            limit = limits.get((t, dim, pages, LIMIT_LAYOUT[n]))
            if r is None:
                parts.append("–")
            elif limit is None:
                parts.append(fmt_num(r["ns_per_row"]))
            else:
                parts.append(f"{fmt_num(r['ns_per_row'])} "
                             f"({r['ns_per_row'] / limit:.2f})")
        out.append(md.row([t, dim, *parts]))
    out.append("")
    return out


def thread_scaling_lines(rows, index):
    """Same-process thread scaling: each system's 1-thread time over its
    N-thread time, both timed round-robin in the N-thread process."""
    multi = sorted({r["threads"] for r in rows if r["kind"] == "pool1t"})
    out = []
    for t in multi:
        cells = sorted({(r["rows"], r["dim"], r["L"], r["dist"]) for r in rows
                        if r["threads"] == t and r["kind"] == "pool1t"},
                       key=lambda c: (c[0], c[3], c[2], c[1]))

        def ratio(cell, name, t=t):
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
                *md.header(["R", "D", "L", "ids", *(n for _, n in SCALING)])]
        target = [c for c in cells if c[0] == max(c[0] for c in cells)
                  and c[2] == 80]
        for cell in target:
            R, D, L, dist = cell
            out.append(md.row([fmt_rows(R), D, L, dist, *(
                fmt(ratio(cell, n)) for n, _ in SCALING)]))
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
        f"{args.git_commit}. "
        f"Machine: {host.machine()} (shared and noisy: "
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
    lines.extend(md.header(["system", *(f"{t} thread{'s' if t > 1 else ''}"
                                        for t in threads_list)]))
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
        add(md.row([f"{SYSTEMS[n][0]}{ref_name}", *vals]))
    for a, b in (("tfce_int8", "pt_int8_bag"), ("tfce_int4", "pt_int4_bag"),
                 ("tfce_fp16", "pt_fp16_bag"), ("tfce_int8", "tfce_int8_split"),
                 ("tfce_int8", "tf_naive_int8"), ("tfce_int8", "pt_fp32_bag"),
                 ("tfce_lookup_int8", "tf_naive_lookup_int8"),
                 ("tfce_lookup_fp16", "tf_naive_lookup_fp16")):
        vals = [pair_speedup(rows, index, a, b, t)
                for t in threads_list]
        if any(v != "–" for v in vals):
            add(md.row([f"*{SHORT[a]} speedup over {SHORT[b]}*", *vals]))
    floor_pairs = (("tfce_int8", "tf_elsparse_fp32"),
                   ("tfce_int4", "tf_elsparse_fp32"),
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
        lines.extend(md.header(["pair, loop floor taken out", *(
            f"{t} thread{'s' if t > 1 else ''}" for t in threads_list)]))
        for a, b, vals in floor_rows:
            add(md.row([f"*{SHORT[a]} speedup over {SHORT[b]}*", *vals]))
    add("")
    for t in threads_list:
        cells = cells_of(t)
        cols = [n for n in pooled if any(r["system"] == n and r["threads"] == t
                                         for r in rows)]
        add(f"### {t} thread{'s' if t > 1 else ''}: weighted-sum pooling, "
            "ns/row (speedup vs TF elsparse fp32)\n")
        lines.extend(md.header(["R", "D", "L", "ids",
                                *(SHORT[c] for c in cols), "TF loop floor"]))
        for (R, D, L, dist) in cells:
            fl = index.get((t, R, D, L, dist, "tf_loop_floor"))
            add(md.row([fmt_rows(R), D, L, dist, *(
                ns_cell(index.get((t, R, D, L, dist, c)), REF,
                        "speedup_vs_tf_elsparse") for c in cols),
                fmt_num(fl["ns_per_row"]) if fl else "–"]))
        add("")
        add(f"GB/s of logical table bytes touched ({t} thread"
            f"{'s' if t > 1 else ''}; fp32 4D, fp16 2D, int8 and int8 split "
            "D+4 incl. the scale, int4 ceil(D/2)+4, FBGEMM int8 D+8, FBGEMM "
            "int4 ceil(D/2)+4):\n")
        lines.extend(md.header(["R", "D", "L", "ids",
                                *(SHORT[c] for c in cols)]))
        for (R, D, L, dist) in cells:
            gbps = [index.get((t, R, D, L, dist, c)) for c in cols]
            add(md.row([fmt_rows(R), D, L, dist, *(
                f"{r['gbps']:.2f}" if r else "–" for r in gbps)]))
        add("")
        np_cells = [c for c in cells if c[2] == 1]
        ncols = [n for n in nopool if any(r["system"] == n and r["threads"] == t
                                          for r in rows)]
        if np_cells and ncols:
            add(f"### {t} thread{'s' if t > 1 else ''}: L = 1 without pooling "
                "(gather + decode, [512, D] out), ns/row (speedup vs "
                "tf.gather fp32)\n")
            lines.extend(md.header(["R", "D", "ids",
                                    *(SHORT[c] for c in ncols),
                                    "TF elsparse fp32 (pooled)"]))
            for (R, D, L, dist) in np_cells:
                ref = index.get((t, R, D, L, dist, REF))
                add(md.row([fmt_rows(R), D, dist, *(
                    ns_cell(index.get((t, R, D, L, dist, c)), NOPOOL_REF,
                            "speedup_vs_tf_gather") for c in ncols),
                    fmt_num(ref["ns_per_row"]) if ref else "–"]))
            add("")
    bad = [r for r in rows if r["check_ok"] is False]
    lines.extend(target_lines(rows, index))
    limits, limit_rows = gather_limits()
    lines.extend(limit_lines(rows, index, meta, limits, limit_rows))
    lines.extend(thread_scaling_lines(rows, index))
    add("### Correctness\n")
    add("Once per cell, each system's output for one batch is compared with a "
        "float64 numpy reference on the fp32 table, against the format's "
        "worst-case quantization bound (Σ|w|·row error: int8 and int8 split "
        "max|row|/254, int4 `max_decode_error` (half a step, max|row|/15, plus "
        "what its range search may clip, 0.32·max|row|, plus float16 "
        "rounding), fp16 max|row|·2⁻¹¹ (tfce's, "
        "tf_compressed_embedding/quantization.py), FBGEMM int8 (max−min)/510, "
        "FBGEMM int4 (max−min)·(1/30 + 33/200) + (max|row| + max−min)·2⁻¹⁰ "
        "with its range search (which keeps at least 167 of 200 steps of the "
        "range: `fbgemm4_row_error` in op_bench.py), plus fp32 rounding). "
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
            args.csv_path, BENCH_DIR) + "`.\n")
    return "\n".join(lines)


def chart(path, rows):
    plt = charts.pyplot()
    if plt is None:
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
              "tfce_int4": "#17becf", "tfce_int8_split": "#c7e9c0",
              "pt_fp32_bag": "#aec7e8", "pt_fp16_bag": "#6baed6",
              "pt_int8_bag": "#1f77b4", "pt_int4_bag": "#08306b"}
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
    charts.save(fig, path, dpi=110)
    return True

"""Where the int8 rowwise record keeps its scale, and at what stride
(benchmarks/record_layout.cc, no TensorFlow).

    python benchmarks/record_layout.py              # ~3-4 min
    python benchmarks/record_layout.py --quick      # smoke test, < 1 min
    python benchmarks/record_layout.py --tag NAME   # results/record_layout_NAME.*

One pooling loop (the shipped kernel's structure: scale folded into the
weight, one FMA per vector, accumulators in registers, prefetch as the ops'
policy would for the layout's stride) over five layouts of the same int8
rows, only the address arithmetic differing: (a) scale first, stride 4 + D
(shipped), (b) scale last, stride D + 4, (c)-(e) scale first with the stride
rounded up to 8, 16 and 64 bytes. The loop is built once per ISA the CPU
has: AVX2 (exact loads of the row's bytes), AVX-512 (a tail is one masked
16-byte load, as the shipped AVX-512 kernel does) and AVX-512 with exact
tails (8 and 4-byte loads). The shipped kernel runs on layout (a) as a
cross-check. Dims 12, 16, 32, 64, 128; a 2M-row table
(beyond the last-level cache for D >= 16 even at stride 4 + D) and a
50k-row one (in cache); 512 bags of L = 20 and 80 uniform ids; 2 MiB pages,
as the ops ask for. Medians over round-robin repeats.

Writes results/record_layout.csv and the record_layout section of
RESULTS.md (--quick: results/record_layout_quick.{csv,md}; --tag NAME:
results/record_layout_NAME.{csv,md}; both leave RESULTS.md alone).
"""
import argparse
import os
import tempfile

from _harness import host, markdown, results, workers
from _harness.timing import geomean

DIMS = (12, 16, 32, 64, 128)
LENS = (20, 80)
TABLES = (("beyond cache", 2_000_000), ("in cache", 50_000))
LAYOUTS = ("a_scale_first", "b_scale_last", "c_pad8", "d_pad16", "e_pad64")
SHORT = {"a_scale_first": "(a) scale first, 4+D",
         "b_scale_last": "(b) scale last, D+4",
         "c_pad8": "(c) pad to 8", "d_pad16": "(d) pad to 16",
         "e_pad64": "(e) pad to 64"}
_AVX512 = ("-O2", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw",
           "-mavx512vl")
ISA_FLAGS = {"avx2": ("-O2", "-mavx2", "-mfma", "-mf16c"), "avx512": _AVX512,
             "avx512_exact": (*_AVX512, "-DRL_EXACT_TAIL")}


def stride(layout, dim):
    record = 4 + dim
    pad = {"c_pad8": 8, "d_pad16": 16, "e_pad64": 64}.get(layout, 1)
    return -(-record // pad) * pad


def cpu_isas():
    """The loops this CPU can run: avx2, and with AVX-512 F/BW/VL avx512
    (masked tails) and avx512_exact (exact tails)."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isas = ["avx2"] if {"avx2", "fma", "f16c"} <= flags else []
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        isas += ["avx512", "avx512_exact"]
    return isas


def build(out_dir, isa):
    """The benchmark built with ``isa``'s flags (its loop is chosen by them)."""
    folder = os.path.join(out_dir, isa)
    os.makedirs(folder)
    return workers.build_cc(folder, "record_layout", flags=ISA_FLAGS[isa])


def measure(binaries, tables, dims, lens, repeats):
    rows = []
    for label, nrows in tables:
        for dim in dims:
            for isa, binary in binaries.items():
                print(f"  {label}: {nrows:,} rows, dim {dim}, {isa} build",
                      flush=True)
                rows += workers.run_csv(
                    [binary, str(nrows), str(dim), str(repeats),
                     ",".join(map(str, lens)), "1"],
                    table=label, rows=nrows, dim=dim, build=isa,
                    **host.machine_fields())
    return rows


def table_lines(measured, tables, dims, lens, repeats):
    index = {(r["table"], r["dim"], int(r["L"]), r["loop"], r["layout"]):
             float(r["ns_per_row"]) for r in measured}
    lines_per_row = {(r["table"], r["dim"], int(r["L"]), r["layout"]):
                     float(r["lines_per_row"]) for r in measured
                     if not r["loop"].startswith("kernel")}
    loops = sorted({r["loop"] for r in measured
                    if not r["loop"].startswith("kernel")})
    kernel = next((r["loop"] for r in measured
                   if r["loop"].startswith("kernel")), None)
    out = [
        f"Machine: {host.machine()}. 512 bags x L uniform ids, weighted sum, "
        f"1 thread, ns per looked-up row, median of {repeats} round-robin "
        "repeats; 2 MiB pages. The same pooling loop over five layouts of "
        "the same int8 rows (benchmarks/record_layout.cc): (a) [scale][D "
        "values] at stride 4 + D, as shipped; (b) [D values][scale]; (c), "
        "(d), (e) as (a) with the stride rounded up to 8, 16, 64 bytes. "
        "Loops: `avx2` loads exactly the row's bytes (8, then 4); `avx512` "
        "loads a tail (D % 16 values) with one masked 16-byte load, as the "
        "shipped AVX-512 kernel does; `avx512_exact` loads the tail exactly "
        "(8 and 4 bytes). Prefetch: the ops' rule for a record "
        "of the layout's stride. "
        + (f"`{kernel}`: the shipped kernel on (a), the cross-check. "
           if kernel else "")
        + "Cells: ns/row for (a), then each layout's time over (a)'s "
        "(< 1: faster than shipped). The CSV also has each system's fastest "
        "repeat (min_ns_per_row).", "",
        "**Memory**: bytes per row (over the shipped 4 + D):", "",
        *markdown.header(["D", *(SHORT[x] for x in LAYOUTS)])]
    for dim in dims:
        base = stride("a_scale_first", dim)
        out.append(markdown.row([dim, *(
            f"{stride(x, dim)}" + (f" (+{stride(x, dim) / base - 1:.0%})"
                                   if stride(x, dim) != base else "")
            for x in LAYOUTS)]))
    out += ["", "**Time**:", "",
            *markdown.header(["table", "D", "L", "loop", "(a) ns/row",
                              *(f"{SHORT[x][:3]} / (a)" for x in LAYOUTS[1:]),
                              *([f"{kernel} on (a)"] if kernel else []),
                              "lines/row (a)-(e)"])]
    ratios = {}  # (table, loop, layout) -> [time / (a)'s]
    for label, nrows in tables:
        for dim in dims:
            for L in lens:
                for loop in loops:
                    a = index.get((label, dim, L, loop, "a_scale_first"))
                    if a is None:
                        continue
                    cells = []
                    for x in LAYOUTS[1:]:
                        ns = index[(label, dim, L, loop, x)]
                        ratios.setdefault((label, loop, x), []).append(ns / a)
                        cells.append(f"{ns / a:.2f}")
                    k = index.get((label, dim, L, kernel, "a_scale_first"))
                    out.append(markdown.row([
                        f"{label} ({nrows:,} rows)", dim, L, loop, f"{a:.2f}",
                        *cells, *([f"{k:.2f}"] if kernel else []),
                        ", ".join(f"{lines_per_row[(label, dim, L, x)]:.2f}"
                                  for x in LAYOUTS)]))
    out += ["", "**Geometric mean of time / (a)'s** over the cells above "
            "(D and L):", "",
            *markdown.header(["table", "loop",
                              *(SHORT[x] for x in LAYOUTS[1:])])]
    for label, _ in tables:
        for loop in loops:
            if (label, loop, LAYOUTS[1]) in ratios:
                out.append(markdown.row([label, loop, *(
                    f"{geomean(ratios[(label, loop, x)]):.2f} (best "
                    f"{min(ratios[(label, loop, x)]):.2f}, worst "
                    f"{max(ratios[(label, loop, x)]):.2f})"
                    for x in LAYOUTS[1:])]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small tables, dims 12 and 64, L = 20, few "
                             "repeats; writes results/record_layout_quick.*")
    parser.add_argument("--tag", default=None,
                        help="write results/record_layout_TAG.{csv,md} "
                             "instead of record_layout.csv and RESULTS.md")
    parser.add_argument("--repeats", type=int, default=None,
                        help="default 9 (--quick: 3)")
    args = parser.parse_args(argv)
    tables, dims, lens, repeats = TABLES, DIMS, LENS, args.repeats or 9
    if args.quick:
        tables = (("beyond cache", 400_000), ("in cache", 20_000))
        dims, lens, repeats = (12, 64), (20,), args.repeats or 3
        args.tag = args.tag or "quick"
    isas = cpu_isas()
    if not isas:
        raise SystemExit("record_layout needs AVX2, FMA and F16C")
    with tempfile.TemporaryDirectory() as tmp:
        binaries = {isa: build(tmp, isa) for isa in isas}
        measured = measure(binaries, tables, dims, lens, repeats)
    lines = table_lines(measured, tables, dims, lens, repeats)
    print("\n".join(lines))
    stem = "record_layout" + (f"_{args.tag}" if args.tag else "")
    csv_path = results.write_csv(stem + ".csv", measured)
    if args.tag:
        md_path = os.path.join(results.RESULTS_DIR, stem + ".md")
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {csv_path} and {md_path}")
        return
    results.replace_section(
        "record_layout", "The int8 record: scale position and stride "
        "(`python benchmarks/record_layout.py`)", "\n".join(lines))
    print(f"wrote {csv_path} and RESULTS.md")


if __name__ == "__main__":
    main()

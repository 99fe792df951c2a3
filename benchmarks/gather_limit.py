"""The random-gather limit of this machine per table layout, next to the
shipped pooling kernel on the same memory (benchmarks/gather_limit.cc).

    python benchmarks/gather_limit.py [--quick]

For the op benchmark's 2M-row tables (512 bags x 80 uniform ids), each
layout's rows are only touched (one byte per 64-byte line, the scale's line
too), prefetched as the kernel does at distances 0, 16, 32, 64, 128 and the
kernel's own (PrefetchDistance); the fastest is the limit: a pooling kernel
on that layout does the same memory traffic and more work (on a noisy
machine it can still come out a few percent below it). Layouts: tfce's int8
(rowwise records, scale inline, 4 + D bytes), int4 (4 + ceil(D/2)), fp16
(2D) and int8_split (D, and its scale in a separate array: a second random
line per row), FBGEMM's 8-bit (D + 8, scale and bias inline) and 4-bit
(ceil(D/2) + 4) rowwise rows, touched only. 1 and 2 threads, 4 KiB pages
(how TF and torch allocate) and 2 MiB pages (what the ops ask for). Writes
results/gather_limit.csv and the gather_limit section of RESULTS.md.
"""
import argparse
import tempfile

from _harness import host, markdown, results, workers

DIMS = (12, 16, 32, 64, 128)
# (layout, its name in the table, whether the shipped kernel runs on it)
LAYOUTS = (("int8", "int8", True), ("int4", "int4", True),
           ("fp16", "fp16", True), ("int8_split", "int8 split", True),
           ("fbgemm8", "FBGEMM 8-bit", False),
           ("fbgemm4", "FBGEMM 4-bit", False))


def build(out_dir):
    return workers.build_cc(out_dir, "gather_limit")


def table_lines(rows, dims, rows_n, repeats):
    """The RESULTS.md section's lines for the measured ``rows``."""
    def pick(dim, threads, pages, layout):
        mine = [r for r in rows if (r["dim"], r["threads"], r["pages"],
                                    r["layout"]) == (dim, threads, pages,
                                                     layout)]
        touch = min(float(r["ns_per_row"]) for r in mine
                    if r["what"] == "touch")
        kernel = [float(r["ns_per_row"]) for r in mine
                  if r["what"].startswith("kernel")]
        return touch, (kernel[0] if kernel else None), float(
            mine[0]["lines_per_row"])

    isa = next(r["what"] for r in rows if r["what"].startswith("kernel"))
    lines = [
        f"Machine: {host.machine()}. "
        f"{rows_n:,}-row tables, 512 bags x 80 uniform ids (the op "
        "benchmark's 2M cells), ns per looked-up row, median of "
        f"{repeats} repeats. Each cell: **limit** = the fastest of touching "
        "every line of each row (and of its int8 split scale), prefetched as "
        "the kernel does, at distance 0, 16, 32, 64, 128 or the kernel's own; "
        f"then **kernel** = the shipped pooling kernel ({isa[7:]}, the ops' "
        "prefetch distance) on the same memory, no TensorFlow, and in "
        "brackets kernel / limit. Layouts (bytes per row): int8 4 + D "
        "(rowwise, scale inline), int4 4 + ceil(D/2), fp16 2D, int8 split D "
        "+ a 4-byte scale in a separate array, FBGEMM 8-bit D + 8, FBGEMM "
        "4-bit ceil(D/2) + 4 (FBGEMM's touched only). Lines per row: int8 "
        "split counts the scale's line.", "",
        *markdown.header(["D", "threads", "pages",
                          *(name for _, name, _ in LAYOUTS),
                          "lines/row " + ", ".join(
                              name for _, name, _ in LAYOUTS)])]
    for dim in dims:
        for threads in (1, 2):
            for pages in ("4K", "2M"):
                cells, counts = [], []
                for layout, _, kernel in LAYOUTS:
                    limit, ns, lines_per_row = pick(dim, threads, pages,
                                                    layout)
                    cells.append(f"{limit:.1f} / {ns:.1f} ({ns / limit:.2f})"
                                 if kernel else f"{limit:.1f}")
                    counts.append(f"{lines_per_row:.2f}")
                lines.append(markdown.row([dim, threads, pages, *cells,
                                           ", ".join(counts)]))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one small table, few repeats (a smoke test)")
    args = parser.parse_args(argv)
    rows_n, dims, repeats = 2_000_000, DIMS, 5
    if args.quick:
        rows_n, dims, repeats = 100_000, (12,), 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(tmp)
        for dim in dims:
            for threads in (1, 2):
                for huge in (0, 1):
                    print(f"  {rows_n:,} rows, dim {dim}, {threads} thread(s), "
                          f"{'2 MiB' if huge else '4 KiB'} pages", flush=True)
                    rows += workers.run_csv(
                        [binary, str(rows_n), str(dim), "80", str(threads),
                         str(huge), str(repeats)],
                        rows=rows_n, dim=dim, threads=threads,
                        pages="2M" if huge else "4K",
                        **host.machine_fields())
    if args.quick:
        print("\n".join(f"{r['layout']} {r['what']} pf={r['prefetch']}: "
                        f"{float(r['ns_per_row']):.2f} ns/row" for r in rows))
        print("\n".join(table_lines(rows, dims, rows_n, repeats)))
        return
    results.write_csv("gather_limit.csv", rows)
    lines = table_lines(rows, dims, rows_n, repeats)
    results.replace_section(
        "gather_limit", "Random-gather limit per layout "
        "(`python benchmarks/gather_limit.py`)", "\n".join(lines))
    print("wrote results/gather_limit.csv and RESULTS.md")


if __name__ == "__main__":
    main()

"""The random-gather limit of this machine per table layout, next to the
shipped pooling kernel on the same memory (benchmarks/gather_limit.cc).

    python benchmarks/gather_limit.py [--quick]

For the op benchmark's 2M-row tables (512 bags x 80 uniform ids), each
layout's rows are only touched (one byte per 64-byte line, the scale's line
too), prefetched as the kernel does at distances 0, 16, 32, 64 and the
kernel's own (PrefetchDistance); the fastest is the limit: a pooling kernel
on that layout does the same memory traffic and more work (on a noisy
machine it can still come out a few percent below it). The tfce int8 layout keeps its scales in a
separate array (a second random line per row); FBGEMM's 8-bit layout keeps
scale and bias inline (D + 8 bytes). 1 and 2 threads, 4 KiB pages (how TF
and torch allocate) and 2 MiB pages (what the ops ask for). Writes
results/gather_limit.csv and the gather_limit section of RESULTS.md.
"""
import argparse
import tempfile

from _harness import host, markdown, results, workers

DIMS = (12, 16, 32, 64, 128)


def build(out_dir):
    return workers.build_cc(out_dir, "gather_limit")


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
                        pages="2M" if huge else "4K")
    if args.quick:
        print("\n".join(f"{r['layout']} {r['what']} pf={r['prefetch']}: "
                        f"{float(r['ns_per_row']):.2f} ns/row" for r in rows))
        return
    results.write_csv("gather_limit.csv", rows)

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
        f"{repeats} repeats. **limit** = the fastest of touching every line "
        "of each row (and of its int8 scale), prefetched as the kernel does, "
        "at distance 0, 16, 32, 64 or the kernel's own; **kernel** = the "
        f"shipped pooling kernel ({isa[7:]}, the ops' "
        "prefetch distance) on the same memory, no TensorFlow; in brackets kernel / "
        "limit. `int8 inline` is FBGEMM's 8-bit rowwise layout (D + 8 bytes, "
        "scale and bias in the row), touched only. Lines per row: int8 "
        "counts the scale's line.", "",
        *markdown.header(["D", "threads", "pages", "int8 limit",
                          "int8 kernel", "fp16 limit", "fp16 kernel",
                          "int8 inline limit",
                          "lines/row int8, fp16, inline"])]
    for dim in dims:
        for threads in (1, 2):
            for pages in ("4K", "2M"):
                i8, k8, l8 = pick(dim, threads, pages, "int8")
                f16, k16, l16 = pick(dim, threads, pages, "fp16")
                inl, _, linl = pick(dim, threads, pages, "int8_inl")
                lines.append(
                    f"| {dim} | {threads} | {pages} | {i8:.1f} | "
                    f"{k8:.1f} ({k8 / i8:.2f}) | {f16:.1f} | "
                    f"{k16:.1f} ({k16 / f16:.2f}) | {inl:.1f} | "
                    f"{l8:.2f}, {l16:.2f}, {linl:.2f} |")
    results.replace_section(
        "gather_limit", "Random-gather limit per layout "
        "(`python benchmarks/gather_limit.py`)", "\n".join(lines))
    print("wrote results/gather_limit.csv and RESULTS.md")


if __name__ == "__main__":
    main()

"""The kernel ladder (benchmarks/ladder.cc): ns per looked-up row for each
technique step, int8 and fp16, with FP32 pooling as the baseline. Steps 0-4
are written on the int8_split layout (0.1.0's int8: values, and scales in a
separate array) and fp16; the shipped kernel (steps 5-6, and the prefetch
sweep) also runs on the rowwise int8 and int4 records of the same values.

    python benchmarks/ladder.py [--quick]   # --quick: a smoke test, writes nothing

Builds the C++ benchmark with setup.py's per-file kernel flags, runs it for
an in-cache table (50k rows) and one far beyond the last-level cache (1.5 GB
of FP32 per dim, so the int8 copy alone exceeds a 260 MB L3) over dims 12,
16, 32, 64 (12 weighs most in the mix, as in production recommenders), and
writes
benchmarks/results/ladder.csv, benchmarks/results/ladder.png and the ladder
section of benchmarks/RESULTS.md.
"""
import argparse
import os
import tempfile

from _harness import charts, markdown, results, workers

# Share of lookups per dim in the mix: dim-12-heavy.
MIX = {12: 0.5, 16: 0.2, 32: 0.2, 64: 0.1}
PREFETCH = [0, 8, 16, 32, 64, 128, 256]
STEPS = ["0 naive", "1 simd", "2 +rem4", "3 +load", "4 +fused", "5 +shape",
         "6 +pref"]
SHIPPED = ("5 +shape", "6 +pref")  # the steps every format runs
# The formats of the CSV: those of every step, then those of SHIPPED only.
FORMATS = ("int8_split", "fp16", "int8", "int4")


def build(out_dir):
    # The benchmark's own steps use AVX2 intrinsics: it runs on AVX2 CPUs only.
    return workers.build_cc(out_dir, "ladder",
                            flags=("-O3", "-mavx2", "-mfma", "-mf16c"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small tables, few repeats (a smoke test)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    # (label, rows for a dim): every dim of a group has the same footprint.
    tables = [("in cache", lambda dim: 50_000),
              ("beyond L3", lambda dim: int(1.5e9 // (4 * dim)))]
    repeats = args.repeats
    if args.quick:
        tables = [("in cache", lambda dim: 20_000),
                  ("out of cache", lambda dim: int(2e7 // (4 * dim)))]
        repeats = 3

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(tmp)
        for label, rows_for in tables:
            for dim in MIX:
                print(f"  {label}: {rows_for(dim):>11,} rows, dim {dim}",
                      flush=True)
                rows += workers.run_csv([binary, str(rows_for(dim)), str(dim),
                                         "512", "20", str(repeats)],
                                        group=label)
        big_label, big_rows = tables[-1]
        sweep = []
        for dim in (12, 64):
            print(f"  prefetch sweep, {big_label}, dim {dim}", flush=True)
            sweep += workers.run_csv([binary, str(big_rows(dim)), str(dim), "512",
                                      "20", str(repeats),
                                      ",".join(map(str, PREFETCH))],
                                     group=big_label)
        rows += sweep

    def ns(group, dim, fmt, step):
        for r in rows:
            if (r["group"], int(r["dim"]), r["format"], r["step"]) == (
                    group, dim, fmt, step):
                return float(r["ns_per_row"])
        raise KeyError((group, dim, fmt, step))

    def mix(group, fmt, step):
        return sum(share * ns(group, dim, fmt, step)
                   for dim, share in MIX.items())

    lines = [
        "ns per looked-up row (median of repeats; 512 bags x 20 ids, weighted "
        "sum, uniform ids, 1 thread, AVX2 kernels). Steps 0-4 are written on "
        "the int8_split layout (int8 values, scales in a separate array: "
        "0.1.0's int8) and fp16; the shipped kernel (steps 5-6) also runs on "
        "the int8 and int4 rowwise records (scale inline) of the same "
        "values. `mix` weighs dims "
        + ", ".join(f"{d}: {s:.0%}" for d, s in MIX.items())
        + ". In brackets: the ratio to the faster of the two FP32 baselines "
        "(plain, and with the shipped kernel's prefetch) on the same table; "
        "< 1 is faster than FP32.", ""]
    for group, rows_for in tables:
        lines += [f"**{group}** (rows: " + ", ".join(
            f"d{d} {rows_for(d):,}" for d in MIX) + ")", "",
                  *markdown.header(["step", *(f"int8 split d{d}" for d in MIX),
                                    *(f"{f.replace('_', ' ')} mix"
                                      for f in FORMATS)])]
        fp32_mix = None
        for base in ("fp32", "fp32+pref"):
            fp32 = {d: ns(group, d, "fp32", base) for d in MIX}
            base_mix = sum(share * fp32[d] for d, share in MIX.items())
            fp32_mix = base_mix if fp32_mix is None else min(fp32_mix, base_mix)
            lines.append(f"| {base} baseline | " + " | ".join(
                f"{fp32[d]:.1f}" for d in MIX) + " | "
                + " | ".join(f"{base_mix:.1f}" for _ in FORMATS) + " |")
        for step in STEPS:
            cells = [f"{ns(group, d, 'int8_split', step):.1f}" for d in MIX]
            for fmt in FORMATS:
                if step not in SHIPPED and fmt not in FORMATS[:2]:
                    cells.append("–")
                    continue
                m = mix(group, fmt, step)
                cells.append(f"{m:.1f} ({m / fp32_mix:.2f})")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"**Prefetch distance sweep** (shipped AVX2 kernel, {big_label} "
              "table; ns per row)", "",
              *markdown.header(["format, dim", *PREFETCH])]
    for fmt in FORMATS:
        for dim in (12, 64):
            lines.append(f"| {fmt.replace('_', ' ')}, {dim} | " + " | ".join(
                f"{ns(big_label, dim, fmt, f'prefetch={p}'):.1f}" for p in PREFETCH) + " |")
    lines.append("")
    if args.quick:  # a smoke test: results and RESULTS.md are left alone
        print("\n".join(lines))
        return
    results.write_csv("ladder.csv", rows)
    plt = charts.pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, len(tables), figsize=(11, 4), sharey=False)
        for ax, (group, _) in zip(axes, tables):
            fp32_mix = min(sum(s * ns(group, d, "fp32", b) for d, s in MIX.items())
                           for b in ("fp32", "fp32+pref"))
            x = range(len(STEPS))
            ax.plot(x, [mix(group, "int8_split", s) for s in STEPS], "o-",
                    label="int8 split")
            ax.plot(x, [mix(group, "fp16", s) for s in STEPS], "s-", label="fp16")
            shipped = [STEPS.index(s) for s in SHIPPED]
            ax.plot(shipped, [mix(group, "int8", s) for s in SHIPPED], "^",
                    label="int8 (rowwise)")
            ax.plot(shipped, [mix(group, "int4", s) for s in SHIPPED], "v",
                    label="int4 (rowwise)")
            ax.axhline(fp32_mix, color="gray", ls="--", label="fp32 (faster baseline)")
            ax.set_xticks(list(x), STEPS, rotation=30, ha="right")
            ax.set_title(f"{group} table, dim-12-heavy mix")
            ax.set_ylabel("ns per row")
            ax.legend()
        fig.tight_layout()
        charts.save(fig, os.path.join(results.RESULTS_DIR, "ladder.png"),
                    dpi=100)
        lines.append("![ladder](results/ladder.png)")
    results.replace_section("ladder", "Kernel ladder (`python benchmarks/ladder.py`)",
                               "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

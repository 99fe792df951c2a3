"""Software prefetch off and on in the shipped pooling kernel, per table
size, dim and bag length (benchmarks/prefetch_policy.cc, no TensorFlow): the
measurements behind the ops' prefetch policy (PoolPrefetchRows in
kernels/dispatch.h: no prefetch for long bags of short rows of a table
that stays in cache).

    python benchmarks/prefetch_policy.py [--quick]     # ~2 min

Writes results/prefetch_policy.csv and the prefetch_policy section of
RESULTS.md.
"""
import argparse
import csv
import io
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402
import results_md  # noqa: E402

ROWS = (100_000, 400_000, 1_000_000, 2_000_000)
DIMS = (8, 12, 16, 24, 32, 64, 128)
LENS = (1, 8, 20, 80)


def build(out_dir):
    return kernel_objects.build_benchmark(out_dir,
                                          "benchmarks/prefetch_policy.cc")


def measure(binary, rows, dims, lens, repeats):
    env = {k: v for k, v in os.environ.items() if k != "TFCE_PREFETCH_ROWS"}
    out = []
    for r in rows:
        for d in dims:
            for L in lens:
                print(f"  {r:,} rows, dim {d}, {L} ids per bag", flush=True)
                text = subprocess.run(
                    [binary, str(r), str(d), str(L), str(repeats)], env=env,
                    check=True, capture_output=True, text=True).stdout
                out += [dict(row, rows=r, dim=d, L=L)
                        for row in csv.DictReader(io.StringIO(text))]
    return out


def table_lines(results, rows, dims, lens, repeats):
    index = {(x["storage"], x["rows"], x["dim"], x["L"], int(x["prefetch"])):
             x for x in results}
    on = max(int(x["prefetch"]) for x in results)
    lines = [
        f"512 bags x L uniform ids, ns per looked-up row, median of {repeats} "
        f"repeats, prefetch off and {on} rows ahead timed round-robin in one "
        "process; tables of 4 MiB or more on 2 MiB pages, as the ops do. "
        "Each cell: off / on (**bold**: the one the ops choose, "
        "`PoolPrefetchRows`). The policy turns prefetch off for bags of 8 ids "
        "or more of a table of at most 8x one core's L2 with rows under 64 "
        "bytes.",
        "",
        "| storage | rows | D | table MiB | "
        + " | ".join(f"L = {L}" for L in lens) + " |",
        "|---|---|---|---|" + "---|" * len(lens)]
    right = total = 0
    loss = []
    for storage in ("int8", "fp16"):
        for r in rows:
            for d in dims:
                mib = r * (d + 4 if storage == "int8" else 2 * d) / 2**20
                cells = []
                for L in lens:
                    off = index[(storage, r, d, L, 0)]
                    onr = index[(storage, r, d, L, on)]
                    t_off, t_on = float(off["ns_per_row"]), float(onr["ns_per_row"])
                    chosen_off = int(off["policy"]) == 0
                    a, b = f"{t_off:.1f}", f"{t_on:.1f}"
                    cells.append(f"**{a}** / {b}" if chosen_off else f"{a} / **{b}**")
                    chosen, other = (t_off, t_on) if chosen_off else (t_on, t_off)
                    total += 1
                    right += chosen <= other * 1.05
                    loss.append(chosen / min(t_off, t_on))
                lines.append(f"| {storage} | {r:,} | {d} | {mib:.1f} | "
                             + " | ".join(cells) + " |")
    loss.sort()
    lines += ["", f"The policy's choice is the faster or within 5 % in "
              f"{right} of {total} cells; its time over the faster choice: "
              f"median {loss[len(loss) // 2]:.2f}x, worst {loss[-1]:.2f}x."]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="two small cells, few repeats (a smoke test)")
    args = parser.parse_args(argv)
    rows, dims, lens, repeats = ROWS, DIMS, LENS, 7
    if args.quick:
        rows, dims, lens, repeats = (100_000,), (12, 64), (20,), 2
    with tempfile.TemporaryDirectory() as tmp:
        print("building prefetch_policy", flush=True)
        binary = build(tmp)
        results = measure(binary, rows, dims, lens, repeats)
    lines = table_lines(results, rows, dims, lens, repeats)
    if args.quick:
        print("\n".join(lines))
        return
    results_md.write_csv("prefetch_policy.csv", results)
    results_md.replace_section(
        "prefetch_policy", "Prefetch policy: the pooling kernel with prefetch "
        "off and on (`python benchmarks/prefetch_policy.py`)",
        "\n".join(lines))
    print("wrote results/prefetch_policy.csv and RESULTS.md")


if __name__ == "__main__":
    main()

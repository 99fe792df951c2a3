"""Software prefetch off, 16 rows ahead and PrefetchDistance rows ahead in
the shipped pooling kernel, per table size, dim and bag length
(benchmarks/prefetch_policy.cc, no TensorFlow): the measurements behind the
ops' prefetch policy (PoolPrefetchRows in kernels/core/prefetch_policy.h: no prefetch
for long bags of short rows of a table that stays in cache, else about 64
cache lines in flight).

    python benchmarks/prefetch_policy.py [--quick]     # ~3 min

Writes results/prefetch_policy.csv and the prefetch_policy section of
RESULTS.md.
"""
import argparse
import os
import tempfile

from _harness import host, markdown, results, workers
from _harness.timing import geomean

ROWS = (100_000, 400_000, 1_000_000, 2_000_000)
DIMS = (8, 12, 16, 24, 32, 64, 128)
LENS = (1, 8, 20, 80)
# The storage formats benchmarks/prefetch_policy.cc runs, and the bytes one
# row of each costs (tf_compressed_embedding/quantization.py's row_bytes).
STORAGES = ("int8", "int4", "fp16", "int8_split")


def row_bytes(storage, dim):
    return {"int8": dim + 4, "int4": (dim + 1) // 2 + 4, "fp16": 2 * dim,
            "int8_split": dim + 4}[storage]


def build(out_dir):
    return workers.build_cc(out_dir, "prefetch_policy")


def measure(binary, rows, dims, lens, repeats):
    env = {k: v for k, v in os.environ.items() if k != "TFCE_PREFETCH_ROWS"}
    out = []
    for r in rows:
        for d in dims:
            for L in lens:
                print(f"  {r:,} rows, dim {d}, {L} ids per bag", flush=True)
                out += workers.run_csv(
                    [binary, str(r), str(d), str(L), str(repeats)], env=env,
                    rows=r, dim=d, L=L)
    return out


def table_lines(results, rows, dims, lens, repeats):
    cells = {}  # (storage, rows, dim, L) -> {distance: ns}, policy's distance
    for x in results:
        key = (x["storage"], x["rows"], x["dim"], x["L"])
        times, _ = cells.setdefault(key, ({}, int(x["policy"])))
        times[int(x["prefetch"])] = float(x["ns_per_row"])
    lines = [
        f"Machine: {host.machine()}. "
        f"512 bags x L uniform ids, ns per looked-up row, median of {repeats} "
        "repeats, timed round-robin in one process; tables of 4 MiB or more "
        "on 2 MiB pages, as the ops do. Each cell: prefetch off / 16 rows "
        "ahead / `PrefetchDistance` rows ahead (about 160 cache lines in "
        "flight; omitted where it is 16), **bold**: the one the ops choose "
        "(`PoolPrefetchRows`). The policy turns prefetch off for bags of 8 "
        "ids or more of a table of at most 8x one core's L2 with rows under "
        "64 bytes. Storages: int8 and int4 rowwise records (4 + D and 4 + "
        "ceil(D/2) bytes, scale inline), fp16, int8_split (D bytes and a "
        "separate 4-byte scale).",
        "",
        *markdown.header(["storage", "rows", "D", "ahead", "table MiB",
                          *(f"L = {L}" for L in lens)])]
    right = total = 0
    loss, gain = [], []
    for storage in STORAGES:
        for r in rows:
            for d in dims:
                mib = r * row_bytes(storage, d) / 2**20
                row_cells, ahead = [], 16
                for L in lens:
                    times, policy = cells[(storage, r, d, L)]
                    # off, 16, then PrefetchDistance (which may be below 16)
                    order = sorted(times, key=lambda k: (k != 0, k != 16))
                    ahead = order[-1] if len(order) == 3 else 16
                    row_cells.append(" / ".join(
                        f"**{times[k]:.1f}**" if k == policy else f"{times[k]:.1f}"
                        for k in order))
                    total += 1
                    right += times[policy] <= min(times.values()) * 1.05
                    loss.append(times[policy] / min(times.values()))
                    if policy not in (0, 16):
                        gain.append(times[16] / times[policy])
                lines.append(f"| {storage} | {r:,} | {d} | {ahead} | {mib:.1f} | "
                             + " | ".join(row_cells) + " |")
    loss.sort()
    lines += ["", f"The policy's choice is the fastest or within 5 % in "
              f"{right} of {total} cells; its time over the fastest: median "
              f"{loss[len(loss) // 2]:.2f}x, worst {loss[-1]:.2f}x."]
    if gain:
        lines[-1] += (f" Where it prefetches other than 16 rows ahead "
                      f"({len(gain)} cells), 16 ahead takes {geomean(gain):.2f}x "
                      f"its time (geometric mean; {min(gain):.2f}x to "
                      f"{max(gain):.2f}x).")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="two small cells, few repeats (a smoke test)")
    args = parser.parse_args(argv)
    rows, dims, lens, repeats = ROWS, DIMS, LENS, 7
    if args.quick:
        rows, dims, lens, repeats = (50_000,), (12, 64), (20,), 2
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(tmp)
        measured = measure(binary, rows, dims, lens, repeats)
    lines = table_lines(measured, rows, dims, lens, repeats)
    if args.quick:
        print("\n".join(lines))
        return
    results.write_csv("prefetch_policy.csv", measured)
    results.replace_section(
        "prefetch_policy", "Prefetch policy: the pooling kernel with prefetch "
        "off, 16 and PrefetchDistance rows ahead "
        "(`python benchmarks/prefetch_policy.py`)",
        "\n".join(lines))
    print("wrote results/prefetch_policy.csv and RESULTS.md")


if __name__ == "__main__":
    main()

"""The C++ benchmarks build with the kernels' own flags and run end to end
(--quick): each layout is timed and the shipped kernel runs on the memory the
benchmark set up. Timings are not asserted; benchmarks/RESULTS.md has them."""
import csv
import importlib
import math
import os
import re
import statistics
import subprocess
import sys

import numpy as np
from repo_paths import ROOT



def test_gather_limit_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gather_limit.py"),
         "--quick"], capture_output=True, text=True, timeout=600, check=True,
        cwd=ROOT).stdout
    timed = re.findall(r"^(\w+) (touch|kernel_\w+) pf=(\d+): ([\d.]+) ns/row$",
                       out, re.M)
    layouts = {(layout, what.split("_")[0]) for layout, what, _, _ in timed}
    # 2 threads x 2 page sizes for each layout's touch and each tfce kernel.
    assert layouts == {("int8", "touch"), ("fp16", "touch"),
                       ("int8_inl", "touch"), ("int8", "kernel"),
                       ("fp16", "kernel")}, out
    # Each of the 4 configurations (1 and 2 threads x 2 page sizes) touches
    # each layout at distances 0, 16, 32, 64 and the kernel's own, and runs
    # each tfce kernel once.
    for layout in ("int8", "fp16", "int8_inl"):
        distances = [int(pf) for name, what, pf, _ in timed
                     if name == layout and what == "touch"]
        assert all(distances.count(d) == 4 for d in (0, 16, 32, 64)), out
        assert len(distances) in (16, 20), out
    for layout in ("int8", "fp16"):
        assert sum(name == layout and what.startswith("kernel")
                   for name, what, _, _ in timed) == 4, out
    assert all(float(ns) > 0 for *_, ns in timed)


def test_prefetch_policy_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "prefetch_policy.py"),
         "--quick"], capture_output=True, text=True, timeout=600, check=True,
        cwd=ROOT).stdout
    cells = re.findall(r"^\| (int8|fp16) \| 50,000 \| (\d+) \| (\d+) \| [\d.]+ \| "
                       r"(.*) \|$", out, re.M)
    # int8 and fp16 at dims 12 and 64, each timed with prefetch off, 16 ahead
    # and PrefetchDistance ahead (int8: 64 / (bytes / 64 + 2) rows, fp16:
    # 64 / (bytes / 64 + 1)).
    assert sorted((s, d, a) for s, d, a, _ in cells) == [
        ("fp16", "12", "46"), ("fp16", "64", "21"), ("int8", "12", "29"),
        ("int8", "64", "21")], out
    for _, dim, _, cell in cells:
        times = cell.split(" / ")
        assert len(times) == 3 and all(float(t.strip("*")) > 0 for t in times), out
        # One choice marked; bags of 20 ids of dim 12 rows from a 50k-row
        # table (0.8 MiB int8, 1.1 MiB fp16: within 8x any L2 of 256 KiB or
        # more): no prefetch. Dim 64 rows: PrefetchDistance ahead.
        bold = [t.startswith("**") for t in times]
        assert bold == ([True, False, False] if dim == "12"
                        else [False, False, True]), out
    assert re.search(r"The policy's choice is the fastest or within 5 % in "
                     r"\d+ of 4 cells", out), out


def test_op_bench_pair_speedup_takes_the_loop_floor_out_of_both():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import op_bench_report
    finally:
        sys.path.pop(0)
    times = {  # cell -> (ours, theirs, empty loop), ns/row
        (100, 12, 1, "uniform"): (50.0, 70.0, 30.0),
        (100, 16, 1, "uniform"): (45.0, 90.0, 20.0),
        (100, 32, 1, "uniform"): (60.0, 65.0, 40.0),
        (200, 12, 1, "uniform"): (25.0, 60.0, 30.0),  # ours under the floor
        (200, 16, 1, "uniform"): (70.0, 29.0, 25.0),  # theirs under it
        (100, 12, 20, "uniform"): (8.0, 40.0, 2.0),
        (100, 16, 20, "uniform"): (9.0, 30.0, 4.0),
    }
    rows = []
    for (r, d, L, dist), values in times.items():
        for system, ns in zip(("ours", "theirs", "tf_loop_floor"), values):
            rows.append(dict(threads=1, rows=r, dim=d, L=L, dist=dist,
                             system=system, ns_per_row=ns))
    index = {(x["threads"], x["rows"], x["dim"], x["L"], x["dist"],
              x["system"]): x for x in rows}

    def geomean(xs):
        product = 1.0
        for x in xs:
            product *= x
        return product ** (1 / len(xs))

    raw = geomean([t / o for o, t, _ in times.values()])
    assert op_bench_report.pair_speedup(rows, index, "ours", "theirs", 1) == \
        f"{raw:.2f}×"
    # One floor per L, the median over its cells: 30 at L = 1, 3 at L = 20.
    assert op_bench_report.loop_floors(rows, 1) == {1: 30.0, 20: 3.0}
    kept = [(70 - 30) / (50 - 30), (90 - 30) / (45 - 30),
            (65 - 30) / (60 - 30), (40 - 3) / (8 - 3), (30 - 3) / (9 - 3)]
    assert op_bench_report.pair_speedup(rows, index, "ours", "theirs", 1, True) == \
        f"{geomean(kept):.2f}× (5 of 7 cells)"
    assert op_bench_report.pair_speedup(rows, index, "ours", "theirs", 2) == "–"


def _benchmarks_import(name):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_harness_write_csv_reads_back_with_the_csv_module(tmp_path):
    results = _benchmarks_import("_harness.results")
    rows = [{"name": "a", "x": 1 / 3, "n": 7, "flag": True, "skip": "no"},
            {"name": "b, quoted", "x": 2.0e-9, "n": 0, "flag": "", "skip": 1}]
    path = results.write_csv(str(tmp_path / "t.csv"), rows,
                             fields=["name", "x", "n", "flag"],
                             float_format="{:.6g}")
    with open(path, newline="") as f:
        back = list(csv.DictReader(f))
    assert back == [{"name": "a", "x": "0.333333", "n": "7", "flag": "True"},
                    {"name": "b, quoted", "x": "2e-09", "n": "0", "flag": ""}]
    # Default columns: the first row's keys, values as str() gives them.
    path = results.write_csv(str(tmp_path / "u.csv"), rows[:1])
    with open(path, newline="") as f:
        assert list(csv.DictReader(f)) == [
            {k: str(v) for k, v in rows[0].items()}]


def test_harness_replace_section_keeps_the_others(tmp_path, monkeypatch):
    results = _benchmarks_import("_harness.results")
    monkeypatch.setattr(results, "PATH", str(tmp_path / "RESULTS.md"))
    results.replace_section("a", "A", "first")
    results.replace_section("b", "B", "second\n")
    results.replace_section("a", "A again", "third")
    text = open(results.PATH).read()
    assert text == (results.HEADER + "\n"
                    "<!-- a:begin -->\n## A again\n\nthird\n<!-- a:end -->\n\n"
                    "<!-- b:begin -->\n## B\n\nsecond\n<!-- b:end -->\n")


def test_harness_geomean_leaves_out_missing_values():
    timing = _benchmarks_import("_harness.timing")
    values = [1.5, 2.0, 0.25, 8.0]
    assert math.isclose(timing.geomean(values + ["", None]),
                        statistics.geometric_mean(values))
    assert timing.geomean(["", None]) is None


def test_harness_round_robin_rotates_the_first_system():
    timing = _benchmarks_import("_harness.timing")
    order = []
    systems = [timing.Timed(name, lambda n, start, name=name: order.append(name),
                            n=1) for name in "abc"]
    timing.round_robin(systems, 4)
    assert order == list("abc" "bca" "cab" "abc")
    assert all(len(s.times) == 4 for s in systems)
    order.clear()
    timing.round_robin(systems, 2, rotate=False)
    assert order == list("abcabc")


def test_op_bench_error_bound_holds_for_the_formats_own_round_trip():
    op_bench = _benchmarks_import("op_bench")
    formats = op_bench.FORMATS  # tf_compressed_embedding/quantization.py
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((4000, 16)) * rng.uniform(
        0.01, 100, (4000, 1))).astype(np.float32)
    stats = op_bench.RowStats(table)
    ids = np.arange(len(table))
    ones = np.ones(len(table), np.float32)
    for fmt in formats.FORMATS:
        data, scales = formats.encode(table, fmt)
        err = np.abs(formats.decode(data, scales, fmt).astype(np.float64)
                     - table)
        bound = op_bench.error_bound(stats, ids, ones, len(table), fmt,
                                     f"tfce_{fmt}", table)
        assert np.all(err <= bound), fmt
        # Tight: the bound is the format's worst case, not a loose margin.
        assert np.max(err / bound) > 0.5, fmt

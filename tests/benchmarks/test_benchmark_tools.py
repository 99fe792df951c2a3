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
import pytest
from repo_paths import ROOT


GATHER_LAYOUTS = ("int8", "int4", "fp16", "int8_split", "fbgemm8", "fbgemm4")
KERNEL_LAYOUTS = ("int8", "int4", "fp16", "int8_split")  # tfce's


def test_gather_limit_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gather_limit.py"),
         "--quick"], capture_output=True, text=True, timeout=600, check=True,
        cwd=ROOT).stdout
    timed = re.findall(r"^(\w+) (touch|kernel_\w+) pf=(\d+): ([\d.]+) ns/row$",
                       out, re.M)
    layouts = {(layout, what.split("_")[0]) for layout, what, _, _ in timed}
    # 2 threads x 2 page sizes for each layout's touch and each tfce kernel.
    assert layouts == ({(x, "touch") for x in GATHER_LAYOUTS}
                       | {(x, "kernel") for x in KERNEL_LAYOUTS}), out
    # Each of the 4 configurations (1 and 2 threads x 2 page sizes) touches
    # each layout at distances 0, 16, 32, 64, 128 and the kernel's own, and
    # runs each tfce kernel once.
    for layout in GATHER_LAYOUTS:
        distances = [int(pf) for name, what, pf, _ in timed
                     if name == layout and what == "touch"]
        assert all(distances.count(d) == 4 for d in (0, 16, 32, 64, 128)), out
        assert len(distances) in (20, 24), out
    for layout in KERNEL_LAYOUTS:
        assert sum(name == layout and what.startswith("kernel")
                   for name, what, _, _ in timed) == 4, out
    assert all(float(ns) > 0 for *_, ns in timed)
    # The section's table: one line per configuration, limit / kernel
    # (kernel / limit) for tfce's layouts, the limit for FBGEMM's.
    table = re.findall(r"^\| 12 \| [12] \| [24][KM] \| (.*) \|$", out, re.M)
    assert len(table) == 4, out
    for line in table:
        cells = line.split(" | ")
        assert len(cells) == len(GATHER_LAYOUTS) + 1, out
        assert all(re.fullmatch(r"[\d.]+ / [\d.]+ \([\d.]+\)", c)
                   for c in cells[:4]), out
        assert all(re.fullmatch(r"[\d.]+", c) for c in cells[4:6]), out


def test_prefetch_policy_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "prefetch_policy.py"),
         "--quick"], capture_output=True, text=True, timeout=600, check=True,
        cwd=ROOT).stdout
    cells = re.findall(r"^\| (int8|int4|fp16|int8_split) \| 50,000 \| (\d+) "
                       r"\| (\d+) \| [\d.]+ \| (.*) \|$", out, re.M)
    # Each format at dims 12 and 64, each timed with prefetch off, 16 ahead
    # and PrefetchDistance ahead: 160 / (bytes / 64 + 1) rows, + 1 line for
    # int8_split's scale, within [8, 128]; bytes 4 + D for int8, 4 + D / 2
    # for int4, 2 D for fp16, D for int8_split.
    assert sorted((s, d, a) for s, d, a, _ in cells) == [
        ("fp16", "12", "116"), ("fp16", "64", "53"), ("int4", "12", "128"),
        ("int4", "64", "102"), ("int8", "12", "128"), ("int8", "64", "77"),
        ("int8_split", "12", "73"), ("int8_split", "64", "53")], out
    for storage, dim, _, cell in cells:
        times = cell.split(" / ")
        assert len(times) == 3 and all(float(t.strip("*")) > 0 for t in times), out
        # One choice marked. Bags of 20 ids from a 50k-row table of at most
        # 1.8 MiB (within 8x any L2 of 256 KiB or more) with rows under 64
        # bytes (all of dim 12, int4 of dim 64): no prefetch. Rows of 64
        # bytes or more: PrefetchDistance ahead.
        short = dim == "12" or storage == "int4"
        bold = [t.startswith("**") for t in times]
        assert bold == ([True, False, False] if short
                        else [False, False, True]), out
    assert re.search(r"The policy's choice is the fastest or within 5 % in "
                     r"\d+ of 8 cells", out), out


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
        err = np.abs(formats.decode(data, scales, fmt, 16).astype(np.float64)
                     - table)
        bound = op_bench.error_bound(stats, ids, ones, len(table), fmt,
                                     f"tfce_{fmt}", table)
        assert np.all(err <= bound), fmt
        # Tight: the bound is the format's worst case, not a loose margin.
        # int4's holds what its range search may clip (0.32 max|row|), which
        # a row reaches only when clipping that much lowers its squared
        # error: on these rows the largest error is about a quarter of it.
        assert np.max(err / bound) > (0.2 if fmt == "int4" else 0.5), fmt


def _fbgemm_rows(torch, packed, rows, op):
    """The decoded rows of FBGEMM's packed table, by its own op (bags of
    one id, weight 1)."""
    ids = torch.arange(rows)
    return op(packed, ids, ids, False, 0, False,
                      torch.ones(rows), None, False).numpy().astype(np.float64)


def test_op_bench_error_bound_holds_for_fbgemm_rows():
    torch = pytest.importorskip("torch")
    op_bench = _benchmarks_import("op_bench")
    op_bench_torch = _benchmarks_import("op_bench_torch")
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((4000, 16)) * rng.uniform(
        0.01, 100, (4000, 1))).astype(np.float32)
    table[:1000, 0] *= 20  # outliers: rows the 4-bit range search clips
    stats = op_bench.RowStats(table)
    ids = np.arange(len(table))
    ones = np.ones(len(table), np.float32)
    w32 = torch.from_numpy(table)
    ops = torch.ops.quantized
    cases = [("fbgemm8", True, ops.embedding_bag_byte_prepack(w32),
              ops.embedding_bag_byte_rowwise_offsets),
             ("fbgemm4", False, ops.embedding_bag_4bit_prepack(w32),
              ops.embedding_bag_4bit_rowwise_offsets)]
    if op_bench_torch.fbgemm4_search(torch):
        cases.append(("fbgemm4", True, op_bench_torch.fbgemm4_prepack(
            torch, w32), ops.embedding_bag_4bit_rowwise_offsets))
    for fmt, search, packed, op in cases:
        err = np.abs(_fbgemm_rows(torch, packed, len(table), op) - table)
        bound = op_bench.error_bound(stats, ids, ones, len(table), fmt,
                                     "pt_x", table, fbgemm4_search=search)
        assert np.all(err <= bound), (fmt, search)
        # Tight where nothing is clipped; with the range search the bound
        # holds the worst clip (33 of 200 steps), which a row reaches only
        # when clipping that much lowers its squared error.
        assert np.max(err / bound) > (0.5 if fmt == "fbgemm8" or not search
                                      else 0.2), (fmt, search)
        if fmt == "fbgemm4" and search:
            # The derivation's premise: the search keeps at least
            # (min_bins - 1) / NBINS of each row's range (15 float16 scales,
            # up to float16 rounding).
            nbins = op_bench_torch.FBGEMM4_NBINS
            min_bins = int(nbins * (1 - op_bench_torch.FBGEMM4_RATIO))
            scale = packed.numpy()[:, 8:10].copy().view(np.float16)[:, 0]
            kept = 15 * scale.astype(np.float64) / stats.range
            assert kept.min() >= (min_bins - 1) / nbins - 2.0 ** -10


def test_op_bench_row_bytes_are_the_formats_own():
    systems = _benchmarks_import("op_bench_systems")
    formats = _benchmarks_import("op_bench").FORMATS
    for dim in (1, 12, 15, 16, 128):
        for fmt in formats.FORMATS:
            assert systems.row_bytes(fmt, dim) == formats.row_bytes(fmt, dim)
        assert systems.row_bytes("fbgemm4", dim) == (dim + 1) // 2 + 4
        assert systems.row_bytes("fbgemm8", dim) == dim + 8


def test_record_layout_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "record_layout.py"),
         "--quick"], capture_output=True, text=True, timeout=900, check=True,
        cwd=ROOT).stdout
    record_layout = _benchmarks_import("record_layout")
    loops = record_layout.cpu_isas()
    # Memory: bytes per row of each layout, dims 12 and 64.
    assert re.search(r"^\| 12 \| 16 \| 16 \| 16 \| 16 \| 64 \(\+300%\) \|$",
                     out, re.M), out
    assert re.search(r"^\| 64 \| 68 \| 68 \| 72 \(\+6%\) \| 80 \(\+18%\) \| "
                     r"128 \(\+88%\) \|$", out, re.M), out
    # Time: a line per table, dim and loop (L = 20), (a)'s ns/row, the four
    # ratios, the shipped kernel on (a) and the lines per row.
    cells = re.findall(r"^\| (beyond|in) cache \([\d,]+ rows\) \| (\d+) \| 20 "
                       r"\| (\w+) \| ([\d.]+) \| (.*) \|$", out, re.M)
    assert sorted((t, d, loop) for t, d, loop, _, _ in cells) == sorted(
        (t, d, loop) for t in ("beyond", "in") for d in ("12", "64")
        for loop in loops), out
    for *_, a, rest in cells:
        ratios = rest.split(" | ")
        assert float(a) > 0 and len(ratios) == 6, out
        assert all(float(x) > 0 for x in ratios[:5]), out
        assert len(ratios[5].split(", ")) == 5, out


def test_op_bench_table_cache_makes_each_encoding_once(tmp_path):
    op_bench = _benchmarks_import("op_bench")
    made = []

    def make():
        made.append(1)
        return np.arange(6, dtype=np.uint8).reshape(2, 3)

    first = op_bench.table_cache(str(tmp_path), 2, 3)("tfce_int4", make)
    # Another worker process: a new cache object over the same folder.
    again = op_bench.table_cache(str(tmp_path), 2, 3)("tfce_int4", make)
    other = op_bench.table_cache(str(tmp_path), 2, 4)("tfce_int4", make)
    assert len(made) == 2 and np.array_equal(first, again)
    assert np.array_equal(other, first)
    assert op_bench.table_cache(None, 2, 3)("tfce_int4", make) is not None
    assert len(made) == 3

"""The C++ benchmarks build with the kernels' own flags and run end to end
(--quick): each layout is timed and the shipped kernel runs on the memory the
benchmark set up. Timings are not asserted; benchmarks/RESULTS.md has them."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    assert len(timed) == 4 * (3 * 3 + 2), out
    assert all(float(ns) > 0 for *_, ns in timed)


def test_prefetch_policy_quick():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "prefetch_policy.py"),
         "--quick"], capture_output=True, text=True, timeout=600, check=True,
        cwd=ROOT).stdout
    cells = re.findall(r"^\| (int8|fp16) \| 100,000 \| (\d+) \| [\d.]+ \| "
                       r"(\**)([\d.]+)\** / (\**)([\d.]+)\** \|$", out, re.M)
    # int8 and fp16 at dims 12 and 64, each timed with prefetch off and on.
    assert sorted((s, d) for s, d, *_ in cells) == [
        ("fp16", "12"), ("fp16", "64"), ("int8", "12"), ("int8", "64")], out
    assert all(float(off) > 0 and float(on) > 0
               for _, _, _, off, _, on in cells)
    # One choice marked per cell; bags of 20 ids of dim 12 rows from a
    # 100k-row table (1.5 MiB int8, 2.3 MiB fp16: within 8x any L2 of 256
    # KiB or more): no prefetch. (Dim 64 rows are prefetched.)
    for storage, dim, bold_off, _, bold_on, _ in cells:
        assert (bold_off == "**") != (bold_on == "**"), out
        assert (bold_off == "**") == (dim == "12"), out
    assert re.search(r"The policy's choice is the faster or within 5 % in "
                     r"\d+ of 4 cells", out), out

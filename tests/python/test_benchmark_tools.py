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

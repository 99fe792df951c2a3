"""Builds and runs the TF-free C++ kernel tests (tests/cc/kernel_test.cc)
under ASan+UBSan: every dispatch row against an independent reference, with
sentinel-padded outputs, and every half value under DAZ/FTZ."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_kernels_against_reference_under_sanitizers(tmp_path):
    assert "kernels/core/kernel_ref.cc" in kernel_objects.kernel_sources()
    objects = kernel_objects.compile_kernels(str(tmp_path), SANITIZE, opt="-O2")
    binary = str(tmp_path / "kernel_test")
    subprocess.run(["g++", "-std=c++17", "-O1", "-I.", *SANITIZE,
                    "tests/cc/kernel_test.cc",
                    *kernel_objects.SUPPORT_SOURCES, *objects, "-o", binary],
                   cwd=ROOT, check=True)
    result = subprocess.run([binary], capture_output=True, text=True,
                            timeout=600, check=False)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert re.fullmatch(r"\d+ passed, 0 failed", summary), summary
    assert "runtime error" not in result.stderr, result.stderr[-4000:]

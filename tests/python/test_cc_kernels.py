"""Builds and runs the TF-free C++ kernel tests (tests/cc/kernel_test.cc)
under ASan+UBSan: every dispatch row against an independent reference, with
sentinel-padded outputs."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ["tests/cc/kernel_test.cc", "kernels/dispatch.cc",
           "kernels/cpu_features.cc"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]


def setup_py_flags():
    """The per-file flags setup.py compiles the kernels with."""
    import importlib.util
    import sys
    from unittest import mock
    spec = importlib.util.spec_from_file_location(
        "tfce_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    with mock.patch("setuptools.setup"), mock.patch.object(sys, "argv", ["setup.py"]):
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            spec.loader.exec_module(module)
        finally:
            os.chdir(cwd)
    return module.OP_LIBRARY_SOURCES


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_kernels_against_reference_under_sanitizers(tmp_path):
    kernel_files = {src: flags for src, flags in setup_py_flags().items()
                    if re.match(r"kernels/kernel_\w+\.cc$", src)}
    assert "kernels/kernel_ref.cc" in kernel_files
    objects = []
    for src, flags in kernel_files.items():
        obj = str(tmp_path / (os.path.basename(src) + ".o"))
        subprocess.run(["g++", "-std=c++17", "-O2", "-I.", *SANITIZE, *flags,
                        "-c", src, "-o", obj], cwd=ROOT, check=True)
        objects.append(obj)
    binary = str(tmp_path / "kernel_test")
    subprocess.run(["g++", "-std=c++17", "-O1", "-I.", *SANITIZE, *SOURCES,
                    *objects, "-o", binary], cwd=ROOT, check=True)
    result = subprocess.run([binary], capture_output=True, text=True,
                            timeout=600, check=False)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert re.fullmatch(r"\d+ passed, 0 failed", summary), summary
    assert "runtime error" not in result.stderr, result.stderr[-4000:]

"""Builds and runs the TF-free C++ gtest tests (tests/cc/*_test.cc, all but
the TensorFlow one) under ASan+UBSan with g++: every kernel variant this CPU
can run against an independent reference, with sentinel-padded outputs,
every half value under DAZ/FTZ, the prefetch policy, the tuning variables
and the segment offsets core. They link the core's objects of the sanitized
op library build (tools/build_sanitized.sh, shared with tools/sanitize.sh),
so the kernels are tested as the sanitized library has them. (Bazel runs
the same tests without the sanitizers: tests/cc/BUILD.)"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from repo_paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import kernel_objects  # noqa: E402

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer"]
# Tests that need TensorFlow; Bazel runs them.
TF_TESTS = {"ops_registered_test.cc"}
TESTS = sorted(os.path.basename(p)
               for p in glob.glob(os.path.join(ROOT, "tests", "cc", "*_test.cc"))
               if os.path.basename(p) not in TF_TESTS)


def has_gtest():
    return os.path.isfile("/usr/include/gtest/gtest.h") or subprocess.run(
        ["g++", "-E", "-x", "c++", "-", "-o", os.devnull],
        input="#include <gtest/gtest.h>\n", text=True,
        capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def core_objects_under_sanitizers(tmp_path_factory):
    return (kernel_objects.sanitized_core_objects(),
            tmp_path_factory.mktemp("cc_tests"))


def test_the_tests_are_found():
    assert "kernel_variant_test.cc" in TESTS, TESTS
    assert "segment_offsets_test.cc" in TESTS, TESTS


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.skipif(not has_gtest(), reason="needs googletest (libgtest-dev)")
@pytest.mark.parametrize("test", TESTS)
def test_cc_under_sanitizers(test, core_objects_under_sanitizers):
    assert "kernels/core/kernel_scalar.cc" in kernel_objects.kernel_sources()
    objects, out = core_objects_under_sanitizers
    binary = str(out / test[:-len(".cc")])
    subprocess.run(["g++", "-std=c++17", "-O1", "-I.", *SANITIZE,
                    f"tests/cc/{test}", *objects, "-o", binary, "-lgtest_main", "-lgtest",
                    "-pthread"], cwd=ROOT, check=True)
    result = subprocess.run([binary, "--gtest_brief=1"], capture_output=True,
                            text=True, timeout=900, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "runtime error" not in result.stderr, result.stderr[-4000:]
    passed = re.search(r"\[  PASSED  \] (\d+) tests?", result.stdout)
    assert passed and int(passed.group(1)) > 0, result.stdout[-2000:]
    assert "[  FAILED  ]" not in result.stdout, result.stdout[-4000:]
    # What was skipped (variants this CPU cannot run), for the log.
    print(re.findall(r"\[  SKIPPED \] (\d+) tests?", result.stdout), test)

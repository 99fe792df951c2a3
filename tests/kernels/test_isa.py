"""Kernel rows: TFCE_ISA forces one, a bad value is a clear error, and the
op test files pass on every row this CPU supports (run in subprocesses, so
each gets its own dispatch decision)."""
import os
import subprocess
import sys

import pytest

import tf_compressed_embedding as tfce
from repo_paths import ROOT

OP_TEST_FILES = ["tests/tf_compressed_embedding/test_lookup_op.py",
                 "tests/tf_compressed_embedding/test_fused_decode_axpy_op.py",
                 "tests/tf_compressed_embedding/test_batched_op.py"]


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env},
                          check=False)


def test_active_isa_is_a_supported_row():
    rows = tfce.supported_isas()
    assert rows[-1] == "scalar"
    assert tfce.active_isa() in rows
    if "TFCE_ISA" not in os.environ:
        assert tfce.active_isa() == rows[0]  # the best row by default


def test_unknown_isa_is_a_clear_error():
    result = run_python(
        "import numpy as np, tensorflow as tf, tf_compressed_embedding as t\n"
        "ct = t.quantize(np.ones((2, 2), np.float32), 'int8')\n"
        "try:\n"
        "    t.active_isa()\n"
        "except ValueError as e:\n"
        "    print('ACTIVE:', e)\n"
        "try:\n"
        "    t.compressed_embedding_lookup(ct, [0])\n"
        "except tf.errors.InvalidArgumentError as e:\n"
        "    print('OP:', e.message)\n", TFCE_ISA="avx9000")
    assert result.returncode == 0, result.stderr
    for prefix in ("ACTIVE:", "OP:"):
        line = [out for out in result.stdout.splitlines() if out.startswith(prefix)]
        assert line, result.stdout
        assert "TFCE_ISA=avx9000 is not a kernel row of this library; valid " \
               "values: " in line[0]
        assert (f"valid values: avx512, avx2, sse, scalar (this CPU supports: "
                f"{', '.join(tfce.supported_isas())})") in line[0]


QUERY_ROWS = (
    "import numpy as np, tensorflow as tf, tf_compressed_embedding as t\n"
    "print('ROWS:', ','.join(t.supported_isas()))\n"
    "try:\n"
    "    print('ACTIVE:', t.active_isa())\n"
    "except ValueError as e:\n"
    "    print('ACTIVE:', e)\n")


def _line(stdout, prefix):
    lines = [out for out in stdout.splitlines() if out.startswith(prefix)]
    assert lines, stdout
    return lines[0][len(prefix):].strip()


@pytest.mark.parametrize("hidden", [["avx512"], ["avx512", "avx2"],
                                    ["avx512", "avx2", "sse"]])
def test_a_row_the_cpu_lacks_is_refused_naming_the_rows_it_has(hidden):
    # TFCE_HIDE_ISA plays a CPU without those rows on any host (the AMD
    # hosts have no avx512; the Intel ones have every row).
    rows = [r for r in tfce.supported_isas() if r not in hidden]
    env = {"TFCE_HIDE_ISA": ",".join(hidden)}
    result = run_python(QUERY_ROWS, TFCE_ISA=hidden[0], **env)
    assert result.returncode == 0, result.stderr
    assert _line(result.stdout, "ROWS:") == ",".join(rows)
    message = _line(result.stdout, "ACTIVE:")
    assert message == (
        f"TFCE_ISA={hidden[0]} was requested but this CPU (or OS) does not "
        f"support it; unset TFCE_ISA or choose a row this CPU supports: "
        f"{', '.join(rows)}")
    # Unforced, the best row left runs.
    env_unforced = {k: v for k, v in os.environ.items() if k != "TFCE_ISA"}
    unforced = subprocess.run([sys.executable, "-c", QUERY_ROWS],
                              capture_output=True, text=True, timeout=300,
                              env={**env_unforced, **env}, check=False)
    assert _line(unforced.stdout, "ACTIVE:") == rows[0], unforced.stderr


def test_the_scalar_row_cannot_be_hidden():
    result = run_python(QUERY_ROWS, TFCE_ISA="scalar",
                        TFCE_HIDE_ISA="avx512,avx2,sse,scalar")
    assert result.returncode == 0, result.stderr
    assert _line(result.stdout, "ROWS:") == "scalar"
    assert _line(result.stdout, "ACTIVE:") == "scalar"


@pytest.mark.skipif("TFCE_ISA" in os.environ,
                    reason="already running under a forced row")
@pytest.mark.parametrize("isa", tfce.supported_isas())
def test_op_suite_on_every_row(isa):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *OP_TEST_FILES],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "TFCE_ISA": isa}, check=False)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    check = run_python("import tf_compressed_embedding as t; "
                       "print(t.active_isa())", TFCE_ISA=isa)
    assert check.stdout.strip() == isa

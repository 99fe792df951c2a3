"""Large tables are backed by 2 MiB pages (kernels/tf/huge_pages.cc).

Each case runs in a fresh process: the advice is given once per table buffer
per process, and TFCE_HUGE_PAGES is read once. The process reports what the
library says it collapsed (MADV_COLLAPSE succeeded: the range is backed by
huge pages on return) and the kernel's accounting (/proc/self/smaps_rollup,
AnonHugePages), and checks the op's results against numpy after the
collapse. A table can share a VMA (the
malloc heap) with memory that was already huge, so the kernel's accounting is
checked to cover the collapse, not to grow by exactly its size."""
import json
import os
import platform
import subprocess
import sys

import pytest

from tf_compressed_embedding import quantization

MIB = 1 << 20

CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tf_compressed_embedding as tfce
from tf_compressed_embedding import _loader

rows, dim, fmt, calls = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                         int(sys.argv[4]))

def anon_huge():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0

rng = np.random.default_rng(0)
table = rng.standard_normal((rows, dim)).astype(np.float32)
ct = tfce.quantize(table, fmt)
dense = np.asarray(ct.dequantize())
del table
ids = rng.integers(0, rows, 4096)
for _ in range(calls):
    looked_up = tfce.compressed_embedding_lookup(ct, ids).numpy()
    pooled = tfce.fused_decode_axpy(ct, ids, np.arange(4096) // 8).numpy()
print(json.dumps({
    "collapsed": _loader.huge_page_bytes(),
    "anon_huge": anon_huge(),
    "lookup_ok": bool(np.array_equal(looked_up, dense[ids])),
    "pool_err": float(np.abs(pooled - dense[ids].reshape(512, 8, dim)
                             .sum(1)).max()),
}))
"""


def run_child(rows, dim, fmt="int8", calls=1, **env):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(rows), str(dim), fmt, str(calls)],
        env={**os.environ, **env}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def thp_mode():
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


def kernel_has_collapse():
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


needs_collapse = pytest.mark.skipif(
    platform.system() != "Linux" or thp_mode() in (None, "never")
    or not kernel_has_collapse(),
    reason="needs Linux >= 6.1 with transparent huge pages not 'never'")


@needs_collapse
@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_large_table_is_collapsed_and_results_unchanged(fmt):
    # int8_split: 24 MiB of rows + 8 MiB of scales; int8: 32 MiB of records;
    # int4: 20 MiB of records; fp16: 48 MiB of rows.
    rows, dim = 2 * MIB, 12
    out = run_child(rows, dim, fmt, TFCE_HUGE_PAGES="")
    table_bytes = rows * quantization.row_bytes(fmt, dim)
    buffers = 2 if fmt == "int8_split" else 1
    # Each buffer loses at most 2 MiB at each end to alignment.
    assert table_bytes - 4 * MIB * buffers <= out["collapsed"] <= table_bytes, out
    assert out["anon_huge"] >= out["collapsed"], out
    assert out["lookup_ok"]
    assert out["pool_err"] < 1e-3


@needs_collapse
def test_each_buffer_is_advised_once():
    once = run_child(MIB, 16, calls=1)
    thrice = run_child(MIB, 16, calls=3)
    assert once["collapsed"] > 0
    assert thrice["collapsed"] == once["collapsed"]


def test_disabled_by_env():
    out = run_child(MIB, 16, TFCE_HUGE_PAGES="0")
    assert out["collapsed"] == 0
    assert out["lookup_ok"] and out["pool_err"] < 1e-3


def test_small_tables_left_alone():
    # 1.25 MiB of int8 records (64 Ki x 20 bytes): under the 4 MiB threshold.
    out = run_child(64 * 1024, 16)
    assert out["collapsed"] == 0

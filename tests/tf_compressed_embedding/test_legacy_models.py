"""SavedModels written by version 0.1.0 (int8 with a separate scales array,
and fp16) still load and give bit-identical outputs.

The models and the outputs 0.1.0 computed for them, per kernel row, are in
tests/data/legacy_models_0.1.0, written by tests/support/legacy_models.py.
Each row is compared in a fresh process with TFCE_ISA set; a row the host
lacks, or that the writing host lacked, is skipped and says so.
"""
import os

import legacy_models
import numpy as np
import pytest
from repo_paths import TESTS

import tf_compressed_embedding as tfce

LEGACY = os.path.join(TESTS, "data", "legacy_models_0.1.0")


@pytest.mark.parametrize("isa", ["scalar", "sse", "avx2", "avx512"])
def test_legacy_models_agree_bit_for_bit(isa):
    if isa not in tfce.supported_isas():
        pytest.skip(f"this CPU has no {isa} kernels")
    recorded = os.path.join(LEGACY, f"outputs_{isa}.npz")
    if not os.path.exists(recorded):
        pytest.skip(f"the host that wrote {LEGACY} had no {isa} kernels")
    got = legacy_models.run_outputs(LEGACY, legacy_models.load_feeds(LEGACY), isa)
    with np.load(recorded) as want:
        assert sorted(got) == sorted(want.files)
        for key in want.files:
            assert got[key].dtype == want[key].dtype, key
            np.testing.assert_array_equal(got[key], want[key], err_msg=key, strict=True)

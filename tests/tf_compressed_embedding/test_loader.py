"""The op library loader: version guard, missing or foreign libraries."""
import os
import subprocess
import sys

import tensorflow as tf

from tf_compressed_embedding import _loader

PROBE = (
    "import numpy as np, tf_compressed_embedding as t\n"
    "ct = t.quantize(np.ones((2, 2), np.float32), 'int8')\n"  # import works
    "try:\n"
    "    t.compressed_embedding_lookup(ct, [0])\n"
    "except t.OpLibraryError as e:\n"
    "    print('ERROR:', e)\n")


def probe(library):
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True,
        timeout=300, env={**os.environ, _loader.LIBRARY_ENV: str(library)},
        check=False)
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stdout.splitlines()
              if line.startswith("ERROR:")]
    assert errors, result.stdout
    return errors[0]


def test_library_records_the_running_tf_version():
    assert _loader.built_for_tf_version(_loader.library_path()) == tf.__version__


def test_other_tf_version_is_refused_with_rebuild_hint(tmp_path):
    fake = tmp_path / "_ops.so"
    fake.write_bytes(b"\x7fELF junk TFCE_BUILT_FOR_TF=1.15.0; more")
    error = probe(fake)
    assert (f"was built for TensorFlow 1.15.0, but TensorFlow {tf.__version__}"
            " is running") in error
    assert "pip install --no-build-isolation -e ." in error


def test_missing_library(tmp_path):
    error = probe(tmp_path / "nothing.so")
    assert "op library is not built" in error
    assert "pip install --no-build-isolation -e ." in error


def test_foreign_library(tmp_path):
    fake = tmp_path / "other.so"
    fake.write_bytes(b"\x7fELF not ours")
    assert "is not a tf_compressed_embedding op library" in probe(fake)


def test_same_version_but_unloadable_library(tmp_path):
    fake = tmp_path / "broken.so"
    fake.write_bytes(b"TFCE_BUILT_FOR_TF=" + tf.__version__.encode() + b";")
    assert f"TensorFlow {tf.__version__} could not load" in probe(fake)

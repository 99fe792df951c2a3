"""The supported TensorFlow / Keras range: the bounds, and that setup.py, the
loader, the Keras layer and pyproject.toml all hold to the same one."""
import importlib.util
import os
import subprocess
import sys
import tomllib

import pytest

from tf_compressed_embedding import supported_versions as sv
from repo_paths import ROOT

OLDEST = "%d.%d" % sv.TF_OLDEST
NEWEST = "%d.%d" % sv.TF_NEWEST


def _minor_before(release):
    return f"{release[0]}.{release[1] - 1}.0"


def _minor_after(release):
    return f"{release[0]}.{release[1] + 1}.0"


@pytest.mark.parametrize("version", [
    f"{OLDEST}.0", f"{OLDEST}.2", f"{NEWEST}.0", f"{NEWEST}.7",
    f"{NEWEST}.0rc1", _minor_after(sv.TF_NEWEST), "3.0.0"])
def test_supported_or_newer_tf_is_not_refused(version):
    assert sv.tf_too_old(version) is None


@pytest.mark.parametrize("version", [
    _minor_before(sv.TF_OLDEST), "1.15.5",
    "2.9.3",  # 9 < 16 as numbers, though "2.9" > "2.16" as strings
    "garbage"])
def test_older_tf_is_refused_with_the_range_and_an_install_command(version):
    message = sv.tf_too_old(version)
    assert message is not None
    assert f"TensorFlow {version} is not supported" in message
    assert f"{OLDEST} to {NEWEST}" in message
    assert f"pip install 'tensorflow-cpu>={OLDEST}," in message


def test_only_tf_newer_than_the_tested_range_is_called_untested():
    assert sv.tf_untested(f"{NEWEST}.9") is None
    assert sv.tf_untested(f"{OLDEST}.0") is None
    message = sv.tf_untested(_minor_after(sv.TF_NEWEST))
    assert f"newer than {NEWEST}" in message
    assert sv.TF_NEWEST_TESTED in message


def test_keras_bound():
    oldest = "%d.%d" % sv.KERAS_OLDEST
    assert sv.keras_too_old(f"{oldest}.0") is None
    assert sv.keras_too_old("3.15.1") is None
    message = sv.keras_too_old(_minor_before(sv.KERAS_OLDEST))
    assert f"older than {oldest}" in message
    assert f"pip install 'keras>={oldest}'" in message


def test_tested_versions_are_the_bounds():
    assert sv.TF_OLDEST_TESTED.startswith(OLDEST + ".")
    assert sv.TF_NEWEST_TESTED.startswith(NEWEST + ".")
    assert sv.KERAS_OLDEST_TESTED.startswith("%d.%d." % sv.KERAS_OLDEST)


def test_pyproject_cpu_extra_states_the_same_range():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert sorted(extras["cpu"]) == sorted([
        f"tensorflow-cpu>={OLDEST},<{_minor_after(sv.TF_NEWEST)[:-2]}",
        "keras>=%d.%d" % sv.KERAS_OLDEST])


def _setup_module():
    spec = importlib.util.spec_from_file_location(
        "tfce_setup_for_versions", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() only runs as __main__
    return module


def test_setup_py_refuses_old_tf_and_warns_about_untested_tf(capsys):
    setup = _setup_module()
    with pytest.raises(SystemExit, match=f"{OLDEST} to {NEWEST}"):
        setup.check_tf_version(_minor_before(sv.TF_OLDEST))
    setup.check_tf_version(sv.TF_OLDEST_TESTED)
    setup.check_tf_version(sv.TF_NEWEST_TESTED)
    assert capsys.readouterr().err == ""
    setup.check_tf_version(_minor_after(sv.TF_NEWEST))
    assert "warning: TensorFlow" in capsys.readouterr().err


def _run(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=300, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result


def test_loader_refuses_an_older_running_tf():
    # The library is built for the running TF; only the version differs, so
    # the refusal is the range check, not the build-version check.
    old = _minor_before(sv.TF_OLDEST)
    result = _run(
        "import tensorflow as tf\n"
        f"tf.__version__ = {old!r}\n"
        "import numpy as np, tf_compressed_embedding as t\n"
        "ct = t.quantize(np.ones((2, 2), np.float32), 'int8')\n"
        "try:\n"
        "    t.compressed_embedding_lookup(ct, [0])\n"
        "except t.OpLibraryError as e:\n"
        "    print('ERROR:', e)\n")
    assert f"ERROR: TensorFlow {old} is not supported" in result.stdout


def test_layer_warns_on_import_under_an_older_keras():
    old = _minor_before(sv.KERAS_OLDEST)
    result = _run("import keras\n"
                  f"keras.__version__ = {old!r}\n"
                  "import tf_compressed_embedding\n")
    assert f"Keras {old} is older than" in result.stderr
    current = _run("import tf_compressed_embedding\n")
    assert "is older than" not in current.stderr

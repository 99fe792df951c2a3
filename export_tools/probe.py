"""Reads a SavedModel the way the export does (TF's loader, graph only, and
Grappler's inliner on every signature) in a child process, so a TensorFlow
abort on a corrupt or hostile model (a CHECK failure, a segfault) becomes a
clear error instead of killing the tool.

    python -m export_tools.probe SRC

Exit 0 when the steps ran, or ended in a refusal (ExportError): the parent
runs them again in-process and reports the refusal itself. TensorFlow
dying shows as a negative return code (the signal).
"""
import os
import signal
import subprocess
import sys

from export_tools.errors import ExportError

PROBE_COMMAND = [sys.executable, "-m", "export_tools.probe"]


def check_loadable(src):
    """Raises ExportError if reading `src` kills a process."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(PROBE_COMMAND + [src], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode == 0:
        return
    lines = done.stderr.strip().splitlines()
    last = lines[-1] if lines else "no message"
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise ExportError(f"TensorFlow aborted while reading {src} ({name}): the "
                          f"SavedModel is corrupt or was altered; last message: {last}")
    raise ExportError(f"reading {src} failed in a child process "
                      f"(exit {done.returncode}): {last}")


def _read(src):
    from export_tools.signature_rewrite import analyze
    from export_tools.source import SourceModel
    source = SourceModel(src)
    for key in source.signature_keys():
        analyze(source, key, source.loaded.signatures[key])


if __name__ == "__main__":
    try:
        _read(sys.argv[1])
    except ExportError:
        pass  # a refusal, reported by the parent's own run

"""Verification: run the source and the compressed model in fresh processes on
the same inputs and compare every output.

Inputs are the user's examples, else the source's own warmup requests (see
examples.py), else generated valid for the signature (input_generation.py).

Float outputs must agree within a tolerance derived from the quantization:
`factor * worst relative table error * max|source output|`, plus a
float-rounding floor (the relative error is the largest |decoded - FP32| of
an element over its row's largest magnitude, measured while the tables were
encoded; `quantization.max_decode_error(fmt, 1)` bounds it per format). With
`--dtype auto` the tolerance is the user's bound, `--max-error`. Other
outputs (ids, strings, classes) must be equal, except in one case: a
signature that returns ranked ids together with their scores (a float
output of the same shape, as TFRS retrieval and top-k heads do).
Compressing the tables moves scores by up to the tolerance, so candidates
whose scores tie within it can trade places, as they do between
the source and its own dequantized copy. There ids may differ, because the
scores at every rank are checked against the source's; the count of
differing ids is reported as a warning.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from export_tools.errors import ExportError
from export_tools.run_signatures import load_feeds, save_feeds
from export_tools.warmup import WARMUP_FILE

TOLERANCE_FACTOR = 16.0
ROUNDING_FLOOR = 1e-5
# The loaders a model is run through, as the messages name them.
TF2 = "tf.saved_model.load"
SESSION = "the Session loader (TF Serving's path)"


def run_model(path, feeds, load_ops, workdir, session=False):
    """{loader: {signature: [{output: array}, ...]}} from running `path` in a
    fresh process: through `tf.saved_model.load` (loader TF2), and with
    `session` also through the Session loader (loader SESSION)."""
    inputs = os.path.join(workdir, "inputs.tfrecord")
    run = len(os.listdir(workdir))
    outputs = {TF2: os.path.join(workdir, f"outputs_{run}.tfrecord")}
    if session:
        outputs[SESSION] = os.path.join(workdir, f"outputs_{run}_session.tfrecord")
    save_feeds(inputs, feeds)
    command = [sys.executable, "-m", "export_tools.run_signatures", path, inputs,
               outputs[TF2]]
    if load_ops:
        command.append("--load-ops")
    if session:
        command += ["--session-outputs", outputs[SESSION]]
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root,
                                                        os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise ExportError(
            f"verification: running {path} failed: "
            f"{lines[-1] if lines else 'exit ' + str(done.returncode)}. If the "
            f"inputs verification used are not valid for this model, pass real "
            f"ones: --examples FILE (.npz or a TFRecord of PredictionLogs), or "
            f"put them in SRC/{WARMUP_FILE}")
    return {loader: load_feeds(file) for loader, file in outputs.items()}


class ToleranceExceeded(ExportError):
    """A float output differs from the source's by more than the tolerance
    (`difference`, the largest over every float output)."""

    def __init__(self, message, difference):
        super().__init__(message)
        self.difference = difference


def verify(src, dst, feeds, load_ops, relative_error, factor=TOLERANCE_FACTOR,
           tolerance=None):
    """Runs both models on `feeds` ({signature: [feed, ...]}): the source
    through `tf.saved_model.load`, the compressed model through it and
    through the Session loader (the two run different graph functions, see
    export_tools/session_tables.py). Returns ({sig: {out: max abs diff, or
    count of differing values, over the requests and loaders}}, tolerance,
    [warning], the largest float difference), or raises ExportError naming
    the output that does not agree (ToleranceExceeded for float outputs,
    naming the one that differs most). `tolerance`, if given, is the
    absolute tolerance instead of the derived one."""
    with tempfile.TemporaryDirectory(prefix="tfce-verify-") as workdir:
        want = run_model(src, feeds, False, workdir)[TF2]
        got = run_model(dst, feeds, load_ops, workdir, session=True)
    if tolerance is None:
        scale = max((float(np.abs(v[np.isfinite(v)]).max(initial=0.0))
                     for requests in want.values() for outs in requests
                     for v in outs.values() if np.issubdtype(v.dtype, np.floating)),
                    default=0.0)
        tolerance = factor * relative_error * scale + ROUNDING_FLOOR * max(scale, 1.0)
    diffs, warnings, worst = {}, [], (0.0, None)
    for loader, outputs in got.items():
        for sig, requests in want.items():
            diffs.setdefault(sig, {})
            for i, outs in enumerate(requests):
                where = f"signature {sig!r}" + (f" request {i}" if len(requests) > 1
                                                 else "")
                if loader != TF2:
                    where += f" through {loader}"
                for key, value in outs.items():
                    diff = _difference(where, key, outputs[sig][i][key], value, outs,
                                       tolerance, warnings)
                    diffs[sig][key] = max(diffs[sig].get(key, 0.0), diff)
                    if np.issubdtype(value.dtype, np.floating) and not diff <= worst[0]:
                        worst = (diff, f"{where} output {key!r}")
    if not worst[0] <= tolerance:
        raise ToleranceExceeded(f"verification: {worst[1]} differs from the source by "
                                f"{worst[0]:.3g}, above the tolerance {tolerance:.3g}",
                                worst[0])
    return diffs, tolerance, warnings, worst[0]


def _difference(where, key, got, want, outputs, tolerance, warnings):
    """The difference of one output (see verify); appends to `warnings`."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ExportError(f"verification: {where} output {key!r} is "
                          f"{got.dtype}{list(got.shape)}, the source gives "
                          f"{want.dtype}{list(want.shape)}")
    if np.issubdtype(want.dtype, np.floating):
        return _float_difference(got, want)
    diff = float(np.count_nonzero(got != want))
    if diff:
        warnings.append(_ranked_ids_differ(where, key, want, outputs, diff))
    return diff


def _float_difference(got, want):
    """max |got - want| over finite values; NaN where the source has NaN and
    the same infinity where it has one agree (an empty bag's 0/0 mean), any
    other non-finite mismatch is an infinite difference."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want) & np.isfinite(got)
    same = (np.isnan(want) & np.isnan(got)) | (np.isinf(want) & (got == want))
    if not np.all(finite | same):
        return float("inf")
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0))


def _ranked_ids_differ(where, key, value, outputs, count):
    """The warning for a non-float output that differs from the source, if it
    comes with scores of its shape (see the module); else ExportError."""
    scores = sorted(k for k, v in outputs.items()
                    if k != key and v.shape == value.shape
                    and np.issubdtype(v.dtype, np.floating))
    where = (f"{where} output {key!r} ({value.dtype}): "
             f"{int(count)} of {value.size} values differ from the source")
    if not scores:
        raise ExportError(
            f"verification: {where}, and the signature returns no scores of "
            f"its shape that would explain it as near ties trading places. "
            f"If the output is chosen by scores the signature does not return "
            f"(an argmax, a top-k), verify on inputs without near ties "
            f"(--examples FILE) or check the model yourself and pass "
            f"--no-verify")
    return (f"{where}, at ranks whose scores ({', '.join(scores)}) agree "
            f"with the source's within the tolerance: near ties trading places")

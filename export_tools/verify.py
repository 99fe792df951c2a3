"""Verification: run the source and the compressed model in fresh processes on
the same inputs and compare every output.

Inputs are the user's examples, else the source's own warmup requests (see
examples.py), else generated from the signature specs (integer inputs that
feed a table's lookups get ids in [0, rows) of the smallest such table,
including 0 and rows-1; float inputs get values in [0, 1)).

Float outputs must agree within a tolerance derived from the quantization:
`factor * worst relative table error * max|source output|`, plus a
float-rounding floor. Other outputs (ids, strings, classes) must be equal,
except in one case: a signature that returns ranked ids together with their
scores (a float output of the same shape, as TFRS retrieval and top-k heads
do). Compressing the tables moves scores by up to the tolerance, so
candidates whose scores tie within it can trade places, as they do between
the source and its own dequantized copy. There ids may differ, because the
scores at every rank are checked against the source's; the count of
differing ids is reported as a warning.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf

from export_tools.errors import ExportError
from export_tools.graph_edit import node_name
from export_tools.run_signatures import load_feeds, save_feeds
from export_tools.warmup import WARMUP_FILE

DEFAULT_BATCH = 4
DEFAULT_UNKNOWN_DIM = 3
TOLERANCE_FACTOR = 16.0
ROUNDING_FLOOR = 1e-5


def id_bounds(analysis, tables):
    """{input name: rows} for signature inputs feeding the ids of `tables`
    (placeholder -> rows), found by walking the lookups' id tensors upwards."""
    editor = analysis.editor
    by_placeholder = dict(zip((node_name(t) for t in analysis.input_tensors),
                              analysis.input_names))
    bounds = {}
    for placeholder, rows in tables.items():
        uses = analysis.uses[placeholder]
        id_tensors = [g.ids for g in uses.gathers] + [
            t for p in uses.pooled for t in (p.ids if isinstance(p.ids, tuple) else (p.ids,))]
        seen, stack = set(), [node_name(t) for t in id_tensors]
        while stack:
            name = stack.pop()
            if name in seen or name not in editor.nodes:
                continue
            seen.add(name)
            if name in by_placeholder:
                key = by_placeholder[name]
                bounds[key] = min(bounds.get(key, rows), rows)
            stack.extend(node_name(i) for i in editor.nodes[name].input
                         if not i.startswith("^"))
    return bounds


def generate_inputs(analysis, bounds, seed=0):
    """A feed for one signature, from its input specs and id bounds."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name, spec in zip(analysis.input_names, analysis.input_specs):
        dims = spec.shape.as_list() if spec.shape.rank is not None else [DEFAULT_BATCH]
        shape = [d if d is not None else (DEFAULT_BATCH if i == 0 else DEFAULT_UNKNOWN_DIM)
                 for i, d in enumerate(dims)]
        dtype = spec.dtype
        if dtype.is_integer:
            high = bounds.get(name, 2)
            value = rng.integers(0, high, size=shape)
            flat = value.reshape(-1)
            if flat.size:
                flat[0], flat[-1] = 0, high - 1  # the table's first and last rows
            feed[name] = value.astype(dtype.as_numpy_dtype)
        elif dtype.is_floating:
            feed[name] = rng.uniform(0, 1, size=shape).astype(dtype.as_numpy_dtype)
        elif dtype == tf.bool:
            feed[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise ExportError(
                f"signature {analysis.key!r} input {name!r} is {dtype.name}: "
                f"verification cannot generate it; pass examples (--examples "
                f"FILE.npz) or --no-verify")
    return feed


def run_model(path, feeds, load_ops, workdir):
    """{signature: {output: array}} from running `path` in a fresh process."""
    inputs = os.path.join(workdir, "inputs.tfrecord")
    outputs = os.path.join(workdir, f"outputs_{len(os.listdir(workdir))}.tfrecord")
    save_feeds(inputs, feeds)
    command = [sys.executable, "-m", "export_tools.run_signatures", path, inputs, outputs]
    if load_ops:
        command.append("--load-ops")
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
    return load_feeds(outputs)


def verify(src, dst, feeds, load_ops, relative_error, factor=TOLERANCE_FACTOR):
    """Runs both models on `feeds`; returns ({sig: {out: max abs diff, or
    count of differing values}}, tolerance, [warning]) or raises ExportError
    naming the first output that does not agree."""
    with tempfile.TemporaryDirectory(prefix="tfce-verify-") as workdir:
        want = run_model(src, feeds, False, workdir)
        got = run_model(dst, feeds, load_ops, workdir)
    scale = max((float(np.abs(v).max()) for outs in want.values() for v in outs.values()
                 if v.size and np.issubdtype(v.dtype, np.floating)), default=0.0)
    tolerance = factor * relative_error * scale + ROUNDING_FLOOR * max(scale, 1.0)
    diffs, warnings = {}, []
    for sig, outs in want.items():
        diffs[sig] = {}
        for key, value in outs.items():
            other = got[sig][key]
            if other.shape != value.shape or other.dtype != value.dtype:
                raise ExportError(f"verification: signature {sig!r} output {key!r} is "
                                  f"{other.dtype}{list(other.shape)}, the source gives "
                                  f"{value.dtype}{list(value.shape)}")
            if np.issubdtype(value.dtype, np.floating):
                diff = float(np.abs(other.astype(np.float64) - value).max()) \
                    if value.size else 0.0
                if not diff <= tolerance:
                    raise ExportError(
                        f"verification: signature {sig!r} output {key!r} differs "
                        f"from the source by {diff:.3g}, above the tolerance "
                        f"{tolerance:.3g}")
            else:
                diff = float(np.count_nonzero(other != value))
                if diff:
                    warnings.append(_ranked_ids_differ(sig, key, value, outs, diff))
            diffs[sig][key] = diff
    return diffs, tolerance, warnings


def _ranked_ids_differ(sig, key, value, outputs, count):
    """The warning for a non-float output that differs from the source, if it
    comes with scores of its shape (see the module); else ExportError."""
    scores = sorted(k for k, v in outputs.items()
                    if k != key and v.shape == value.shape
                    and np.issubdtype(v.dtype, np.floating))
    where = (f"signature {sig!r} output {key!r} ({value.dtype}): "
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

"""`--dtype auto`: measuring what each table's format does to the outputs, and
choosing the formats (export_tools/auto_plan.py), in a process of its own.

    python -m export_tools.sensitivity REQUEST.json RESULT.json

The child rebuilds the source's signatures as the export does (inlined,
every variable bound to one the child owns, filled from the checkpoint), so
a table's value can be swapped for another: `decode(encode(table, f))` is
written into its variable chunk by chunk straight from the checkpoint, the
verification requests run, and the original rows are written back the same
way (memory: the model, as verification's own runs hold it, plus a chunk).
It measures every (table, candidate format), chooses (auto_plan.Plan), then
measures the choice with every table replaced at once and upgrades until that
is within the bound. The parent (`measure`) draws its progress from the JSON
lines it prints to stdout, prefixed with `EVENT`.

REQUEST: {"src", "signatures", "feeds" (a run_signatures file), "tables":
[{"uid", "name", "formats"}], "chunk_rows", "max_error"}.
RESULT: {"tables": [{"name", "errors": {format: error or null},
"unusable": {format: why}, "options", "chosen", "smaller_predicted"}],
"predicted", "single_sum", "substituted_error", "upgrades", "outputs"}.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from export_tools import auto_plan
from export_tools.errors import ExportError, tf_error_message
from export_tools.run_signatures import load_feeds, save_feeds

EVENT = "tfce-sensitivity-event "
_SMALL_VARIABLE_BYTES = 64 << 20


def _emit(**event):
    print(EVENT + json.dumps(event), flush=True)


def output_deltas(got, want):
    """|got - want| of every float output element, flat (float64), in the
    order of `want` ({sig: [{out: array}]}, keys sorted). A NaN where the
    source has NaN, or the same infinity, is no change; any other change to
    or from a non-finite value is infinite (as verification counts it)."""
    parts = []
    for sig in sorted(want):
        for i, outs in enumerate(want[sig]):
            for key in sorted(outs):
                w = outs[key]
                if not np.issubdtype(w.dtype, np.floating):
                    continue
                g = got[sig][i][key].astype(np.float64).reshape(-1)
                w = w.astype(np.float64).reshape(-1)
                with np.errstate(invalid="ignore"):
                    diff = np.abs(g - w)
                same = (np.isnan(w) & np.isnan(g)) | (np.isinf(w) & (g == w))
                diff[same] = 0.0
                diff[~np.isfinite(diff)] = np.inf
                parts.append(diff)
    return np.concatenate(parts) if parts else np.zeros(0, np.float64)


class Evaluator:
    """The source's signatures over variables this process owns."""

    def __init__(self, src, keys, chunk_rows):
        import tensorflow as tf

        from export_tools import output_model
        from export_tools.signature_rewrite import analyze, rewrite
        from export_tools.source import SourceModel
        self.tf = tf
        self.source = SourceModel(src)
        self.chunk_rows = chunk_rows
        self.variables, self.locations, self.functions = {}, {}, {}
        for key in keys:
            analysis = analyze(self.source, key, self.source.loaded.signatures[key])
            rewritten = rewrite(analysis, {}, {}, "stock")
            for binding in rewritten.bindings.values():
                if binding[0] == "variable":
                    self._variable(binding[1])
            self.functions[key] = (output_model.signature_function(
                rewritten, self._resolve, analysis.function.structured_outputs),
                rewritten.input_names)

    def _variable(self, location):
        tf = self.tf
        if location.uid not in self.variables:
            reader = self.source.checkpoint
            if location.nbytes <= _SMALL_VARIABLE_BYTES or not location.shape:
                from export_tools.output_model import small_value
                value = small_value(reader, location)
                variable = tf.Variable(value, trainable=False)
            else:
                variable = tf.Variable(tf.zeros(location.shape, location.dtype),
                                       trainable=False)
                rows = location.shape[0]
                for start in range(0, rows, self.chunk_rows):
                    count = min(self.chunk_rows, rows - start)
                    variable[start:start + count].assign(
                        reader.read_rows(location, start, count))
            self.variables[location.uid] = variable
            self.locations[location.uid] = location
        return self.variables[location.uid]

    def _resolve(self, binding):
        if binding[0] == "variable":
            return self.variables[binding[1].uid]
        return binding[1].external

    def run(self, feeds):
        tf = self.tf
        results = {}
        for sig, requests in feeds.items():
            function, names = self.functions[sig]
            results[sig] = []
            for feed in requests:
                out = function(*[tf.constant(feed[n]) for n in names])
                results[sig].append({k: v.numpy() for k, v in out.items()})
        return results

    def substitute(self, uid, fmt, on_rows=None):
        """Writes table `uid` as stored in `fmt` and decoded (FP32: its own
        rows) into its variable, a chunk at a time; raises ValueError if
        `fmt` cannot store it."""
        from tf_compressed_embedding import quantization
        location, variable = self.locations[uid], self.variables[uid]
        rows, dim = location.shape
        for start in range(0, rows, self.chunk_rows):
            count = min(self.chunk_rows, rows - start)
            values = self.source.checkpoint.read_rows(location, start, count)
            values = values.astype(np.float32, copy=False)
            if fmt != auto_plan.FP32:
                data, scales = quantization.encode(values, fmt, row_offset=start)
                values = quantization.decode(data, scales, fmt, dim)
            variable[start:start + count].assign(values)
            if on_rows:
                on_rows(count)


def auto_plan_order(fmt):
    from export_tools.options import AUTO_FORMATS
    return AUTO_FORMATS.index(fmt) if fmt in AUTO_FORMATS else len(AUTO_FORMATS)


def _row_bytes(fmt, dim):
    from tf_compressed_embedding import quantization
    return 4 * dim if fmt == auto_plan.FP32 else quantization.row_bytes(fmt, dim)


def _measure(request):
    feeds = load_feeds(request["feeds"])
    chunk_rows = request["chunk_rows"]
    max_error = request["max_error"]
    _emit(stage="loading the source's tables to measure them")
    evaluator = Evaluator(request["src"], request["signatures"], chunk_rows)
    baseline = evaluator.run(feeds)
    outputs = int(output_deltas(baseline, baseline).size)
    tables, candidates = request["tables"], {}
    for table in tables:
        table["uid"] = (table["uid"][0], tuple(table["uid"][1]), tuple(table["uid"][2]))
        if table["uid"] not in evaluator.variables:
            raise ExportError(f"internal: table {table['name']!r} is read by no "
                              f"signature of the rebuilt source")
    formats = sorted({f for t in tables for f in t["formats"]}, key=auto_plan_order)
    _emit(stage=f"measuring {len(tables)} table(s) one at a time in "
                f"{', '.join(formats)}, on {outputs} float output values")
    for table in tables:
        rows, dim = evaluator.locations[table["uid"]].shape
        table["errors"], table["unusable"] = {}, {}
        found = [auto_plan.Option(auto_plan.FP32, rows * 4 * dim, 0.0,
                                  np.zeros(outputs, np.float64))]
        for fmt in table["formats"]:
            _emit(table=f"{table['name']} as {fmt}", rows=rows)
            try:
                evaluator.substitute(table["uid"], fmt, lambda n: _emit(rows=n))
            except ValueError as e:
                table["errors"][fmt] = None
                table["unusable"][fmt] = str(e)
                _emit(warn=f"table {table['name']!r} cannot be stored as {fmt}: {e}")
                continue
            delta = output_deltas(evaluator.run(feeds), baseline)
            error = float(delta.max(initial=0.0))
            table["errors"][fmt] = error
            found.append(auto_plan.Option(fmt, rows * _row_bytes(fmt, dim), error, delta))
            _emit(note=f"{table['name']} as {fmt}: max |output change| {error:.3g}")
        evaluator.substitute(table["uid"], auto_plan.FP32)
        if found[1:] and all(o.error == 0 for o in found[1:]):
            _emit(warn=f"table {table['name']!r}: no verification request changes "
                       f"any float output through it, so it gets the smallest format; "
                       f"pass --examples that read it to bound its error")
        candidates[table["name"]] = found

    plan = auto_plan.Plan(candidates, max_error).choose()
    _emit(note=f"chosen: {', '.join(f'{n} {f}' for n, f in plan.formats().items())} "
               f"(predicted max error {plan.predicted():.3g} <= {max_error:g})")
    smaller = {name: plan.smaller_predicted(name) for name in plan.options}
    by_name = {t["name"]: t for t in tables}

    def substitute_choice(name):
        table = by_name[name]
        evaluator.substitute(table["uid"], plan.option(name).format)

    _emit(stage="measuring the chosen formats together")
    for name in plan.options:
        substitute_choice(name)
    measured = float(output_deltas(evaluator.run(feeds), baseline).max(initial=0.0))
    upgrades = []
    while measured > max_error:
        moved = plan.upgrade_largest()
        if moved is None:  # everything FP32: the model is the source
            raise ExportError(f"internal: the source differs from itself by "
                              f"{measured:.3g}")
        name, old, new = moved
        upgrades.append({"table": name, "from": old, "to": new, "measured": measured,
                         "where": "rebuilt source"})
        _emit(note=f"together {measured:.3g} > {max_error:.3g}: {name} {old} -> {new}")
        substitute_choice(name)
        measured = float(output_deltas(evaluator.run(feeds), baseline).max(initial=0.0))
    result_tables = []
    for table in tables:
        name = table["name"]
        result_tables.append({
            "name": name, "errors": table["errors"], "unusable": table["unusable"],
            "options": [o.format for o in plan.options[name]],
            "chosen": plan.option(name).format, "smaller_predicted": smaller[name]})
    return {"tables": result_tables, "predicted": plan.predicted(),
            "single_sum": plan.single_sum(), "substituted_error": measured,
            "upgrades": upgrades, "outputs": outputs}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with open(argv[0]) as f:
        request = json.load(f)
    try:
        result = _measure(request)
    except ExportError as e:
        print(f"tfce-sensitivity: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        print(f"tfce-sensitivity: {type(e).__name__}: {tf_error_message(e)}",
              file=sys.stderr)
        return 1
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


def measure(src, signatures, feeds, tables, chunk_rows, max_error, progress, warn):
    """Runs the child (see the module) on `feeds` ({sig: [feed]}) for `tables`
    [{"uid", "name", "formats"}]; relays its progress; returns its RESULT."""
    with tempfile.TemporaryDirectory(prefix="tfce-auto-") as workdir:
        request = {"src": os.path.abspath(src), "signatures": list(signatures),
                   "feeds": os.path.join(workdir, "feeds.tfrecord"),
                   "tables": [dict(t, uid=list(t["uid"])) for t in tables],
                   "chunk_rows": int(chunk_rows), "max_error": float(max_error)}
        save_feeds(request["feeds"], feeds)
        paths = {k: os.path.join(workdir, f"{k}.json") for k in ("request", "result")}
        with open(paths["request"], "w") as f:
            json.dump(request, f)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
            filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        with open(os.path.join(workdir, "stderr"), "w+") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-m", "export_tools.sensitivity", paths["request"],
                 paths["result"]], env=env, stdout=subprocess.PIPE, stderr=stderr,
                text=True)
            try:
                for line in child.stdout:
                    if line.startswith(EVENT):
                        _relay(json.loads(line[len(EVENT):]), progress, warn)
            finally:
                code = child.wait()
            stderr.seek(0)
            lines = stderr.read().strip().splitlines()
        if code != 0:
            mine = [x for x in lines if x.startswith("tfce-sensitivity: ")]
            last = mine[-1][len("tfce-sensitivity: "):] if mine else (
                lines[-1] if lines else f"exit {code}")
            raise ExportError(f"--dtype auto: measuring the tables failed: {last}")
        with open(paths["result"]) as f:
            return json.load(f)


def _relay(event, progress, warn):
    if "stage" in event:
        progress.stage(event["stage"])
    elif "table" in event:
        progress.table(event["table"], event["rows"])
    elif "rows" in event:
        progress.rows_done(event["rows"])
    elif "warn" in event:
        warn(event["warn"])
    elif "note" in event:
        progress.note(event["note"])


if __name__ == "__main__":
    sys.exit(main())

"""`compress_saved_model`: the export pipeline.

1. Open the source graph-only; inline each signature and classify the uses
   of every rank-2 float variable (`signature_rewrite.analyze`).
2. Choose the tables: float32, at least `min_rows` rows, every use a lookup
   we can rewrite (or refuse, naming the node at fault).
3. With `dtype="auto"`, choose each table's format (int4, int8, fp16 or
   left FP32): measure what each format of each table does to the outputs
   on the verification requests, share the bound `max_error` among the
   tables, and check the choice on the rebuilt source (sensitivity.py,
   auto_plan.py).
4. Rewrite each signature's lookups; build a new module that owns the
   compressed tables, the kept variables and the pass-through resources;
   save it beside the destination, stream the tables into its checkpoint.
5. Verify in fresh processes (with `auto`: every float output within
   `max_error` of the source's, else the table with the largest single-table
   error moves up a format and the model is built again), write the warmup
   requests, rename into place.
Nothing is ever written to the source, and a failure leaves no destination.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from export_tools import auto_plan, input_generation, output_model, probe, sensitivity
from export_tools import examples as source_examples
from export_tools import session_tables, verify as verification, warmup
from export_tools.errors import ExportError
from export_tools.options import (AUTO, AUTO_FORMATS, DEFAULT_CHUNK_BYTES,
                                  DEFAULT_MIN_ROWS, OPS_MODES)
from export_tools.report import AutoReport, AutoTable, ExportReport, directory_bytes
from export_tools.signature_rewrite import analyze, rewrite
from export_tools.source import SourceModel
from export_tools.table_stream import encoded_chunks, new_report
from tf_compressed_embedding import quantization

_SMALL_VARIABLE_BYTES = 64 << 20  # kept variables above this are streamed too


class Progress:
    """Callbacks for long work; the CLI draws them with rich. All optional."""

    def stage(self, text):
        """A new step of the pipeline begins."""

    def table(self, name, rows):
        """Encoding of table `name` (`rows` rows) begins."""

    def rows_done(self, count):
        """`count` more rows of the current table are encoded."""

    def warn(self, text):
        """Something the user should know; the export goes on."""

    def note(self, text):
        """A line of information (what `--dtype auto` measured and chose)."""


@dataclasses.dataclass
class _Table:
    uid: tuple
    location: object
    placeholders: dict = dataclasses.field(default_factory=dict)  # signature -> [ph]


def _check_arguments(src, dst, fmt, ops, min_rows, chunk_rows, overwrite, verify,
                     max_error):
    if fmt == AUTO:
        if max_error is None:
            raise ExportError("dtype='auto' needs max_error (--max-error E): the "
                              "largest absolute change allowed in any float output")
        if not max_error > 0:
            raise ExportError(f"max_error must be > 0, got {max_error!r}")
        if not verify:
            raise ExportError("dtype='auto' measures the tables on the verification "
                              "requests and proves the bound by verifying: it cannot "
                              "run with verify=False (--no-verify)")
    else:
        try:
            quantization.check_format(fmt)
        except ValueError:
            raise ExportError(f"dtype must be one of "
                              f"{', '.join(quantization.FORMATS + (AUTO,))}, "
                              f"got {fmt!r}") from None
        if max_error is not None:
            raise ExportError(f"max_error is used by dtype='auto' only (dtype is "
                              f"{fmt!r}): pass --dtype auto --max-error E")
    if ops not in OPS_MODES:
        raise ExportError(f"ops must be one of {', '.join(OPS_MODES)}, got {ops!r}")
    if min_rows < 0:
        raise ExportError(f"min_rows must be >= 0, got {min_rows}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ExportError(f"chunk_rows must be >= 1, got {chunk_rows}")
    src_real, dst_real = os.path.realpath(src), os.path.realpath(dst)
    if dst_real == src_real or dst_real.startswith(src_real + os.sep) \
            or src_real.startswith(dst_real + os.sep):
        raise ExportError(f"the destination {dst} must be outside the source {src}")
    if os.path.lexists(dst) and not overwrite:
        raise ExportError(f"the destination {dst} exists; pass overwrite=True "
                          f"(--overwrite) to replace it")


def _matches(pattern, location):
    return pattern is not None and (re.search(pattern, location.name)
                                    or re.search(pattern, location.key))


def _describe(uses):
    for name, op, reason in uses.unsupported:
        if reason != "not a lookup":
            return f"{op} {name!r} with {reason}: only row lookups (axis 0, batch_dims 0) " \
                   f"can be rewritten"
    return None


def choose_tables(analyses, tables, keep, min_rows, formats, progress, warn):
    """({uid: _Table} of the tables to convert, [names kept FP32 by `keep`],
    {name: op} of the variables of at least `min_rows` rows that no lookup
    reads, e.g. a retrieval model's candidate matrix or a dense kernel, left
    FP32 and named in the report so that a user sees why); refuses tables it
    cannot convert. Tables none of `formats` would shrink (int8 of dim 1:
    a 4-byte scale and a byte per row) are left FP32 with a warning, unless
    `tables` names them."""
    chosen, kept, unshrunk, not_lookups = {}, [], set(), {}
    for analysis in analyses:
        for placeholder, uses in analysis.uses.items():
            loc = analysis.locations[placeholder]
            uid = loc.uid
            lookups = len(uses.gathers) + len(uses.pooled)
            bad_lookup = _describe(uses)
            looks_like_table = lookups or bad_lookup or uses.control_flow
            named = _matches(tables, loc)
            if not looks_like_table and uses.unsupported and loc.full_shape[0] >= min_rows:
                not_lookups.setdefault(loc.name, uses.unsupported[0][1])
            if not looks_like_table or (tables is not None and not named):
                continue
            if _matches(keep, loc):
                if loc.name not in kept:
                    kept.append(loc.name)
                    progress.warn(f"table {loc.name!r} left FP32 (--keep)")
                continue
            if loc.full_shape[0] < min_rows:
                continue
            dim = loc.full_shape[1]
            smallest = min(formats, key=lambda f: quantization.row_bytes(f, dim))
            if quantization.row_bytes(smallest, dim) >= 4 * dim and tables is None:
                if loc.name not in unshrunk:
                    unshrunk.add(loc.name)
                    warn(f"table {loc.name!r} left FP32: {smallest} would store "
                         f"{quantization.row_bytes(smallest, dim)} bytes per row of "
                         f"dim {dim}, FP32 stores {4 * dim}; --tables naming it "
                         f"converts it anyway")
                continue
            where = f"table {loc.name!r} (signature {analysis.key!r})"
            hint = f"; pass --keep '{re.escape(loc.name)}' to leave it FP32"
            if loc.dtype.name != "float32":
                raise ExportError(f"{where} is {loc.dtype.name}; only float32 tables "
                                  f"can be compressed{hint}")
            if uses.control_flow:
                node, op = uses.control_flow[0]
                raise ExportError(f"{where} is used inside the body of {op} {node!r}: "
                                  f"lookups in control flow cannot be rewritten{hint}")
            if bad_lookup:
                raise ExportError(f"{where} is read by {bad_lookup}{hint}")
            if uses.unsupported:
                node, op, _ = uses.unsupported[0]
                raise ExportError(f"{where} is also read by {op} {node!r}, which is not "
                                  f"a lookup (tied weights?), so it cannot be "
                                  f"compressed{hint}")
            table = chosen.setdefault(uid, _Table(uid, loc))
            table.placeholders.setdefault(analysis.key, []).append(placeholder)
    return chosen, kept, not_lookups


def compress_saved_model(src: str, dst: str, dtype: str = "int8", ops: str = "fused",
                         tables: str | None = None, keep: str | None = None,
                         min_rows: int = DEFAULT_MIN_ROWS,
                         signatures: list[str] | None = None,
                         chunk_rows: int | None = None, overwrite: bool = False,
                         verify: bool = True, examples: dict | None = None,
                         report: str | None = None, progress: Progress | None = None,
                         isolate: bool = True,
                         max_error: float | None = None,
                         batch: bool = True) -> ExportReport:
    """Writes a copy of SavedModel `src` to `dst` with its FP32 embedding tables
    stored compressed, with the same signatures.

    Args:
      dtype: the storage format of every table, one of
        `quantization.FORMATS`: "int8" (rows of int8 values with their
        float32 scale inline), "int4" (two values a byte, a float16 scale
        and bias per row), "fp16", "int8_split" (int8 with a separate scales
        array, version 0.1.0's int8); or "auto": per table the smallest of
        int4, int8, fp16 or FP32 that keeps every float output within
        `max_error` of the source's on the verification requests (see the
        module and auto_plan.py).
      ops: "fused" emits CompressedEmbeddingLookup / FusedDecodeAxpy (servers
        built with this package's ops); "stock" emits only stock TF ops.
      tables: regex of table names (or checkpoint keys) to convert; default:
        every float32 rank-2 variable read only by lookups.
      keep: regex of tables to leave FP32 (e.g. tied weights).
      min_rows: tables with fewer rows are left FP32.
      signatures: keys of the signatures to keep (default: all).
      chunk_rows: rows encoded per chunk (default: about 64 MiB of FP32).
      overwrite: replace an existing `dst`.
      verify: run both models in fresh processes and compare every output
        (required by "auto").
      examples: {signature: feed or [feed, ...]}, a feed being {input: array},
        to verify on (default: the source's warmup requests, else generated).
      report: path of a JSON report to write.
      progress: a `Progress` receiving callbacks.
      isolate: first read `src` with TensorFlow in a child process, so that
        a model that crashes TF's loader is an ExportError, not a crash
        (costs a few seconds; turn off only for trusted models).
      max_error: with dtype "auto" (only): the largest absolute difference
        allowed between any float output element of the export and of the
        source, on the verification requests.
      batch: with ops "fused": one BatchedFusedDecodeAxpy node per signature
        for all its pooled lookups that do not depend on one another, so a
        request pays TensorFlow's per-node cost once, not once per table
        (the same outputs); False keeps one FusedDecodeAxpy node per lookup.
    Returns:
      An `ExportReport` (`.auto` holds what "auto" measured and chose).
    Raises:
      ExportError: anything refused or failed; `dst` is then left untouched.
    """
    progress = progress or Progress()
    fmt = dtype  # the storage format (the public argument keeps TF's word)
    _check_arguments(src, dst, fmt, ops, min_rows, chunk_rows, overwrite, verify,
                     max_error)
    auto = fmt == AUTO
    if ops == "fused":
        import tf_compressed_embedding as tfce
        try:
            tfce.load_ops()
        except tfce.OpLibraryError as e:
            raise ExportError(f"--ops fused needs the op library: {e}") from None
    result = ExportReport(os.path.abspath(src), os.path.abspath(dst), fmt, ops)
    progress.stage(f"reading {src}")
    if isolate:
        probe.check_loadable(src)
    source = SourceModel(src)
    keys = source.signature_keys()
    if signatures is not None:
        unknown = sorted(set(signatures) - set(keys))
        if unknown:
            raise ExportError(f"no signature {unknown[0]!r} in {src} (it has "
                              f"{', '.join(keys)})")
        keys = [k for k in keys if k in signatures]
    if not keys:
        raise ExportError(f"{src} has no signatures to export")
    progress.stage("analyzing signatures")
    analyses = [analyze(source, key, source.loaded.signatures[key]) for key in keys]
    def warn(text):
        progress.warn(text)
        result.warnings.append(text)

    candidate_formats = AUTO_FORMATS if auto else (fmt,)
    chosen, result.kept_fp32, result.not_lookups = choose_tables(
        analyses, tables, keep, min_rows, candidate_formats, progress, warn)
    if not chosen:
        raise ExportError(
            f"found no table to compress in {src}: no float32 rank-2 variable of at "
            f"least {min_rows} rows is read only by lookups"
            + (f" and matches {tables!r}" if tables else "")
            + "".join(f"; {w}" for w in result.warnings))

    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    _remove_stale_workdirs(dst, progress)
    workdir = tempfile.mkdtemp(prefix=_workdir_prefix(dst, os.getpid()), dir=parent)
    try:
        out = os.path.join(workdir, "model")
        # Inputs are derived from the source graphs, before the rewrite edits them.
        feeds = _feeds(src, analyses, chosen, examples) if verify else None
        plan = None
        if auto:
            plan = _choose_formats(src, keys, feeds, chosen, chunk_rows, max_error,
                                   progress, warn, result)
            formats = {uid: plan.option(_auto_name(chosen, uid)).format for uid in chosen}
        else:
            formats = {uid: fmt for uid in chosen}
        while True:
            converted = {uid: t for uid, t in chosen.items()
                         if formats[uid] != auto_plan.FP32}
            _write(source, analyses, converted, formats, ops, chunk_rows, out, progress,
                   result, batch)
            if not verify:
                break
            progress.stage("verifying in fresh processes")
            worst = max((t.relative_error for t in result.tables), default=0.0)
            try:
                result.verification, result.tolerance, notes, largest = \
                    verification.verify(src, out, feeds, ops == "fused", worst,
                                        tolerance=max_error if auto else None)
            except verification.ToleranceExceeded as e:
                if not auto:
                    raise
                moved = plan.upgrade_largest()
                if moved is None:
                    raise
                _record_upgrade(result, moved, e.difference, "export", progress)
                formats = {uid: plan.option(_auto_name(chosen, uid)).format
                           for uid in chosen}
                # The rewrite edited the analyses: the next build starts afresh.
                shutil.rmtree(out)
                result.tables = []
                analyses = [analyze(source, key, source.loaded.signatures[key])
                            for key in keys]
                chosen = _same_tables(chosen, analyses, tables, keep, min_rows,
                                      candidate_formats)
                continue
            for note in notes:
                warn(note)
            result.verified = True
            break
        if auto:
            _finish_auto_report(result, plan, chosen, largest)
        if verify:
            if os.path.exists(os.path.join(src, warmup.WARMUP_FILE)):
                # The source's own requests, carried over with assets.extra/:
                # real traffic, kept as it is.
                result.warmup_requests = warmup.count(out)
            else:
                result.warmup_requests = warmup.write(out, feeds,
                                                      source.signature_defs)
        result.checkpoint_bytes_before = directory_bytes(os.path.join(src, "variables"))
        result.checkpoint_bytes_after = directory_bytes(os.path.join(out, "variables"))
        _move_into_place(out, dst)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if report:
        result.write_json(report)
    return result


def _auto_names(chosen):
    """{uid: a unique name}: the table's name, with its checkpoint key when two
    tables share one."""
    names = {}
    for uid, table in sorted(chosen.items(), key=lambda x: x[1].location.name):
        name = table.location.name
        if name in names.values():
            name = f"{name} ({table.location.key}, rows from "\
                   f"{table.location.offset[0]})"
        names[uid] = name
    return names


def _auto_name(chosen, uid):
    return _auto_names(chosen)[uid]


def _choose_formats(src, keys, feeds, chosen, chunk_rows, max_error, progress, warn,
                    result):
    """Measures and chooses (sensitivity.py in a child process); returns the
    auto_plan.Plan at the choice; starts `result.auto`."""
    names = _auto_names(chosen)
    requests = []
    for uid, table in sorted(chosen.items(), key=lambda x: names[x[0]]):
        dim = table.location.shape[1]
        shrinking = [f for f in AUTO_FORMATS if quantization.row_bytes(f, dim) < 4 * dim]
        requests.append({"uid": [uid[0], list(uid[1]), list(uid[2])], "name": names[uid],
                         "formats": shrinking})
    rows_per_chunk = chunk_rows or max(1, DEFAULT_CHUNK_BYTES // max(
        1, 4 * max(t.location.shape[1] for t in chosen.values())))
    measured = sensitivity.measure(src, keys, feeds, requests, rows_per_chunk, max_error,
                                   progress, warn)
    by_name = {t["name"]: t for t in measured["tables"]}
    candidates, auto_tables = {}, []
    for uid, table in sorted(chosen.items(), key=lambda x: names[x[0]]):
        got, (rows, dim) = by_name[names[uid]], table.location.shape
        errors = dict(got["errors"], **{auto_plan.FP32: 0.0})
        candidates[names[uid]] = [
            auto_plan.Option(f, rows * _auto_row_bytes(f, dim), errors[f], np.zeros(0))
            for f in got["options"]]
        auto_tables.append(AutoTable(
            names[uid], table.location.key, rows, dim, got["chosen"], 0, 0.0,
            got["errors"], got["unusable"], got["smaller_predicted"]))
    plan = auto_plan.Plan(candidates, max_error).set_formats(
        {name: got["chosen"] for name, got in by_name.items()})
    if all(f == auto_plan.FP32 for f in plan.formats().values()):
        least = min(((e, n, f) for n, t in by_name.items()
                     for f, e in t["errors"].items() if e is not None), default=None)
        raise ExportError(
            f"--dtype auto: no table can be compressed within max error {max_error:g}"
            + (f": the smallest change one table makes alone is {least[0]:.3g} ("
               f"{least[1]} as {least[2]}): pass --max-error {least[0]:.3g} or more"
               if least else ""))
    result.auto = AutoReport(max_error, auto_tables, measured["predicted"],
                             measured["single_sum"], measured["substituted_error"],
                             output_values=measured["outputs"])
    for upgrade in measured["upgrades"]:
        result.auto.upgrades.append(upgrade)
    return plan


def _auto_row_bytes(fmt, dim):
    return 4 * dim if fmt == auto_plan.FP32 else quantization.row_bytes(fmt, dim)


def _record_upgrade(result, moved, difference, where, progress):
    name, old, new = moved
    result.auto.upgrades.append({"table": name, "from": old, "to": new,
                                 "measured": difference, "where": where})
    progress.note(f"the export differs by {difference:.3g} > {result.auto.max_error:.3g}: "
                  f"{name} {old} -> {new}, building it again")


def _same_tables(chosen, analyses, tables, keep, min_rows, formats):
    """`chosen` found again in fresh `analyses` (the same tables)."""
    again, _, _ = choose_tables(analyses, tables, keep, min_rows, formats, Progress(),
                                lambda text: None)
    if sorted(again) != sorted(chosen):
        raise ExportError("internal: analyzing the source again found other tables")
    return again


def _finish_auto_report(result, plan, chosen, measured):
    """The choice as built (after any upgrade of the proof), with its bytes and
    the error verification `measured`."""
    auto, names = result.auto, _auto_names(chosen)
    for uid in chosen:
        entry = next(t for t in auto.tables if t.name == names[uid])
        option = plan.option(entry.name)
        entry.format, entry.bytes, entry.error = option.format, option.bytes, option.error
        int8 = _auto_row_bytes("int8", entry.dim)
        auto.bytes_int8 += entry.rows * min(int8, 4 * entry.dim)
        auto.bytes_fp32 += entry.rows * 4 * entry.dim
    auto.bytes = sum(t.bytes for t in auto.tables)
    auto.single_sum = plan.single_sum()
    auto.measured_error = measured


def _write(source, analyses, chosen, formats, ops, chunk_rows, out, progress, result,
           batch):
    progress.stage("rewriting signatures")
    module = output_model.ExportedModel()
    compressed, kept, streams, full_shapes = {}, {}, [], {}
    for i, table in enumerate(sorted(chosen.values(), key=lambda t: t.location.name)):
        rows, dim = table.location.shape
        compressed[table.uid] = output_model.CompressedVariables(i, rows, dim,
                                                                 formats[table.uid])
        module.compressed_tables.append(compressed[table.uid])

    def resolve(binding):
        kind, target = binding[0], binding[1]
        if kind == "table":
            return getattr(compressed[target], binding[2])
        if kind == "variable":
            uid = target.uid
            if uid not in kept:
                kept[uid] = _kept_variable(source, target, len(kept), streams, full_shapes)
                module.kept_variables.append(kept[uid])
            return kept[uid]
        capture = target
        if capture.owner is not None and all(capture.owner is not r for r in module.resources):
            module.resources.append(capture.owner)
        return capture.external

    signature_functions, counts = {}, {}
    for analysis in analyses:
        mine = {p: uid for uid, t in chosen.items() for p in t.placeholders.get(analysis.key, ())}
        rewritten = rewrite(analysis, mine, formats, ops, batch)
        result.batched_lookups[analysis.key] = [n for _, n in rewritten.batched]
        for uid, (lookups, pooled) in rewritten.lookup_counts.items():
            total = counts.setdefault(uid, [0, 0])
            total[0] += lookups
            total[1] += pooled
        signature_functions[analysis.key] = output_model.signature_function(
            rewritten, resolve, analysis.function.structured_outputs)
    progress.stage("saving the rewritten model")
    output_model.save(module, signature_functions, out)

    for index, variables in enumerate(module.compressed_tables):
        uid = next(u for u, t in compressed.items() if t is variables)
        table_report = new_report(chosen[uid].location, formats[uid])
        table_report.signatures = sorted(chosen[uid].placeholders)
        table_report.lookups, table_report.pooled_lookups = counts.get(uid, (0, 0))
        result.tables.append(table_report)
        streams.append(_table_stream(source, chosen[uid].location, variables, index,
                                     formats[uid], chunk_rows, table_report, full_shapes,
                                     progress))
    progress.stage("writing the compressed checkpoint")
    output_model.rebuild_checkpoint(out, streams)
    output_model.patch_meta_graph(
        out, {name: shape for name, (_, shape) in full_shapes.items()},
        {k: d.method_name for k, d in source.signature_defs.items()}, source.tags,
        edits=[session_tables.name_tables])
    output_model.copy_extra_assets(source.path, out)


def _variable_name(variable):
    return variable.name.split(":")[0]


def _table_stream(source, loc, variables, index, fmt, chunk_rows, table_report,
                  full_shapes, progress):
    """Registers one table's variables in `full_shapes`; returns the stream of
    its encoded chunks (data and scales from one pass over the source)."""
    rows, dim = loc.shape
    tensors = [(output_model.variable_key(f"compressed_tables/{index}/data"),
                quantization.data_shape(fmt, rows, dim), quantization.storage_dtype(fmt))]
    full_shapes[_variable_name(variables.data)] = tensors[0][:2]
    if variables.scales is not None:
        tensors.append((output_model.variable_key(f"compressed_tables/{index}/scales"),
                        quantization.scales_shape(fmt, rows), np.float32))
        full_shapes[_variable_name(variables.scales)] = tensors[1][:2]
    rows_per_chunk = chunk_rows or max(1, DEFAULT_CHUNK_BYTES // max(1, 4 * dim))

    def chunks():
        progress.table(loc.name, rows)
        for _, data, scales in encoded_chunks(source.checkpoint, loc, fmt,
                                              rows_per_chunk, table_report,
                                              progress.rows_done):
            yield (data, scales) if len(tensors) == 2 else (data,)
    return output_model.Stream(tensors, chunks())


def _kept_variable(source, location, index, streams, full_shapes):
    """A variable kept as it was; large ones are streamed like the tables."""
    name = f"kept_{index}"
    if location.nbytes <= _SMALL_VARIABLE_BYTES or not location.shape:
        return tf.Variable(output_model.small_value(source.checkpoint, location),
                           trainable=False, name=name)
    variable = output_model.empty_variable(location.shape, location.dtype, name)
    key = output_model.variable_key(f"kept_variables/{index}")
    full_shapes[_variable_name(variable)] = (key, location.shape)
    rows = location.shape[0]
    step = max(1, _SMALL_VARIABLE_BYTES // max(1, location.nbytes // rows))
    streams.append(output_model.Stream(
        [(key, location.shape, location.dtype.as_numpy_dtype)],
        ((source.checkpoint.read_rows(location, s, min(step, rows - s)),)
         for s in range(0, rows, step))))
    return variable


def _feeds(src, analyses, chosen, examples):
    """{signature: [feed, ...]}: the inputs to verify each signature on: the
    user's examples, else the source's own warmup requests, else generated
    ones."""
    keys = [a.key for a in analyses]
    if examples:
        origin = "examples"
        examples = source_examples.as_requests(examples)
        unknown = sorted(set(examples) - set(keys))
        if unknown:
            raise ExportError(f"examples: signatures {unknown} are not exported "
                              f"(exported: {keys})")
    else:
        origin = f"{warmup.WARMUP_FILE} of SRC"
        examples = {k: v for k, v in source_examples.source_requests(src).items()
                    if k in keys}
    feeds = {}
    for analysis in analyses:
        if analysis.key in examples:
            feeds[analysis.key] = [source_examples.conform(
                feed, analysis.key, analysis.input_names, analysis.input_specs,
                origin if len(examples[analysis.key]) == 1 else f"{origin} request {i}")
                for i, feed in enumerate(examples[analysis.key])]
            continue
        rows = {p: t.location.full_shape[0] for t in chosen.values()
                for p in t.placeholders.get(analysis.key, ())}
        feeds[analysis.key] = [input_generation.generate_inputs(
            analysis, input_generation.id_bounds(analysis, rows),
            input_generation.table_keys(analysis),
            input_generation.composite_inputs(analysis))]
    return feeds


def _workdir_stem(dst):
    return f".{os.path.basename(os.path.abspath(dst))}.tfce-"


def _workdir_prefix(dst, pid):
    # The owner's pid is in the name, so a later run can tell a killed
    # export's leftovers from a running export's work.
    return f"{_workdir_stem(dst)}{pid}-"


def _remove_stale_workdirs(dst, progress):
    """Removes what exports to `dst` killed before their cleanup (SIGKILL,
    power loss) left beside it; directories of live exports are kept."""
    parent = os.path.dirname(os.path.abspath(dst))
    stem = _workdir_stem(dst)
    for name in os.listdir(parent):
        pid = name[len(stem):].split("-", 1)[0]
        if not (name.startswith(stem) and pid.isdigit()) or _alive(int(pid)):
            continue
        progress.warn(f"removing {os.path.join(parent, name)}, left by an "
                      f"export (pid {pid}) that was killed")
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _move_into_place(out, dst):
    if os.path.lexists(dst):
        old = dst.rstrip(os.sep) + ".tfce-replaced"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
        os.rename(out, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(out, dst)

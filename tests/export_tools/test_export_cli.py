"""tfce-export's interface: CLI, options, refusals of broken inputs, and the
promise that a failed export leaves no output and never touches the source."""
import functools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import export_models
from export_tools import ExportError, compress, compress_saved_model, probe, verify
from export_tools.options import DTYPES
from test_export import tree_digest
from tf_compressed_embedding import quantization

CLI = [sys.executable, "-m", "export_tools"]


@pytest.fixture(scope="module")
def lookups_model(tmp_path_factory):
    return export_models.build_module_lookups(str(tmp_path_factory.mktemp("m") / "src"))


def run_cli(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True)


def tool_lines(stderr):
    """The tool's own messages (TF prints its start-up log lines too)."""
    return [line for line in stderr.splitlines() if line.startswith("tfce-export:")]


def test_help():
    done = run_cli("--help")
    assert done.returncode == 0
    for option in ("--dtype", "--ops", "--tables", "--keep", "--min-rows", "--signatures",
                   "--chunk-rows", "--overwrite", "--no-verify", "--report", "--examples",
                   "--max-error"):
        assert option in done.stdout
    text = " ".join(done.stdout.split())
    assert "{" + ",".join(DTYPES) + "}" in text
    for fmt in quantization.FORMATS + ("auto",):
        assert f"'{fmt}':" in text, fmt
    assert "absolute difference allowed between any float output element" in text


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int2"], "invalid choice: 'int2'"),
    (["--dtype", "auto"], "--dtype auto needs --max-error E"),
    (["--dtype", "auto", "--max-error", "0"], "--max-error must be > 0, got 0"),
    (["--dtype", "auto", "--max-error", "-0.5"], "--max-error must be > 0, got -0.5"),
    (["--dtype", "int8", "--max-error", "0.1"],
     "--max-error is for --dtype auto only (got --dtype int8)"),
    (["--dtype", "auto", "--max-error", "0.1", "--no-verify"], "cannot run with --no-verify"),
])
def test_bad_usage_exits_2(tmp_path, args, message):
    done = run_cli(tmp_path / "a", tmp_path / "b", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert os.listdir(tmp_path) == []


def test_cli_exports_verifies_and_reports(lookups_model, tmp_path):
    dst, report_path = tmp_path / "dst", tmp_path / "report.json"
    done = run_cli(lookups_model.path, dst, "--dtype", "int8", "--min-rows", "1",
                   "--report", report_path)
    assert done.returncode == 0, done.stderr
    assert "verification against SRC" in done.stderr and "item" in done.stderr
    report = json.load(open(report_path))
    assert report["verified"] and report["dtype"] == "int8" and report["ops"] == "fused"
    assert sorted(t["name"] for t in report["tables"]) == sorted(lookups_model.tables)
    assert report["warmup_requests"] == len(lookups_model.examples)
    shapes = lookups_model.tables.values()
    assert report["table_bytes_before"] == sum(rows * dim * 4 for rows, dim in shapes)
    assert report["table_bytes_after"] == sum(
        rows * quantization.row_bytes("int8", dim) for rows, dim in shapes)
    for outputs in report["verification"].values():
        assert all(diff <= report["tolerance"] for diff in outputs.values())
    assert os.path.exists(dst / "assets.extra" / "tf_serving_warmup_requests")


def test_cli_refusal_is_one_line_and_leaves_nothing(tmp_path):
    built = export_models.build_refuse_tied(str(tmp_path / "src"))
    done = run_cli(built.path, tmp_path / "dst", "--dtype", "int8", "--min-rows", "1")
    assert done.returncode == 1
    lines = tool_lines(done.stderr)
    assert len(lines) == 1 and "MatMul" in lines[0] and "--keep" in lines[0]
    assert "Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_existing_destination_needs_overwrite(lookups_model, tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old_file").write_text("x")
    with pytest.raises(ExportError, match="exists; pass overwrite=True"):
        compress_saved_model(lookups_model.path, str(dst), min_rows=1, verify=False, isolate=False)
    assert os.listdir(dst) == ["old_file"]
    compress_saved_model(lookups_model.path, str(dst), min_rows=1, verify=False,
                         overwrite=True, isolate=False)
    assert "saved_model.pb" in os.listdir(dst) and "old_file" not in os.listdir(dst)
    assert sorted(os.listdir(tmp_path)) == ["dst"]


def test_destination_inside_source_refused(lookups_model):
    with pytest.raises(ExportError, match="must be outside the source"):
        compress_saved_model(lookups_model.path, os.path.join(lookups_model.path, "x"))


@pytest.mark.parametrize("damage, message", [
    ("no_pb", "saved_model.pb is missing"),
    ("corrupt_pb", "saved_model.pb is corrupt"),
    ("no_index", "variables.index is missing"),
    ("no_shard", "is missing"),
    ("truncated_pb", "saved_model.pb is corrupt"),
    ("truncated_shard", "is truncated"),
    ("shape_mismatch", r"'ctx' is declared float32\[28, 4\] in the graph but "
                       r"stored as float32\[29, 4\]"),
    ("dtype_mismatch", r"'ctx' is declared float32\[28, 4\] in the graph but "
                       r"stored as float64\[28, 4\]"),
    ("not_a_dir", "no such directory"),
])
def test_broken_sources_refused(lookups_model, tmp_path, damage, message):
    src = tmp_path / "src"
    shutil.copytree(lookups_model.path, src)
    variables = src / "variables"
    if damage == "no_pb":
        os.remove(src / "saved_model.pb")
    elif damage == "corrupt_pb":
        (src / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff garbage")
    elif damage == "no_index":
        os.remove(variables / "variables.index")
    elif damage == "no_shard":
        for name in os.listdir(variables):
            if ".data-" in name:
                os.remove(variables / name)
    elif damage == "truncated_pb":
        data = (src / "saved_model.pb").read_bytes()
        (src / "saved_model.pb").write_bytes(data[:len(data) // 2])
    elif damage == "truncated_shard":
        for name in os.listdir(variables):
            if ".data-" in name:
                data = (variables / name).read_bytes()
                (variables / name).write_bytes(data[:len(data) // 2])
    elif damage.endswith("_mismatch"):
        _rewrite_checkpoint_tensor(str(variables / "variables"), "tables/ctx/",
                                   damage == "shape_mismatch")
    else:
        src = tmp_path / "nowhere"
    with pytest.raises(ExportError, match=message):
        compress_saved_model(str(src), str(tmp_path / "dst"), min_rows=1)
    assert not os.path.exists(tmp_path / "dst")


def test_tensorflow_dying_on_the_source_is_a_clear_error(lookups_model, tmp_path,
                                                         monkeypatch):
    # What a CHECK failure in TF's loader looks like from outside: the child
    # reading the model dies with SIGABRT.
    monkeypatch.setattr(probe, "PROBE_COMMAND",
                        [sys.executable, "-c", "import os; os.abort()"])
    digest = tree_digest(lookups_model.path)
    with pytest.raises(ExportError, match=r"TensorFlow aborted while reading .* "
                                          r"\(SIGABRT\): the SavedModel is corrupt"):
        compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1)
    assert os.listdir(tmp_path) == []
    assert tree_digest(lookups_model.path) == digest


def test_probe_reads_a_good_model_and_leaves_refusals_to_the_export(lookups_model,
                                                                    tmp_path):
    probe.check_loadable(lookups_model.path)  # no error
    probe.check_loadable(str(tmp_path / "nowhere"))  # refused by the parent instead


def _rewrite_checkpoint_tensor(prefix, key_prefix, add_row):
    """Rewrites checkpoint `prefix` with the tensor under `key_prefix` given
    one more row (add_row) or stored as float64: a checkpoint that no longer
    matches the variable its graph declares."""
    reader = tf.train.load_checkpoint(prefix)
    keys = sorted(reader.get_variable_to_shape_map())
    tensors = []
    for key in keys:
        value = reader.get_tensor(key)
        if key.startswith(key_prefix):
            value = (np.concatenate([value, value[:1]]) if add_row
                     else value.astype(np.float64))
        tensors.append(tf.constant(value))
    for name in os.listdir(os.path.dirname(prefix)):
        os.remove(os.path.join(os.path.dirname(prefix), name))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=keys,
                      shape_and_slices=[""] * len(keys), tensors=tensors)


def _fail(*args, **kwargs):
    raise RuntimeError("disk full (injected)")


@pytest.mark.parametrize("step", ["rebuild_checkpoint", "patch_meta_graph", "verify"])
def test_failure_at_any_step_leaves_no_output(lookups_model, tmp_path, monkeypatch, step):
    digest = tree_digest(lookups_model.path)
    if step == "verify":  # a verification that cannot pass: zero tolerance
        monkeypatch.setattr(verify, "ROUNDING_FLOOR", 0.0)
        monkeypatch.setattr(compress.verification, "verify",
                            functools.partial(verify.verify, factor=0.0))
        expected = ExportError
    else:
        monkeypatch.setattr(compress.output_model, step, _fail)
        expected = RuntimeError
    with pytest.raises(expected):
        compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1, isolate=False)
    assert os.listdir(tmp_path) == [], "a partial output or temporary directory was left"
    assert tree_digest(lookups_model.path) == digest


def test_default_min_rows_skips_small_tables(lookups_model, tmp_path):
    with pytest.raises(ExportError, match="no float32 rank-2 variable of at least 1000 rows"):
        compress_saved_model(lookups_model.path, str(tmp_path / "dst"), verify=False, isolate=False)


def test_tables_and_signatures_select(lookups_model, tmp_path):
    report = compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1,
                                  tables="^(item|tag)$", signatures=["pooled"],
                                  examples={"pooled": lookups_model.examples["pooled"]},
                                  isolate=False)
    assert sorted(t.name for t in report.tables) == ["item", "tag"]
    assert sorted(report.verification) == ["pooled"]
    loaded = tf.saved_model.load(str(tmp_path / "dst"))
    assert sorted(loaded.signatures) == ["pooled"]


def test_unknown_signature_refused(lookups_model, tmp_path):
    with pytest.raises(ExportError, match="no signature 'nope'"):
        compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1,
                             signatures=["nope"], isolate=False)


def test_keep_leaves_a_tied_table_fp32(tmp_path):
    rng = np.random.default_rng(0)
    module = tf.Module()
    module.tied = tf.Variable(rng.standard_normal((40, 6)).astype(np.float32))
    module.plain = tf.Variable(rng.standard_normal((30, 6)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(ids):
        h = tf.gather(module.tied, ids) + tf.gather(module.plain, ids % 30)
        return {"logits": tf.matmul(h, module.tied, transpose_b=True)}
    tf.saved_model.save(module, str(tmp_path / "src"), signatures=serve)
    report = compress_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"),
                                  min_rows=1, keep="^tied$", isolate=False)
    assert [t.name for t in report.tables] == ["plain"] and report.verified
    assert report.kept_fp32 == ["tied"]
    reader = tf.train.load_checkpoint(str(tmp_path / "dst" / "variables" / "variables"))
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    assert sorted((tuple(shapes[k]), dtypes[k].name) for k in shapes if len(shapes[k]) == 2) \
        == [(quantization.data_shape("int8", 30, 6), "uint8"), ((40, 6), "float32")]


def test_progress_reports_every_row(lookups_model, tmp_path):
    class Recorder(compress.Progress):
        def __init__(self):
            self.stages, self.tables, self.rows = [], {}, 0

        def stage(self, text):
            self.stages.append(text)

        def table(self, name, rows):
            self.tables[name] = rows

        def rows_done(self, count):
            self.rows += count

    recorder = Recorder()
    compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1,
                         chunk_rows=7, verify=False, progress=recorder, isolate=False)
    assert recorder.tables == {k: v[0] for k, v in lookups_model.tables.items()}
    assert recorder.rows == sum(recorder.tables.values())
    assert "writing the compressed checkpoint" in recorder.stages


def test_examples_file_is_used(lookups_model, tmp_path):
    feed = lookups_model.examples["serving_default"]
    np.savez(tmp_path / "ex.npz", **{f"serving_default/{k}": v for k, v in feed.items()})
    done = run_cli(lookups_model.path, tmp_path / "dst", "--dtype", "fp16", "--min-rows",
                   "1", "--signatures", "serving_default", "--examples",
                   tmp_path / "ex.npz", "--quiet")
    assert done.returncode == 0, done.stderr
    assert not tool_lines(done.stderr)


def test_large_kept_variables_are_streamed_too(lookups_model, tmp_path, monkeypatch):
    """Variables kept FP32 above the streaming threshold (64 MiB; zero here)
    are copied chunk by chunk like the tables, and keep their full shapes."""
    monkeypatch.setattr(compress, "_SMALL_VARIABLE_BYTES", 0)
    report = compress_saved_model(lookups_model.path, str(tmp_path / "dst"), min_rows=1,
                                  tables="^item$", chunk_rows=5, isolate=False)
    assert report.verified and [t.name for t in report.tables] == ["item"]
    reader = tf.train.load_checkpoint(str(tmp_path / "dst" / "variables" / "variables"))
    shapes = {tuple(s) for s in reader.get_variable_to_shape_map().values()}
    for name, shape in lookups_model.tables.items():
        if name == "item":
            assert quantization.data_shape("int8", *shape) in shapes
        else:
            assert shape in shapes, name  # the FP32 tables kept, whole

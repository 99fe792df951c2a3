"""The C++ serving harness (serving/): TF's SavedModel loader + Session::Run.

A small pooled-embedding model is exported INT8 with fused and with stock
ops; the harness must load all three models, produce the same outputs as
`tf.saved_model.load(...).signatures[...]` on the same PredictionLog
requests, replay the export's warmup requests, fail at warmup (not later)
when the fused ops are missing, and report sane measurements.
"""
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import named_tensor_pb2
from tensorflow_serving.apis import prediction_log_pb2

from export_tools import compress_saved_model
from tf_compressed_embedding import _loader
from repo_paths import ROOT

WARMUP = os.path.join("assets.extra", "tf_serving_warmup_requests")
ROWS, DIM = 40, 8


@pytest.fixture(scope="session")
def harness():
    spec = importlib.util.spec_from_file_location(
        "serving_build", os.path.join(ROOT, "serving", "build.py"))
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.build()


def _padded(rng, batch, length, empty_row=None):
    """[batch, length] int64 ids in [0, ROWS), each row padded with -1."""
    ids = rng.integers(0, ROWS, size=(batch, length))
    lengths = rng.integers(1, length + 1, size=batch)
    lengths[0] = length  # the last column is used, so the dense shape is full
    if empty_row is not None:
        lengths[empty_row] = 0
    ids[np.arange(length)[None, :] >= lengths[:, None]] = -1
    return ids.astype(np.int64)


class PooledModel(tf.Module):
    def __init__(self, rng):
        super().__init__()
        self.emb = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(np.float32),
                               name="emb")

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64, name="ids")])
    def pooled(self, ids):
        where = tf.where(ids >= 0)
        sp_ids = tf.SparseTensor(where, tf.gather_nd(ids, where),
                                 tf.shape(ids, out_type=tf.int64))
        return {"mean": tf.nn.embedding_lookup_sparse(self.emb, sp_ids, None,
                                                      combiner="mean"),
                "sum": tf.nn.embedding_lookup_sparse(self.emb, sp_ids, None,
                                                     combiner="sum"),
                "count": tf.reduce_sum(tf.cast(ids >= 0, tf.int32), axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="row_ids")])
    def rows(self, row_ids):
        return {"rows": tf.nn.embedding_lookup(self.emb, row_ids)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"fp32", "stock", "fused"}: model directories; plus "requests"."""
    base = tmp_path_factory.mktemp("serving")
    rng = np.random.default_rng(7)
    module = PooledModel(rng)
    paths = {"fp32": str(base / "fp32")}
    tf.saved_model.save(module, paths["fp32"],
                        signatures={"serving_default": module.pooled, "rows": module.rows})
    examples = {"serving_default": {"ids": _padded(rng, 5, 4, empty_row=2)},
                "rows": {"row_ids": np.array([0, ROWS - 1, 3], np.int64)}}
    for ops in ("stock", "fused"):
        paths[ops] = str(base / ops)
        compress_saved_model(paths["fp32"], paths[ops], dtype="int8", ops=ops,
                             min_rows=1, examples=examples)
    # More requests than the export's warmup file: several batch sizes, both
    # signatures, written with TF Serving's own protos.
    requests = [("serving_default", {"ids": _padded(rng, b, length)})
                for b, length in ((1, 1), (3, 5), (8, 2), (16, 7))]
    requests.insert(2, ("rows", {"row_ids": rng.integers(0, ROWS, 6)}))
    paths["requests"] = str(base / "requests.tfrecord")
    with tf.io.TFRecordWriter(paths["requests"]) as writer:
        for signature, inputs in requests:
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.signature_name = signature
            for key, value in inputs.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            writer.write(log.SerializeToString())
    return paths


def read_requests(path):
    """[(signature, {input: array})] from a TFRecord of PredictionLogs."""
    result = []
    for record in tf.data.TFRecordDataset(path):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        result.append((request.model_spec.signature_name or "serving_default",
                       {k: tf.make_ndarray(v) for k, v in request.inputs.items()}))
    return result


def read_dump(path):
    """{(record index, signature, output key): array} from --dump-outputs."""
    result = {}
    for record in tf.data.TFRecordDataset(path):
        named = named_tensor_pb2.NamedTensorProto.FromString(record.numpy())
        index, signature, key = named.name.split("/", 2)
        result[int(index), signature, key] = tf.make_ndarray(named.tensor)
    return result


def run_harness(harness, model, *args, ops=False, check=True):
    cmd = [harness, "--model", model, *args]
    if ops:
        cmd += ["--ops", _loader.library_path()]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("kind", ["fp32", "stock", "fused"])
def test_outputs_match_python(harness, models, kind, tmp_path):
    dump = str(tmp_path / "outputs.tfrecord")
    run_harness(harness, models[kind], "--requests", models["requests"],
                "--dump-outputs", dump, "--iterations", "0", ops=kind == "fused")
    got = read_dump(dump)

    if kind == "fused":
        import tf_compressed_embedding  # noqa: F401 - registers the ops for Python
    loaded = tf.saved_model.load(models[kind])
    expected = {}
    for index, (signature, inputs) in enumerate(read_requests(models["requests"])):
        outputs = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        expected.update({(index, signature, k): v.numpy() for k, v in outputs.items()})
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype, key
        # Bit-equal here; the tolerance only allows the two graph optimizers
        # (Session vs tf.function) a different float summation order.
        np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7, err_msg=str(key))


@pytest.mark.parametrize("kind", ["stock", "fused"])
def test_replays_export_warmup(harness, models, kind):
    records = read_requests(os.path.join(models[kind], WARMUP))
    assert {sig for sig, _ in records} == {"serving_default", "rows"}
    report = json.loads(run_harness(harness, models[kind], "--warmup", "--iterations", "5",
                                    ops=kind == "fused").stdout)
    assert report["warmup_records"] == report["records"] == len(records)


def test_fused_without_ops_fails_at_warmup(harness, models):
    proc = run_harness(harness, models["fused"], "--warmup", check=False)
    assert proc.returncode != 0
    assert "Op type not registered" in proc.stderr
    assert proc.stdout == ""
    # Without warmup the load itself succeeds: the failure would come at the
    # first request, which is why the export writes warmup requests.
    proc = run_harness(harness, models["fused"], "--iterations", "0")
    assert json.loads(proc.stdout)["load_seconds"] > 0


def test_report(harness, models):
    report = json.loads(run_harness(
        harness, models["fused"], "--requests", models["requests"], "--iterations", "40",
        "--threads", "1,2", "--intra-op-threads", "1", "--inter-op-threads", "1",
        ops=True).stdout)
    assert report["model"] == models["fused"] and report["signature"] == "serving_default"
    assert report["records"] == 5 and report["warmup_records"] == 0
    assert report["load_seconds"] > 0
    assert 0 < report["rss_after_load_mib"] <= report["peak_rss_mib"]
    assert [run["threads"] for run in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert run["requests"] == 40
        assert 0 < run["p50_ms"] <= run["p99_ms"]
        # CPU per request: positive, and at most all cores busy all the time
        assert 0 < run["cpu_ms_per_request"] <= (
            os.cpu_count() * run["seconds"] * 1e3 / run["requests"] * 1.05)
        assert run["throughput_rps"] > 0

    rows = json.loads(run_harness(harness, models["fused"], "--requests", models["requests"],
                                  "--signature", "rows", "--iterations", "3",
                                  ops=True).stdout)
    assert rows["signature"] == "rows" and rows["runs"][0]["requests"] == 3


@pytest.mark.parametrize("args, message", [
    (["--signature", "nope"], "no request for signature 'nope'"),
    (["--requests", "/nonexistent/requests"], "cannot open requests file"),
    (["--model", "/nonexistent/model"], "cannot load SavedModel"),
])
def test_errors(harness, models, args, message):
    proc = run_harness(harness, models["stock"], *args, check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""

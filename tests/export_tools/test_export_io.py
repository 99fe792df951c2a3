"""The export tool's file formats, against TF's and TF Serving's own readers:
checkpoint row reads, streamed slice writes, warmup requests."""
import os

import numpy as np
import pytest
import tensorflow as tf

from export_tools import ExportError, checkpoint_io, warmup


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(0)
    module = tf.Module()
    module.table = tf.Variable(rng.standard_normal((1000, 12)).astype(np.float32))
    module.half = tf.Variable(rng.standard_normal((300, 7)).astype(np.float16))
    module.ints = tf.Variable(np.arange(5, dtype=np.int64))
    tf.saved_model.save(module, str(tmp_path / "model"))
    return str(tmp_path / "model" / "variables" / "variables")


@pytest.mark.parametrize("chunk", [1, 97, 1000, 4096])
def test_read_rows_matches_tf_reader(checkpoint, chunk):
    reader = checkpoint_io.CheckpointReader(checkpoint)
    for key, shape in reader.shapes.items():
        if len(shape) != 2:
            continue
        loc = reader.location(key)
        got = np.concatenate([reader.read_rows(loc, r, min(chunk, shape[0] - r))
                              for r in range(0, shape[0], chunk)])
        np.testing.assert_array_equal(got, tf.train.load_checkpoint(checkpoint).get_tensor(key))


def test_read_rows_of_a_partition(tmp_path):
    """A TF1 partition is a row block of a tensor stored in slices."""
    full = np.arange(40, dtype=np.float32).reshape(10, 4)
    prefix = str(tmp_path / "ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["emb", "emb"],
                      shape_and_slices=["10 4 0,6:-", "10 4 6,4:-"],
                      tensors=[full[:6], full[6:]])
    reader = checkpoint_io.CheckpointReader(prefix)
    part = checkpoint_io.VariableLocation("emb/part_1", "emb", (10, 4), (6, 0), (4, 4),
                                          tf.float32)
    np.testing.assert_array_equal(reader.read_rows(part, 1, 2), full[7:9])


def test_streaming_writer_round_trip(tmp_path):
    """Tensors appended chunk by chunk, two shards at once, read back by TF."""
    rng = np.random.default_rng(1)
    tensors = {"a/data": rng.integers(-127, 128, (1001, 5)).astype(np.int8),
               "a/scales": rng.random(1001).astype(np.float32),
               "b/data": rng.standard_normal((77, 3)).astype(np.float16),
               "c/rows": rng.standard_normal((10, 2, 3)).astype(np.float64)}
    prefix = str(tmp_path / "out")
    writer = checkpoint_io.StreamingBundleWriter(prefix, num_shards=2)
    writer.begin(0, "a/data", np.int8, (1001, 5))
    writer.begin(1, "a/scales", np.float32, (1001,))
    for start in range(0, 1001, 300):
        writer.append(0, tensors["a/data"][start:start + 300])
        writer.append(1, tensors["a/scales"][start:start + 300])
    writer.end(0)
    writer.end(1)
    for key in ("b/data", "c/rows"):
        writer.begin(0, key, tensors[key].dtype, tensors[key].shape)
        for start in range(0, len(tensors[key]), 4):
            writer.append(0, tensors[key][start:start + 4])
        writer.end(0)
    writer.finish()
    reader = tf.train.load_checkpoint(prefix)
    assert sorted(reader.get_variable_to_shape_map()) == sorted(tensors)
    for key, value in tensors.items():
        got = reader.get_tensor(key)
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)
    restored = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=["b/data"],
                                    shape_and_slices=[""], dtypes=[tf.float16])[0]
    np.testing.assert_array_equal(restored.numpy(), tensors["b/data"])


@pytest.mark.parametrize("mistake, message", [
    ("too_many", "more bytes than the tensor's shape holds"),
    ("too_few", "fewer bytes than the tensor's shape holds"),
    ("duplicate", "duplicate key"),
    ("unfinished", "left unfinished"),
])
def test_streaming_writer_rejects_misuse(tmp_path, mistake, message):
    writer = checkpoint_io.StreamingBundleWriter(str(tmp_path / "out"), num_shards=1)
    with pytest.raises(ExportError, match=message):
        writer.begin(0, "t", np.int8, (4, 2))
        writer.append(0, np.zeros((2 if mistake == "too_few" else 4, 2), np.int8))
        if mistake == "too_many":
            writer.append(0, np.zeros((1, 2), np.int8))
        if mistake == "duplicate":
            writer.end(0)
            writer.begin(0, "t", np.int8, (4, 2))
        if mistake == "unfinished":
            writer.finish()
        writer.end(0)
    writer.abort()  # frees the native writer whatever state the mistake left


def test_corrupt_index_is_refused(checkpoint):
    with open(checkpoint + ".index", "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\0" * 8)
    with pytest.raises(ExportError, match="variables.index is corrupt"):
        checkpoint_io.CheckpointReader(checkpoint)


def test_truncated_shard_is_refused(checkpoint):
    shard = checkpoint + ".data-00000-of-00001"
    with open(shard, "r+b") as f:
        f.truncate(100)
    # Refused when opened, naming a tensor past the end and the file size.
    with pytest.raises(ExportError, match=r"is truncated: '.*' needs bytes "
                                          r"\[\d+, \d+\) of a 100-byte file"):
        checkpoint_io.CheckpointReader(checkpoint)


def test_warmup_records_parse_as_tf_serving_prediction_logs(tmp_path):
    prediction_log_pb2 = pytest.importorskip(
        "tensorflow_serving.apis.prediction_log_pb2",
        reason="tools/setup.sh installs tensorflow-serving-api for this test")
    feeds = {"serving_default": {"ids": np.array([[0, 5], [9, 1]], np.int64),
                                 "w": np.ones((2, 2), np.float32)},
             "other": {"x": np.array([1.5], np.float32)}}
    count = warmup.write(str(tmp_path), {k: [v] for k, v in feeds.items()},
                         {"serving_default": None, "other": None})
    assert count == 2
    records = list(tf.data.TFRecordDataset(str(tmp_path / warmup.WARMUP_FILE)))
    parsed = {}
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        parsed[request.model_spec.signature_name] = {
            k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    assert sorted(parsed) == sorted(feeds)
    for sig, feed in feeds.items():
        for name, value in feed.items():
            np.testing.assert_array_equal(parsed[sig][name], value)
            assert parsed[sig][name].dtype == value.dtype

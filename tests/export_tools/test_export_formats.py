"""The export in each storage format: the rows a lookup of the export gives
are `quantization.decode(quantization.encode(table))`'s, bit for bit, with
stock ops (the rowwise records decoded by bitcasts, shifts and masks) and
with the fused ops; shape queries of a table answer its decoded shape
whatever the stored layout; empty and rank-2 ids keep their shapes."""
import numpy as np
import pytest
import tensorflow as tf

import tf_compressed_embedding  # noqa: F401 - registers the fused ops
from export_tools import compress_saved_model
from tf_compressed_embedding import quantization

# An odd and an even dim: int4's last byte holds one value or two.
SHAPES = {"odd": (37, 7), "even": (41, 8)}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = np.random.default_rng(3)
    module = tf.Module()
    tables = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32)
              for name, shape in SHAPES.items()}
    var = {name: tf.Variable(t, name=name) for name, t in tables.items()}
    module.tables = var

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64, name="ids"),
                                  tf.TensorSpec([None], tf.int32, name="flat_ids")])
    def serve(ids, flat_ids):
        return {"odd": tf.nn.embedding_lookup(var["odd"], ids),
                "even": tf.gather(var["even"], flat_ids),
                "odd_shape": tf.shape(var["odd"]),
                "even_shape": tf.shape(tf.identity(var["even"]), out_type=tf.int64),
                "even_size": tf.size(var["even"].read_value()),
                "odd_rank": tf.rank(var["odd"].read_value())}

    module.serve = serve
    path = str(tmp_path_factory.mktemp("formats") / "src")
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return path, tables


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory):
    cache = {}

    def get(fmt, ops):
        if (fmt, ops) not in cache:
            dst = str(tmp_path_factory.mktemp(f"{fmt}_{ops}") / "dst")
            report = compress_saved_model(source[0], dst, dtype=fmt, ops=ops, min_rows=1,
                                          chunk_rows=5, verify=False, isolate=False)
            cache[fmt, ops] = dst, report
        return cache[fmt, ops]
    return get


def _serve(path, ids, flat_ids):
    out = tf.saved_model.load(path).signatures["serving_default"](
        ids=tf.constant(ids, tf.int64), flat_ids=tf.constant(flat_ids, tf.int32))
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.parametrize("ops", ["stock", "fused"])
@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_rows_are_the_reference_decoder_bit_for_bit(source, exported, fmt, ops):
    _, tables = source
    dst, report = exported(fmt, ops)
    assert sorted(t.name for t in report.tables) == sorted(SHAPES)
    decoded = {name: quantization.decode(*quantization.encode(t, fmt), fmt, t.shape[1])
               for name, t in tables.items()}
    ids = np.stack([np.arange(SHAPES["odd"][0]), np.arange(SHAPES["odd"][0])[::-1]], 1)
    flat = np.arange(SHAPES["even"][0], dtype=np.int32)[::-1]
    got = _serve(dst, ids, flat)
    np.testing.assert_array_equal(got["odd"], decoded["odd"][ids], strict=True)
    np.testing.assert_array_equal(got["even"], decoded["even"][flat], strict=True)
    # and the decode is not the FP32 table itself
    assert not np.array_equal(got["odd"], tables["odd"][ids])


@pytest.mark.parametrize("ops", ["stock", "fused"])
@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_shape_queries_and_empty_ids(source, exported, fmt, ops):
    """Shape / VariableShape / Size / Rank of a table give the FP32 table's
    answers although rowwise records are [V, R]; no ids give [0, ...]."""
    src, _ = source
    dst, _ = exported(fmt, ops)
    ids, flat = np.zeros((0, 2), np.int64), np.zeros((0,), np.int32)
    want, got = _serve(src, ids, flat), _serve(dst, ids, flat)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key, strict=True)
    assert got["odd"].shape == (0, 2, SHAPES["odd"][1])
    assert list(got["odd_shape"]) == list(SHAPES["odd"])
    assert got["even_size"] == SHAPES["even"][0] * SHAPES["even"][1]


@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_stored_bytes_are_the_formats(exported, fmt):
    _, report = exported(fmt, "fused")
    for t in report.tables:
        assert t.format == fmt
        assert t.bytes_before == t.rows * t.dim * 4
        assert t.bytes_after == t.rows * quantization.row_bytes(fmt, t.dim)
        assert t.relative_error <= quantization.max_decode_error(fmt, 1.0)

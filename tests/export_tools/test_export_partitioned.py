"""TF1 partitioned tables: the export merges a lookup of every partition into
one lookup of the whole table (export_tools/partitioned_lookups.py).

The export matrix (test_export.py) checks outputs on typical ids. Here every
id of the table goes through each partition strategy, ids the source refuses
are refused by the export too (never moved into a neighbouring partition),
and a lookup that is not a plain gather per partition (max_norm) keeps its
partitions.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import export_models
import tf_compressed_embedding  # noqa: F401 - registers the fused ops
from export_tools import compress_saved_model
from tf_compressed_embedding import quantization

v1 = tf.compat.v1
ROWS, DIM = 50, 8   # 4 partitions of 13, 13, 12, 12 rows
KINDS = ["tf1_ref_partitioned_div", "tf1_ref_partitioned_mod",
         "tf1_resource_partitioned_div"]


def _serve(path, **feeds):
    return tf.saved_model.load(path).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in feeds.items()})


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    cache, sources = {}, {}

    def get(kind, ops, fmt="int8"):
        if kind not in sources:
            root = tmp_path_factory.mktemp(kind)
            sources[kind] = export_models.BUILDERS[kind](str(root / "src"), rows=ROWS,
                                                         dim=DIM)
        if (kind, ops, fmt) not in cache:
            built = sources[kind]
            dst = os.path.join(os.path.dirname(built.path), f"{fmt}_{ops}")
            report = compress_saved_model(built.path, dst, dtype=fmt, ops=ops, min_rows=1,
                                          verify=False, isolate=False)
            cache[kind, ops, fmt] = built, report, dst
        return cache[kind, ops, fmt]
    return get


def _stored_rows(kind):
    """Row of the stored (checkpoint) variable that logical id i reads: 'div'
    keeps ids in order; 'mod' puts id i at row i // 4 of partition i % 4."""
    ids = np.arange(ROWS)
    if kind.endswith("_div"):
        return ids
    sizes = [len(range(p, ROWS, 4)) for p in range(4)]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return offsets[ids % 4] + ids // 4


def _single_id_bags(ids):
    """Feeds pooling each id alone (weight 1, mean): the pooled row is the row."""
    ids = np.asarray(ids, np.int64)
    return {"user_id": np.zeros(len(ids), np.int64),
            "bag_ids": ids.reshape(-1, 1),
            "bag_weights": np.ones((len(ids), 1), np.float32)}


@pytest.mark.parametrize("ops", ["fused", "stock"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_table_of_the_whole_variable(exports, kind, ops):
    _, report, _ = exports(kind, ops)
    emb = [t for t in report.tables if t.name == "model/emb"]
    assert len(emb) == 1 and (emb[0].rows, emb[0].dim) == (ROWS, DIM)
    assert not [t for t in report.tables if "/part_" in t.name]


@pytest.mark.parametrize("fmt", quantization.FORMATS)
@pytest.mark.parametrize("ops", ["fused", "stock"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_id_reads_its_own_row(exports, kind, ops, fmt):
    """Id i of the export is decode(encode(the stored row of id i)), for
    every i, whichever partition and strategy holds it, in every format."""
    built, _, path = exports(kind, ops, fmt)
    full = tf.train.load_checkpoint(
        os.path.join(built.path, "variables", "variables")).get_tensor("model/emb")
    full = full[_stored_rows(kind)]
    want = quantization.decode(*quantization.encode(full, fmt), fmt, DIM)
    got = _serve(path, **_single_id_bags(range(ROWS)))["pooled"].numpy()
    source = _serve(built.path, **_single_id_bags(range(ROWS)))["pooled"].numpy()
    np.testing.assert_allclose(source, full, rtol=0, atol=1e-7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad_id", [ROWS, ROWS + 1, ROWS + 2, ROWS + 3, 10 ** 9])
@pytest.mark.parametrize("ops", ["fused", "stock"])
@pytest.mark.parametrize("kind", KINDS)
def test_ids_beyond_the_table_fail_as_in_the_source(exports, kind, ops, bad_id):
    """Ids the source refuses (a row past its partition's end) are refused,
    not read from the next partition's rows."""
    built, _, path = exports(kind, ops)
    feeds = _single_id_bags([3, bad_id, 7])
    with pytest.raises(tf.errors.InvalidArgumentError):
        _serve(built.path, **feeds)
    with pytest.raises(tf.errors.InvalidArgumentError):
        _serve(path, **feeds)


def _build_stitched(export_dir, transform_first):
    """A 'mod' lookup of a 4-way partitioned table written with raw ops;
    with `transform_first` the rows of partition 0 are doubled before the
    stitch, so that lookup is no plain gather of the whole table."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    with tf.Graph().as_default() as graph:
        ids = v1.placeholder(tf.int64, [None], name="ids")
        with v1.variable_scope("model"):
            emb = v1.get_variable("emb", [ROWS, DIM], tf.float32,
                                  export_models._np_initializer(table),  # noqa: SLF001
                                  partitioner=v1.fixed_size_partitioner(4))
        parts = list(emb)
        assignment = tf.cast(ids % 4, tf.int32)
        local = tf.dynamic_partition(ids // 4, assignment, 4)
        positions = tf.dynamic_partition(tf.range(tf.size(ids)), assignment, 4)
        rows = [tf.gather(p, i) for p, i in zip(parts, local)]
        if transform_first:
            rows[0] = rows[0] * 2.0
        out = tf.dynamic_stitch(positions, rows)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            export_models._save_tf1(sess, export_dir, {"ids": ids},  # noqa: SLF001
                                    {"rows": out})


@pytest.mark.parametrize("transform_first", [False, True])
def test_only_plain_gathers_of_every_partition_merge(tmp_path, transform_first):
    src, dst = str(tmp_path / "src"), str(tmp_path / "int8")
    _build_stitched(src, transform_first)
    report = compress_saved_model(src, dst, dtype="int8", min_rows=1, verify=False,
                                  isolate=False)
    names = sorted(t.name for t in report.tables)
    assert names == ([f"model/emb/part_{i}" for i in range(4)] if transform_first
                     else ["model/emb"])
    ids = np.arange(ROWS, dtype=np.int64)
    want = _serve(src, ids=ids)["rows"].numpy()
    np.testing.assert_allclose(_serve(dst, ids=ids)["rows"].numpy(), want, rtol=0,
                               atol=2 * np.abs(want).max() / 127)

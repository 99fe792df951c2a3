"""The export report: per-table lookup counts match the nodes in the output
graph, and tables a format would not shrink (int8 or int4 of dim 1: a 4-byte
header and a byte per row; the "wide" / linear tables of wide-and-deep
models) are left FP32 with a warning."""
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from export_tools import ExportError, compress_saved_model
from tf_compressed_embedding import quantization

ROWS, DIM = 60, 8


@pytest.fixture(scope="module")
def wide_and_deep(tmp_path_factory):
    """`wide` [ROWS, 1] gathered per id and summed; `deep` [ROWS, DIM]
    pooled by embedding_lookup_sparse and also gathered once."""
    rng = np.random.default_rng(0)
    module = tf.Module()
    module.wide = tf.Variable(rng.standard_normal((ROWS, 1)).astype(np.float32),
                              name="wide")
    module.deep = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(np.float32),
                              name="deep")

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])
    def serve(ids):
        linear = tf.reduce_sum(tf.nn.embedding_lookup(module.wide, ids), axis=[1, 2])
        pooled = tf.nn.embedding_lookup_sparse(
            module.deep, tf.RaggedTensor.from_tensor(ids).to_sparse(), None,
            combiner="mean")
        first = tf.nn.embedding_lookup(module.deep, ids[:, 0])
        return {"logit": linear, "deep": pooled + first}

    module.serve = serve
    path = str(tmp_path_factory.mktemp("m") / "src")
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return path


def output_ops(path):
    """{op type: count} over the output SavedModel's graph and functions."""
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    graph = saved.meta_graphs[0].graph_def
    counts = {}
    for node in list(graph.node) + [n for f in graph.library.function
                                    for n in f.node_def]:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def by_name(report):
    return {t.name: t for t in report.tables}


SHRINKS_DIM_1 = [f for f in quantization.FORMATS if quantization.row_bytes(f, 1) < 4]
KEEPS_DIM_1 = [f for f in quantization.FORMATS if f not in SHRINKS_DIM_1]


def test_which_formats_shrink_dim_1():
    assert SHRINKS_DIM_1 == ["fp16"]


@pytest.mark.parametrize("fmt", KEEPS_DIM_1)
def test_a_dim_1_table_is_left_fp32_with_a_warning(wide_and_deep, tmp_path, fmt):
    report = compress_saved_model(wide_and_deep, str(tmp_path / "dst"),
                                  dtype=fmt, min_rows=1, isolate=False)
    assert report.verified
    assert list(by_name(report)) == ["deep"]
    assert any(f"table 'wide' left FP32: {fmt} would store "
               f"{quantization.row_bytes(fmt, 1)} bytes per row of dim 1, FP32 stores 4"
               in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("fmt", SHRINKS_DIM_1)
def test_a_format_that_shrinks_a_dim_1_table_converts_it(wide_and_deep, tmp_path, fmt):
    report = compress_saved_model(wide_and_deep, str(tmp_path / "dst"),
                                  dtype=fmt, min_rows=1, isolate=False)
    tables = by_name(report)
    assert sorted(tables) == ["deep", "wide"]
    assert tables["wide"].bytes_after == ROWS * quantization.row_bytes(fmt, 1) \
        < tables["wide"].bytes_before
    assert not report.warnings


@pytest.mark.parametrize("fmt", KEEPS_DIM_1)
def test_naming_a_dim_1_table_converts_it_anyway(wide_and_deep, tmp_path, fmt):
    report = compress_saved_model(wide_and_deep, str(tmp_path / "dst"),
                                  dtype=fmt, min_rows=1, tables="^wide$",
                                  isolate=False)
    wide = by_name(report)["wide"]
    assert wide.bytes_after == ROWS * quantization.row_bytes(fmt, 1) > wide.bytes_before
    assert report.verified


def test_auto_stores_a_dim_1_table_as_fp16(wide_and_deep, tmp_path):
    """int4 and int8 would not shrink it: fp16 is its only format."""
    report = compress_saved_model(wide_and_deep, str(tmp_path / "dst"), dtype="auto",
                                  max_error=1.0, min_rows=1, isolate=False)
    wide = next(t for t in report.auto.tables if t.name == "wide")
    assert sorted(wide.errors) == ["fp16"] and wide.format == "fp16"
    assert by_name(report)["deep"].format in ("int4", "int8")


def test_only_dim_1_tables_is_an_error_that_says_why(tmp_path):
    module = tf.Module()
    module.wide = tf.Variable(np.ones((ROWS, 1), np.float32), name="wide")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(ids):
        return {"out": tf.nn.embedding_lookup(module.wide, ids)}

    module.serve = serve
    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"serving_default": serve})
    with pytest.raises(ExportError, match="found no table to compress.*"
                                          "table 'wide' left FP32"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", min_rows=1,
                             isolate=False)


@pytest.mark.parametrize("fmt", quantization.FORMATS)
@pytest.mark.parametrize("ops", ["fused", "stock"])
def test_lookup_counts_match_the_output_graph(wide_and_deep, tmp_path, ops, fmt):
    dst = str(tmp_path / "dst")
    # What the report counts and the graph holds are settled before
    # verification, which other tests cover.
    report = compress_saved_model(wide_and_deep, dst, dtype=fmt, ops=ops, min_rows=1,
                                  tables="^(wide|deep)$", verify=False,
                                  isolate=False)
    tables = by_name(report)
    graph_ops = output_ops(dst)
    if ops == "fused":
        assert (tables["deep"].pooled_lookups, tables["deep"].lookups) == (1, 1)
        assert (tables["wide"].pooled_lookups, tables["wide"].lookups) == (0, 1)
        assert graph_ops.get("FusedDecodeAxpy", 0) == 1
        assert graph_ops.get("CompressedEmbeddingLookup", 0) == 2
    else:
        assert all(t.pooled_lookups == 0 for t in tables.values())
        assert tables["wide"].lookups == 1 and tables["deep"].lookups >= 1
        assert "FusedDecodeAxpy" not in graph_ops


def test_large_variables_no_lookup_reads_are_named(tmp_path):
    """A candidate matrix scored by a MatMul is no table: left FP32 and
    named with the op reading it; a smaller one (under min_rows) is not."""
    rng = np.random.default_rng(1)
    module = tf.Module()
    module.table = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(np.float32),
                               name="table")
    module.candidates = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(np.float32),
                                    name="candidates")
    module.small = tf.Variable(rng.standard_normal((ROWS // 2, DIM)).astype(np.float32),
                               name="small")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(ids):
        query = tf.nn.embedding_lookup(module.table, ids)
        return {"scores": tf.matmul(query, module.candidates, transpose_b=True),
                "small": tf.matmul(query, module.small, transpose_b=True)}

    module.serve = serve
    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"serving_default": serve})
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=ROWS, verify=False, isolate=False)
    assert [t.name for t in report.tables] == ["table"]
    assert report.not_lookups == {"candidates": "MatMul"}

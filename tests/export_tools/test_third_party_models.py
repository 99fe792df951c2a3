"""Models built by the recommender libraries people train with (TFRS,
DeepCTR, keras-rs, tf-keras feature columns, plain Keras 3), exported with
default options int8 with fused ops, fp16 and int4 with stock ops, and
verified by the tool against the source in fresh processes (each model in
one of fp16 and int4 stock, STOCK_FORMATS). EXPECTED is the README's
compatibility table: which tables convert, and how many lookups end up
fused-pooled (FusedDecodeAxpy) or row lookups.

Each model is built by tests/support/third_party_models.py in a process of
its own (Keras 2 libraries need TF_USE_LEGACY_KERAS before TF is imported).
The libraries are test-only (tools/setup.sh installs them with --no-deps).
"""
import json
import os
import subprocess
import sys

import pytest

from export_tools import ExportError, compress_saved_model
from repo_paths import SUPPORT
from tf_compressed_embedding import quantization


# kind -> {table: (row lookups, pooled lookups)} of the int8 fused export
# with default options (tables of 1000+ rows); dim-1 tables (DeepCTR's
# linear part) stay FP32 in int8, with a warning.
E = "/embeddings"
EXPECTED = {
    "tfrs_dcn_ranking": {"dcn_ranking/user_embedding" + E: (1, 0),
                         "dcn_ranking/movie_embedding" + E: (1, 0)},
    "tfrs_two_tower_retrieval": {"user_embedding" + E: (1, 0)},
    "deepctr_deepfm": {"sparse_emb_user_id" + E: (1, 0), "sparse_emb_item_id" + E: (1, 0),
                       "sparse_emb_category" + E: (1, 0),
                       "sparse_seq_emb_genres" + E: (0, 1)},
    "deepctr_dcn": {"sparse_emb_user_id" + E: (1, 0), "sparse_emb_item_id" + E: (1, 0),
                    "sparse_emb_category" + E: (1, 0),
                    "sparse_seq_emb_genres" + E: (0, 1)},
    "deepctr_din": {"sparse_seq_emb_hist_item_id" + E: (3, 0),
                    "sparse_seq_emb_hist_cate_id" + E: (3, 0),
                    "sparse_emb_user" + E: (1, 0)},  # gender: 2 rows, under --min-rows
    # one lookup per signature ('serve' and 'serving_default')
    "keras_rs_dlrm": {"user_id_embedding" + E: (2, 0), "item_id_embedding" + E: (2, 0),
                      "ad_id_embedding" + E: (2, 0)},
    "tf2_dense_features": {"clicked_query_shared_embedding": (0, 2),
                           "features/country_embedding/embedding_weights": (0, 1)},
}
# Large float variables no lookup reads, named in the report (left FP32):
# the retrieval index scores every candidate with a MatMul.
NOT_LOOKUPS = {"tfrs_two_tower_retrieval": {"candidates": "MatMul"}}
# Refused by default, what the refusal says to do, and the tables (as in
# EXPECTED) once that is done: the masked mean pooling of the StringLookup
# bag, once per signature ('serve' and 'serving_default').
REFUSED = {"keras3_string_lookup": ("is also read by Transpose", "item_table",
                                    {"history_embedding" + E: (0, 2)})}


def build(kind, path):
    done = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "third_party_models.py"), kind, path],
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.fail(f"{kind}: a test-only library is missing (tools/setup.sh "
                    f"installs them): {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["tables"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(kind):
        if kind not in cache:
            path = str(tmp_path_factory.mktemp(kind) / "src")
            cache[kind] = (path, build(kind, path))
        return cache[kind]
    return get


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_int8_fused_export_verifies(built, kind, tmp_path):
    src, tables = built(kind)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8")
    assert report.verified
    got = {t.name: (t.lookups, t.pooled_lookups) for t in report.tables}
    assert got == EXPECTED[kind]
    if kind in NOT_LOOKUPS:
        assert report.not_lookups == NOT_LOOKUPS[kind]
    # every table the library built is converted, or dim 1 and named in a warning
    for name, (rows, dim) in tables.items():
        if dim == 1:
            assert any(f"table {name!r} left FP32" in w for w in report.warnings)
        elif rows >= 1000:
            assert name in got, (name, sorted(got))


# Each model in one of the two formats (every format's stock decode is
# checked on every source kind of test_export.py); DeepCTR's DeepFM and DCN
# in fp16, which converts their dim-1 linear tables (int4 leaves them, as
# test_export_report.py checks).
STOCK_FORMATS = {"deepctr_dcn": "fp16", "deepctr_deepfm": "fp16", "deepctr_din": "int4",
                 "keras_rs_dlrm": "int4", "tf2_dense_features": "fp16",
                 "tfrs_dcn_ranking": "fp16", "tfrs_two_tower_retrieval": "int4"}


def test_every_model_has_a_stock_format():
    assert sorted(STOCK_FORMATS) == sorted(EXPECTED)
    assert set(STOCK_FORMATS.values()) == {"fp16", "int4"}


@pytest.mark.parametrize("kind,fmt", sorted(STOCK_FORMATS.items()))
def test_stock_export_verifies(built, kind, fmt, tmp_path):
    src, tables = built(kind)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype=fmt, ops="stock",
                                  isolate=False)
    assert report.verified
    assert all(t.pooled_lookups == 0 and t.format == fmt for t in report.tables)
    converted = {t.name for t in report.tables}
    assert set(EXPECTED[kind]) <= converted
    # fp16 shrinks dim-1 tables too (DeepCTR's linear part); int4 does not
    dim_1 = {n for n, (rows, dim) in tables.items() if dim == 1 and rows >= 1000}
    if quantization.row_bytes(fmt, 1) < 4:
        assert dim_1 <= converted
    else:
        assert not dim_1 & converted


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_refused_with_what_to_do(built, kind, tmp_path):
    src, _ = built(kind)
    reason, keep, expected = REFUSED[kind]
    with pytest.raises(ExportError, match=f"{reason}.*--keep"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", isolate=False)
    assert not os.path.exists(tmp_path / "dst")
    report = compress_saved_model(src, str(tmp_path / "kept"), dtype="int8",
                                  keep=keep, isolate=False)  # what the message says
    assert report.verified
    assert {t.name: (t.lookups, t.pooled_lookups) for t in report.tables} == expected

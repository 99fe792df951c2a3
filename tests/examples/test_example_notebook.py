"""Runs examples/train_compress_export.ipynb top to bottom (small size) and
checks what it measured: the model learned the signal, compression to INT4,
INT8 and FP16 costs next to no AUC (INT4 the most), the tables shrank to
their formats' sizes, the export tool's `auto` mixed formats within its
budget, and the exported INT8 model serves what the in-notebook model
computes."""
import json
import os
import pathlib

import nbclient  # test-only dependencies, installed by tools/setup.sh
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "train_compress_export.ipynb"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("notebook") / "results.json"
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel inherits the environment: the small setting and where to
    # write the results.
    env = {"TFCE_EXAMPLE_SIZE": "small", "TFCE_EXAMPLE_RESULTS": str(out),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nbclient.NotebookClient(
            notebook, timeout=600, kernel_name="python3",
            resources={"metadata": {"path": str(out.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return json.loads(out.read_text())


def test_notebook_runs_at_small_size(results):
    assert results["size"] == "small"


def test_model_learns_the_signal(results):
    fp32 = results["quality"]["fp32"]["auc"]
    # Chance is 0.5; the true click logits rank at best_possible_auc.
    assert 0.6 < fp32 <= results["best_possible_auc"] + 0.01, results


def test_compression_keeps_ranking_quality(results):
    # INT4 has 16 levels over each row's range, INT8 steps are max|row|/127
    # per row, FP16 has 11 significant bits: none may move the AUC or the
    # log-loss noticeably.
    for fmt, bound in (("int4", 5e-3), ("int8", 2e-3), ("fp16", 2e-4)):
        assert abs(results["auc_delta"][fmt]) < bound, results
        assert abs(results["log_loss_delta"][fmt]) < bound, results
    assert results["auc_delta"]["int8"] != 0 or results["log_loss_delta"]["int8"] != 0
    # Each format moves the predictions, the coarser ones more.
    moved = results["max_prediction_delta"]
    assert 0 < moved["fp16"] < moved["int8"] < moved["int4"], moved


def test_tables_shrink_to_their_formats(results):
    sizes = results["table_bytes"]
    # INT4: half a byte per value plus a float16 scale and bias per row
    # (dim 16: 12/64); INT8: a byte per value plus a float32 scale per row
    # (20/64); FP16: two bytes per value.
    assert sizes["int4"] / sizes["fp32"] == pytest.approx(12 / 64, rel=1e-6)
    assert sizes["int8"] / sizes["fp32"] == pytest.approx(20 / 64, rel=1e-6)
    assert sizes["fp16"] / sizes["fp32"] == pytest.approx(0.5, rel=1e-6)


def test_auto_mixes_formats_within_its_budget(results):
    # The export tool's --dtype auto on the trained FP32 SavedModel: some
    # table in INT4, the budget met on the verification requests, smaller
    # than every table in INT8, and the AUC kept.
    auto = results["auto"]
    assert "int4" in auto["formats"].values(), auto
    assert 0 < auto["measured_error"] <= auto["max_error"], auto
    assert results["table_bytes"]["auto"] < results["table_bytes"]["int8"], results
    assert 0 < auto["max_prediction_delta"], auto
    assert abs(auto["auc_delta"]) < 2e-3, auto
    assert abs(auto["log_loss_delta"]) < 2e-3, auto


def test_export_serves_what_the_model_computes(results):
    assert results["served_batch"] == 256
    assert results["served_max_abs_diff"] < 1e-6
    assert results["ops_in_graph"] == ["CompressedEmbeddingLookup",
                                       "FusedDecodeAxpy"]
    # INT8 rows are uint8 records (the scale inline), no int8 array.
    assert "uint8" in results["stored_dtypes"]
    assert "int8" not in results["stored_dtypes"]

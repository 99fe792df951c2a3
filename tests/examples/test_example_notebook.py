"""Runs examples/train_compress_export.ipynb top to bottom (small size) and
checks what it measured: the model learned the signal, compression costs
next to no AUC, the tables shrank to their formats' sizes, and the exported
INT8 model serves what the in-notebook model computes."""
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
    # INT8 steps are max|row|/127 per row, FP16 has 11 significant bits:
    # neither may move the AUC or the log-loss noticeably.
    assert abs(results["auc_delta"]["int8"]) < 2e-3, results
    assert abs(results["auc_delta"]["fp16"]) < 2e-4, results
    assert abs(results["log_loss_delta"]["int8"]) < 2e-3, results
    assert abs(results["log_loss_delta"]["fp16"]) < 2e-4, results
    assert results["auc_delta"]["int8"] != 0 or results["log_loss_delta"]["int8"] != 0


def test_tables_shrink_to_their_formats(results):
    sizes = results["table_bytes"]
    # INT8: a byte per value plus a float32 scale per row (dim 16: 20/64);
    # FP16: two bytes per value.
    assert sizes["int8"] / sizes["fp32"] == pytest.approx(20 / 64, rel=1e-6)
    assert sizes["fp16"] / sizes["fp32"] == pytest.approx(0.5, rel=1e-6)


def test_export_serves_what_the_model_computes(results):
    assert results["served_batch"] == 256
    assert results["served_max_abs_diff"] < 1e-6
    assert results["ops_in_graph"] == ["CompressedEmbeddingLookup",
                                       "FusedDecodeAxpy"]
    assert "int8" in results["stored_dtypes"]

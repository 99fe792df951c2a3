"""A Keras model with quantized `CompressedEmbedding` layers saved by version
0.1.0, kept so later versions must load it and compute the same outputs.

    python tests/support/legacy_keras.py OUT_DIR

writes, with the package as it is when run:

* `model.keras`: a functional model of `CompressedEmbedding` layers quantized
  in place (`layer.quantize`): int8 and fp16 row lookups (`combiner=None`),
  int8 pooling by every combiner (weighted and not, one under the
  `mixed_float16` policy), fp16 pooling and one float32 layer;
* `export/`: the same model's `model.export()` SavedModel;
* `feeds.npz`: its inputs (a dict of padded ids, bags of ids and their
  weights);
* `tables.npz`: each quantized layer's `dequantize()`;
* `outputs_<isa>.npz`: the outputs of the `.keras` file loaded by
  `keras.saving.load_model` (keys "keras|OUTPUT") and of the export through
  both SavedModel loaders (keys "export|tf2|...", "export|tf1|...",
  `saved_model_runner.py`), computed in a fresh process per kernel row the host
  has (`TFCE_ISA`), since pooled sums round differently per row.

tests/tf_compressed_embedding/keras/test_legacy_keras.py loads them with the
current package and asserts the outputs are bit-identical on every row both
hosts have. The directory under tests/data was written at version 0.1.0
(commit 2bb9ed2), when the layer's `"int8"` stored int8 `[V, D]` values and a
separate float32 `[V]` scales variable.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SUPPORT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SUPPORT)

B, ROWS, ROW_DIM, BAG_ROWS, BAG_DIM, IDS, BAG = 6, 40, 12, 60, 13, 3, 5
# name: (table, mode, constructor arguments). The "rows" tables serve `ids`,
# the others pool `bag_ids` (0 is padding: mask_zero).
LAYERS = {
    "rows_int8": ("rows", "int8", {}),
    "rows_fp16": ("rows", "fp16", {}),
    "sum_int8_weighted": ("bags", "int8", {"combiner": "sum"}),
    "mean_int8": ("bags", "int8", {"combiner": "mean"}),
    "sqrtn_int8_weighted": ("bags", "int8", {"combiner": "sqrtn"}),
    "sqrtn_int8_weighted_f16": ("bags", "int8", {"combiner": "sqrtn",
                                                 "dtype": "mixed_float16"}),
    "mean_fp16_weighted": ("bags", "fp16", {"combiner": "mean"}),
    "sum_fp32": ("bags", None, {"combiner": "sum"}),
}


def _package_env(isa=None):
    """The environment of a child process that imports the package the
    caller imported (whichever tree it comes from)."""
    import tf_compressed_embedding as tfce
    root = os.path.dirname(os.path.dirname(os.path.abspath(tfce.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root, os.environ.get("PYTHONPATH", "")]))
    if isa is not None:
        env["TFCE_ISA"] = isa
    return env


def build_model(rng):
    import keras

    from tf_compressed_embedding.layers import CompressedEmbedding

    inputs = {"ids": keras.Input(shape=(IDS,), dtype="int64", name="ids"),
              "bag_ids": keras.Input(shape=(BAG,), dtype="int64", name="bag_ids"),
              "bag_weights": keras.Input(shape=(BAG,), dtype="float32",
                                         name="bag_weights")}
    outputs, layers = {}, {}
    for name, (table, _, kwargs) in LAYERS.items():
        rows, dim = (ROWS, ROW_DIM) if table == "rows" else (BAG_ROWS, BAG_DIM)
        layer = CompressedEmbedding(rows, dim, mask_zero=table == "bags",
                                    name=name, **kwargs)
        if table == "rows":
            outputs[name] = layer(inputs["ids"])
        elif "_weighted" in name:
            outputs[name] = layer(inputs["bag_ids"], weights=inputs["bag_weights"])
        else:
            outputs[name] = layer(inputs["bag_ids"])
        layer.set_weights([rng.standard_normal((rows, dim)).astype(np.float32) * 0.1])
        layers[name] = layer
    model = keras.Model(inputs, outputs)
    for name, (_, mode, _) in LAYERS.items():
        if mode is not None:
            layers[name].quantize(mode)
    return model


def _feeds(rng):
    ids = rng.integers(0, ROWS, (B, IDS))
    ids[0, 0] = -1  # Keras' negative ids: row ROWS - 1
    ids[1, 1] = ROWS - 1
    bag_ids = rng.integers(1, BAG_ROWS, (B, BAG))
    bag_ids[1, 3:] = 0  # padding
    bag_ids[2] = 0  # an empty bag
    bag_ids[3, 0] = BAG_ROWS - 1
    return {"ids": ids.astype(np.int64), "bag_ids": bag_ids.astype(np.int64),
            "bag_weights": rng.uniform(0.1, 2.0, (B, BAG)).astype(np.float32)}


def load_feeds(out_dir):
    with np.load(os.path.join(out_dir, "feeds.npz")) as saved:
        return {k: saved[k] for k in saved.files}


def _keras_outputs(out_dir, out_file):
    """In this (fresh) process: the .keras file's outputs on the feeds."""
    import keras

    import tf_compressed_embedding  # noqa: F401  (registers the layer)

    model = keras.saving.load_model(os.path.join(out_dir, "model.keras"))
    outputs = model(load_feeds(out_dir))
    np.savez(out_file, **{f"keras|{k}": np.asarray(v) for k, v in outputs.items()})


def run_outputs(out_dir, isa):
    """Every output of the kept model, run with kernel row `isa` in fresh
    processes: {"keras|OUTPUT" | "export|tf2|serving_default|OUTPUT" | ...:
    array}."""
    scratch = tempfile.mkdtemp()
    try:
        keras_file = os.path.join(scratch, "keras.npz")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--keras-outputs",
                        out_dir, keras_file], check=True, env=_package_env(isa))
        feeds = load_feeds(out_dir)
        jobs = [{"model": os.path.join(out_dir, "export"),
                 "feeds": {"serving_default": {
                     k: {"value": v.tolist(), "dtype": str(v.dtype)}
                     for k, v in feeds.items()}},
                 "out": os.path.join(scratch, "export.npz")}]
        job_file = os.path.join(scratch, "jobs.json")
        with open(job_file, "w") as f:
            json.dump(jobs, f)
        subprocess.run([sys.executable, os.path.join(SUPPORT, "saved_model_runner.py"),
                        job_file, "--load-ops"], check=True, env=_package_env(isa))
        outputs = {}
        with np.load(keras_file) as result:
            outputs.update({k: result[k] for k in result.files})
        with np.load(jobs[0]["out"]) as result:
            errors = [k for k in result.files if k.startswith("error")]
            if errors:
                raise RuntimeError(f"the export failed on {isa}: {result[errors[0]]}")
            outputs.update({f"export|{k}": result[k] for k in result.files})
        return outputs
    finally:
        shutil.rmtree(scratch)


def build(out_dir):
    import tf_compressed_embedding as tfce
    from tf_compressed_embedding.layers import CompressedEmbedding

    os.makedirs(out_dir)
    rng = np.random.default_rng(23)
    model = build_model(rng)
    model.save(os.path.join(out_dir, "model.keras"))
    model.export(os.path.join(out_dir, "export"), verbose=False)
    np.savez(os.path.join(out_dir, "feeds.npz"), **_feeds(rng))
    np.savez(os.path.join(out_dir, "tables.npz"),
             **{layer.name: layer.dequantize() for layer in model.layers
                if isinstance(layer, CompressedEmbedding)
                and layer.quantization_mode is not None})
    for isa in tfce.supported_isas():
        np.savez(os.path.join(out_dir, f"outputs_{isa}.npz"), **run_outputs(out_dir, isa))


if __name__ == "__main__":
    if sys.argv[1] == "--keras-outputs":
        _keras_outputs(sys.argv[2], sys.argv[3])
    else:
        build(sys.argv[1])

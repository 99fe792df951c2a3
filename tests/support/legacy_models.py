"""SavedModels in the first table layouts, kept so later versions must run them.

    python tests/support/legacy_models.py OUT_DIR

writes, with the package as it is when run:

* `export_int8_fused`, `export_fp16_fused`: `build_module_lookups` exported by
  `tfce-export --ops fused` (row lookups and every pooled form, through
  `CompressedEmbeddingLookup` and `FusedDecodeAxpy`);
* `module_int8`, `module_fp16`: a `tf.Module` holding `tfce.quantize(...)`
  tables, saved by `tf.saved_model.save`, whose functions call the op
  wrappers directly (what users who build graphs by hand save);
* `feeds.npz`: the inputs of every signature;
* `outputs_<isa>.npz`: every signature's outputs through both loaders
  (`saved_model_runner.py`), computed in a fresh process per kernel row the
  host has (`TFCE_ISA`), since pooled sums round differently per row.

tests/tf_compressed_embedding/test_legacy_models.py reruns them with the
current package and asserts the outputs are bit-identical on every row both
hosts have. The directory under tests/data was written at version 0.1.0
(commit 2bb9ed2), when `int8` meant int8 rows with a separate float32 scales
array, and is frozen: run this script from a checkout of that commit, never
from a later one (where `int8` is the rowwise layout).
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

MODELS = ("export_int8_fused", "export_fp16_fused", "module_int8", "module_fp16")


def _save_module(path, fmt, rng):
    import tensorflow as tf

    import tf_compressed_embedding as tfce

    module = tf.Module()
    module.rows = tfce.quantize(rng.standard_normal((40, 12)).astype(np.float32) * 0.1,
                                fmt, name="rows")
    module.bags = tfce.quantize(rng.standard_normal((60, 13)).astype(np.float32) * 0.1,
                                fmt, name="bags")

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, "ids"),
                                  tf.TensorSpec([None, None], tf.int64, "bag_ids"),
                                  tf.TensorSpec([None, None], tf.float32, "bag_weights")])
    def serve(ids, bag_ids, bag_weights):
        mask = bag_ids >= 0
        ragged = tf.ragged.boolean_mask(bag_ids, mask)
        weights = tf.ragged.boolean_mask(bag_weights, mask)
        out = {"rows": tfce.compressed_embedding_lookup(module.rows, ids)}
        for combiner in ("sum", "mean", "sqrtn"):
            out[combiner] = tfce.embedding_lookup_sparse(module.bags, ragged, None,
                                                         combiner=combiner)
            out[combiner + "_weighted"] = tfce.embedding_lookup_sparse(
                module.bags, ragged, weights, combiner=combiner)
        return out

    module.serve = serve
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    bag_ids = rng.integers(-1, 60, (6, 5))
    bag_ids[:, 0] = [0, 59, 1, 2, 3, 4]
    bag_ids[3] = -1  # an empty bag
    return {"serving_default": {
        "ids": rng.integers(0, 40, (6, 3)).astype(np.int64),
        "bag_ids": bag_ids.astype(np.int64),
        "bag_weights": rng.uniform(0.1, 2.0, (6, 5)).astype(np.float32)}}


def _run_outputs(out_dir, feeds, isa):
    scratch = tempfile.mkdtemp()
    jobs = [{"model": os.path.join(out_dir, name),
             "feeds": {sig: {k: {"value": v.tolist(), "dtype": str(v.dtype)}
                             for k, v in feed.items()}
                       for sig, feed in feeds[name].items()},
             "out": os.path.join(scratch, f"{name}.npz")} for name in MODELS]
    job_file = os.path.join(scratch, "jobs.json")
    with open(job_file, "w") as f:
        json.dump(jobs, f)
    env = dict(os.environ, TFCE_ISA=isa)
    subprocess.run([sys.executable, os.path.join(SUPPORT, "saved_model_runner.py"),
                    job_file, "--load-ops"], check=True, env=env)
    outputs = {}
    for job, name in zip(jobs, MODELS):
        with np.load(job["out"]) as result:
            errors = [k for k in result.files if k.startswith("error")]
            if errors:
                raise RuntimeError(f"{name} failed on {isa}: {result[errors[0]]}")
            outputs.update({f"{name}|{k}": result[k] for k in result.files})
    shutil.rmtree(scratch)
    return outputs


def run_outputs(out_dir, feeds, isa):
    """Every signature output of the kept models, run with kernel row `isa`."""
    return _run_outputs(out_dir, feeds, isa)


def load_feeds(out_dir):
    """The feeds saved beside the models: {model: {signature: {input: array}}}."""
    feeds = {}
    with np.load(os.path.join(out_dir, "feeds.npz")) as saved:
        for key in saved.files:
            name, sig, arg = key.split("|")
            feeds.setdefault(name, {}).setdefault(sig, {})[arg] = saved[key]
    return feeds


def build(out_dir):
    import export_models

    import tf_compressed_embedding as tfce
    from export_tools import compress_saved_model

    os.makedirs(out_dir)
    rng = np.random.default_rng(19)
    feeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = export_models.build_module_lookups(os.path.join(tmp, "src"))
        for fmt in ("int8", "fp16"):
            name = f"export_{fmt}_fused"
            compress_saved_model(source.path, os.path.join(out_dir, name), dtype=fmt,
                                 ops="fused", min_rows=1)
            feeds[name] = source.examples
    for fmt in ("int8", "fp16"):
        feeds[f"module_{fmt}"] = _save_module(os.path.join(out_dir, f"module_{fmt}"), fmt, rng)
    np.savez(os.path.join(out_dir, "feeds.npz"),
             **{f"{name}|{sig}|{arg}": value for name, sigs in feeds.items()
                for sig, feed in sigs.items() for arg, value in feed.items()})
    for isa in tfce.supported_isas():
        np.savez(os.path.join(out_dir, f"outputs_{isa}.npz"), **_run_outputs(out_dir, feeds, isa))


if __name__ == "__main__":
    build(sys.argv[1])

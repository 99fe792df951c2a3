"""Runs SavedModels in a fresh process, through both loaders a server can use.

    python saved_model_runner.py JOBS.json [--load-ops]

JOBS.json: [{"model": DIR, "feeds": {sig: {input: list}}, "out": FILE.npz}].
For each model, every signature in `feeds` runs through `tf.saved_model.load`
(keys "tf2/SIG/OUTPUT") and through the TF1 Session loader TF Serving's path
uses, `tf.compat.v1.saved_model.loader.load` + `Session.run` on the
SignatureDef's tensor names (keys "tf1/SIG/OUTPUT"). A model that fails to
load or run writes {"error_tf2"/"error_tf1": message} instead. `--load-ops` imports
tf_compressed_embedding first; without it the package is never imported.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def run_tf2(path, feeds):
    model = tf.saved_model.load(path)
    result = {}
    for sig, feed in feeds.items():
        outputs = model.signatures[sig](**{k: tf.constant(v) for k, v in feed.items()})
        result.update({f"tf2/{sig}/{k}": v.numpy() for k, v in outputs.items()})
    return result


def run_tf1(path, feeds):
    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
        for sig, feed in feeds.items():
            signature = meta.signature_def[sig]
            feed_dict = {signature.inputs[k].name: v for k, v in feed.items()}
            keys = sorted(signature.outputs)
            values = sess.run([signature.outputs[k].name for k in keys], feed_dict)
            result.update({f"tf1/{sig}/{k}": v for k, v in zip(keys, values)})
    return result


def main():
    jobs = json.load(open(sys.argv[1]))
    if "--load-ops" in sys.argv:
        import tf_compressed_embedding  # noqa: F401
    for job in jobs:
        feeds = {sig: {k: np.asarray(v["value"], v["dtype"]) for k, v in feed.items()}
                 for sig, feed in job["feeds"].items()}
        result = {}
        for loader, run in (("tf2", run_tf2), ("tf1", run_tf1)):
            try:
                result.update(run(job["model"], feeds))
            except Exception as e:  # noqa: BLE001 - the test asserts on the message
                result[f"error_{loader}"] = np.array(f"{type(e).__name__}: {e}")
        np.savez(job["out"], **{k.replace("/", "|"): v for k, v in result.items()})
    print("tf_compressed_embedding imported:", "tf_compressed_embedding" in sys.modules)


if __name__ == "__main__":
    main()

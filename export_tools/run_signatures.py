"""Runs every signature of a SavedModel on given inputs, in a process of its own.

    python -m export_tools.run_signatures MODEL INPUTS.npz OUTPUTS.npz [--load-ops]

Verification runs the source and the compressed model this way, each in a
fresh process, as a server would load them. `--load-ops` imports
`tf_compressed_embedding` first (registering the fused ops).
"""
import argparse
import json
import os
import sys

import numpy as np


def save_feeds(path, feeds):
    """Writes {signature: {name: array}} to an .npz file."""
    manifest, arrays = [], {}
    for sig, named in feeds.items():
        for name, value in named.items():
            arrays[f"a{len(manifest)}"] = np.asarray(value)
            manifest.append([sig, name])
    np.savez(path, manifest=np.array(json.dumps(manifest)), **arrays)


def load_feeds(path):
    """Reads what `save_feeds` wrote."""
    with np.load(path, allow_pickle=False) as data:
        result = {}
        for i, (sig, name) in enumerate(json.loads(str(data["manifest"]))):
            result.setdefault(sig, {})[name] = data[f"a{i}"]
        return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    parser.add_argument("--load-ops", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    if args.load_ops:
        import tf_compressed_embedding  # noqa: F401 - registers the ops
    try:
        model = tf.saved_model.load(args.model)
        results = {}
        for sig, feed in load_feeds(args.inputs).items():
            out = model.signatures[sig](**{k: tf.constant(v) for k, v in feed.items()})
            results[sig] = {k: v.numpy() for k, v in out.items()}
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        print(f"{type(e).__name__}: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    save_feeds(args.outputs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

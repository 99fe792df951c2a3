"""Runs every signature of a SavedModel on given inputs, in a process of its own.

    python -m export_tools.run_signatures MODEL INPUTS OUTPUTS [--load-ops]
        [--session-outputs FILE]

Verification runs the source and the compressed model this way, each in a
fresh process, as a server would load them. `--load-ops` imports
`tf_compressed_embedding` first (registering the fused ops). The signatures
run through `tf.saved_model.load`, and with `--session-outputs` also through
the TF1 Session loader, as TF Serving runs them (`Session.run` on the
SignatureDefs' tensors), into FILE: a compressed model's Session path runs
graph functions of its own (export_tools/session_tables.py).

INPUTS and OUTPUTS hold {signature: [{name: array}, ...]} (requests in, their
outputs out) as TFRecord files: a JSON manifest `{"requests": {signature:
count}, "tensors": [[signature, request, name], ...]}`, then one
`TensorProto` per tensor. TensorProtos carry every dtype a
signature can have exactly (strings included, which .npz cannot hold without
pickle).
"""
import argparse
import json
import os
import sys

import numpy as np

from export_tools.errors import tf_error_message


def save_feeds(path, feeds):
    """Writes {signature: [{name: array}, ...]}."""
    import tensorflow as tf
    tensors = [[sig, i, name] for sig, requests in feeds.items()
               for i, named in enumerate(requests) for name in named]
    manifest = {"requests": {sig: len(r) for sig, r in feeds.items()}, "tensors": tensors}
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(json.dumps(manifest).encode())
        for sig, i, name in tensors:
            writer.write(tf.make_tensor_proto(
                np.asarray(feeds[sig][i][name])).SerializeToString())


def load_feeds(path):
    """Reads what `save_feeds` wrote; strings come back as object arrays of
    bytes (as TensorFlow returns them)."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2
    records = iter(tf.data.TFRecordDataset(path).as_numpy_iterator())
    manifest = json.loads(next(records))
    result = {sig: [{} for _ in range(n)] for sig, n in manifest["requests"].items()}
    for (sig, i, name), record in zip(manifest["tensors"], records):
        result[sig][i][name] = tf.make_ndarray(tensor_pb2.TensorProto.FromString(record))
    return result


def run_in_session(path, feeds):
    """{signature: [{output: array}, ...]} through the TF1 Session loader."""
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl
    tags = list(loader_impl.parse_saved_model(path).meta_graphs[0].meta_info_def.tags)
    results = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, tags, path)
        for sig, requests in feeds.items():
            signature = meta.signature_def[sig]
            keys = sorted(signature.outputs)
            fetches = [signature.outputs[k].name for k in keys]
            results[sig] = []
            for feed in requests:
                values = session.run(fetches, {signature.inputs[k].name: v
                                               for k, v in feed.items()})
                results[sig].append(dict(zip(keys, values)))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    parser.add_argument("--load-ops", action="store_true")
    parser.add_argument("--session-outputs", metavar="FILE",
                        help="also run the signatures through the TF1 Session "
                             "loader; their outputs go to FILE")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    where = "loading the op library"
    try:
        if args.load_ops:
            import tf_compressed_embedding as tfce
            tfce.load_ops()
        where = "loading the model"
        model = tf.saved_model.load(args.model)
        results = {}
        feeds = load_feeds(args.inputs)
        for sig, requests in feeds.items():
            results[sig] = []
            for i, feed in enumerate(requests):
                where = f"signature {sig!r}" + (f" request {i}" if len(requests) > 1
                                                 else "")
                out = model.signatures[sig](**{k: tf.constant(v)
                                               for k, v in feed.items()})
                results[sig].append({k: v.numpy() for k, v in out.items()})
        if args.session_outputs:
            where = "the Session loader (TF Serving's path)"
            save_feeds(args.session_outputs, run_in_session(args.model, feeds))
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        print(f"{where}: {type(e).__name__}: {tf_error_message(e)}", file=sys.stderr)
        return 1
    save_feeds(args.outputs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Building and writing the compressed SavedModel.

The new `tf.Module` owns the compressed tables, the variables kept as they
were, and the pass-through resources (lookup tables with their assets). Its
signature functions import the rewritten graphs. Large variables are declared
with zero rows (`shape=[None, ...]`) so saving is instant; their values are
then streamed into the checkpoint chunk by chunk, so no table is ever whole in
memory. The MetaGraph is finally patched so the
variables show their full shapes and the signatures their original method
names and tags.
"""
import dataclasses
import os
import shutil

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from export_tools import checkpoint_io
from export_tools.errors import ExportError
from tf_compressed_embedding import quantization

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def empty_variable(shape, dtype, name):
    """A variable of `shape` with zero rows now; rows are streamed in later."""
    return tf.Variable(tf.zeros([0] + list(shape[1:]), dtype),
                       shape=tf.TensorShape([None] + list(shape[1:])),
                       trainable=False, name=name)


class CompressedVariables(tf.Module):
    """The variables of one compressed table, in the package's format layout
    (quantization.py): `data` of `data_shape(fmt, rows, dim)` (uint8 records
    for the rowwise formats, int8 or fp16 rows for the others), and `scales`
    float32 `[V]` for int8_split (None for the others)."""

    def __init__(self, index, rows, dim, fmt):
        super().__init__(name=f"compressed_table_{index}")
        self.full_shape = (rows, dim)
        self.format = fmt
        self.data = empty_variable(quantization.data_shape(fmt, rows, dim), tf.as_dtype(
            quantization.storage_dtype(fmt)), f"compressed_table_{index}_data")
        self.scales = (empty_variable((rows,), tf.float32,
                                       f"compressed_table_{index}_scales")
                       if quantization.scales_shape(fmt, rows) != (0,) else None)


class ExportedModel(tf.Module):
    """The root object of the written SavedModel."""

    def __init__(self):
        super().__init__(name="tfce_exported_model")
        self.compressed_tables = []
        self.kept_variables = []
        self.resources = []


def signature_function(rewritten, resolve, output_specs):
    """A tf.function with the signature's input names that imports its graph.

    `resolve(binding)` gives the variable or tensor bound to a placeholder.
    """
    specs = [tf.TensorSpec(s.shape, s.dtype, name=n)
             for n, s in zip(rewritten.input_names, rewritten.input_specs)]

    def imported(*args):
        graph = tf.compat.v1.get_default_graph()
        input_map = dict(zip(rewritten.input_tensors, args))
        for placeholder, binding in rewritten.bindings.items():
            target = resolve(binding)
            handle = getattr(target, "handle", None)
            if handle is None:
                handle = getattr(target, "resource_handle", target)
            input_map[placeholder + ":0"] = graph.capture(handle)
        results = tf.graph_util.import_graph_def(
            rewritten.graph_def, input_map=input_map,
            return_elements=list(rewritten.outputs.values()), name="")
        outputs = {}
        for key, tensor in zip(rewritten.outputs, results):
            tensor.set_shape(output_specs[key].shape)
            outputs[key] = tensor
        return outputs

    # Plain graph building: autograph would rewrite `resolve` and what it
    # calls (variable creation, dict updates) into graph ops.
    return tf.function(imported, input_signature=specs,
                       autograph=False).get_concrete_function()


def save(module, signatures, path):
    try:
        tf.saved_model.save(module, path, signatures=signatures)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"TensorFlow could not save the rewritten model: "
                          f"{str(e).splitlines()[0]}") from e


def variable_key(path):
    """The checkpoint key of the variable at attribute path `path` of the root."""
    return path + _VALUE_SUFFIX


@dataclasses.dataclass
class Stream:
    """Tensors written together: `tensors` is [(checkpoint key, shape, numpy
    dtype)]; `chunks` yields, per row chunk, one array for each tensor."""
    tensors: list
    chunks: object


def rebuild_checkpoint(path, streams):
    """Rewrites `path/variables` with the streamed variables filled in.

    The saved checkpoint holds them with zero rows; it is rewritten as two
    bundles merged into one (data files moved, not copied): the other
    variables as saved, and the streamed ones, chunk by chunk.
    """
    if not streams:  # nothing streamed: the saved checkpoint is complete
        return
    prefix = os.path.join(path, "variables", "variables")
    small = checkpoint_io.CheckpointReader(prefix)
    streamed = {key for stream in streams for key, _, _ in stream.tensors}
    missing = sorted(streamed - set(small.shapes))
    if missing:
        raise ExportError(f"internal: the saved model has no variable {missing[0]!r}")
    build = os.path.join(path, "variables_build")
    os.makedirs(build)
    kept = [k for k in small.shapes if k not in streamed]
    bundles = [os.path.join(build, "kept"), os.path.join(build, "streamed")]
    checkpoint_io.save_whole(bundles[0], kept, [small.read(k) for k in kept])
    writer = checkpoint_io.StreamingBundleWriter(
        bundles[1], max((len(s.tensors) for s in streams), default=1))
    try:
        for stream in streams:
            for shard, (key, shape, dtype) in enumerate(stream.tensors):
                writer.begin(shard, key, dtype, shape)
            for arrays in stream.chunks:
                for shard, array in enumerate(arrays):
                    writer.append(shard, array)
            for shard in range(len(stream.tensors)):
                writer.end(shard)
    except BaseException:
        writer.abort()
        raise
    writer.finish()
    shutil.rmtree(os.path.join(path, "variables"))
    checkpoint_io.merge_checkpoints(bundles, prefix)
    shutil.rmtree(build, ignore_errors=True)


def patch_meta_graph(path, full_shapes, method_names, tags, edits=()):
    """Gives streamed variables their full shapes and signatures their source
    method names and tags (tf.saved_model.save writes 'serve' and 'predict'),
    then applies each of `edits` (a function of the MetaGraphDef) to it."""
    pb_path = os.path.join(path, "saved_model.pb")
    saved = saved_model_pb2.SavedModel()
    with open(pb_path, "rb") as f:
        saved.ParseFromString(f.read())
    meta = saved.meta_graphs[0]
    for node in meta.object_graph_def.nodes:
        if node.WhichOneof("kind") == "variable" and node.variable.name in full_shapes:
            _set_shape(node.variable.shape, full_shapes[node.variable.name])
    for node in meta.graph_def.node:
        if node.op == "VarHandleOp":
            shape = full_shapes.get(node.attr["shared_name"].s.decode())
            if shape is not None:
                _set_shape(node.attr["shape"].shape, shape)
    for key, method in method_names.items():
        if key in meta.signature_def:
            meta.signature_def[key].method_name = method
    del meta.meta_info_def.tags[:]
    meta.meta_info_def.tags.extend(tags)
    for edit in edits:
        edit(meta)
    with open(pb_path, "wb") as f:
        f.write(saved.SerializeToString())


def _set_shape(shape_proto, dims):
    del shape_proto.dim[:]
    shape_proto.unknown_rank = False
    for d in dims:
        shape_proto.dim.add(size=int(d))


def copy_extra_assets(src, dst):
    """Carries `assets.extra/` over, a warmup file included (the export writes
    one only when the source has none)."""
    extra = os.path.join(src, "assets.extra")
    if os.path.isdir(extra):
        shutil.copytree(extra, os.path.join(dst, "assets.extra"), dirs_exist_ok=True)


def small_value(reader, location):
    """The value of a (small) kept variable."""
    if location.is_partition:
        return reader.read_rows(location, 0, location.shape[0])
    return np.asarray(reader.read(location.key))

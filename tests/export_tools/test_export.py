"""export_tools on SavedModels of every source kind, built in the tests.

For each kind, the model is exported in every format of
`quantization.FORMATS`, with fused and stock ops, and every export is run
in fresh processes through `tf.saved_model.load` and the TF1 Session loader
(TF Serving's path), against two references run the same way: the source
itself (within the quantization error) and a copy of the source whose
tables hold their dequantized values (float rounding level).
"""
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import export_models
from export_tools import ExportError, compress_saved_model, session_tables
from tf_compressed_embedding import quantization
from repo_paths import SUPPORT

EXPORTABLE = [k for k, b in export_models.BUILDERS.items() if not k.startswith("refuse_")]
# TFCE_TEST_EXPORT_FORMATS (comma-separated) limits the formats exported
# here: tools/test_oldest_tf.sh runs one on the oldest TensorFlow, where the
# whole matrix would double CI's time; the main suite runs every format.
FORMATS = tuple(quantization.check_format(f) for f in os.environ.get(
    "TFCE_TEST_EXPORT_FORMATS", ",".join(quantization.FORMATS)).split(","))
VARIANTS = [(d, o) for d in FORMATS for o in ("fused", "stock")]
FUSED_OPS = {"CompressedEmbeddingLookup", "FusedDecodeAxpy", "BatchedFusedDecodeAxpy"}


def tree_digest(path):
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode())
            digest.update(open(full, "rb").read())
    return digest.hexdigest()


def dequantized_copy(src, dst, table_keys, fmt):
    """`src` with every checkpoint tensor equal to a converted table replaced
    by decode(encode(table)): the model the compressed one must reproduce."""
    shutil.copytree(src, dst)
    prefix = os.path.join(dst, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    # (bytes values, e.g. the object graph, must stay bytes: numpy would strip
    # their trailing NULs)
    values = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}
    tables = [values[k] for k in table_keys]
    for key, value in values.items():
        for table in tables:
            if isinstance(value, np.ndarray) and value.shape == table.shape \
                    and np.array_equal(value, table):
                values[key] = quantization.decode(*quantization.encode(table, fmt), fmt,
                                                  table.shape[1])
    shutil.rmtree(os.path.join(dst, "variables"))
    keys = sorted(values)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                      tensors=[tf.constant(values[k]) for k in keys])


def run_models(workdir, tag, models, feeds, load_ops):
    """Runs each model in one fresh process (both loaders); {model: outputs}."""
    jobs = []
    for i, model in enumerate(models):
        jobs.append({"model": model, "out": os.path.join(workdir, f"{tag}_{i}.npz"),
                     "feeds": {s: {k: {"value": v.tolist(), "dtype": v.dtype.str}
                                   for k, v in f.items()} for s, f in feeds.items()}})
    job_file = os.path.join(workdir, f"{tag}.json")
    json.dump(jobs, open(job_file, "w"))
    command = [sys.executable, os.path.join(SUPPORT, "saved_model_runner.py"), job_file]
    done = subprocess.run(command + (["--load-ops"] if load_ops else []),
                          capture_output=True, text=True, check=True)
    assert f"tf_compressed_embedding imported: {load_ops}" in done.stdout
    results = {}
    for job in jobs:
        with np.load(job["out"]) as data:
            results[job["model"]] = {k.replace("|", "/"): data[k] for k in data.files}
    return results


Exported = collections.namedtuple("Exported", "built src_outputs reference reports "
                                              "outputs paths workdir")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = _export_all(kind, str(tmp_path_factory.mktemp(kind)))
        return cache[kind]
    return get


def _export_all(kind, workdir):
    built = export_models.BUILDERS[kind](os.path.join(workdir, "src"))
    digest = tree_digest(built.path)
    reports, paths = {}, {}
    for dtype, ops in VARIANTS:
        paths[dtype, ops] = os.path.join(workdir, f"{dtype}_{ops}")
        # chunk_rows=7: every table is streamed in several chunks
        reports[dtype, ops] = compress_saved_model(built.path, paths[dtype, ops],
                                                   dtype=dtype, ops=ops, min_rows=1,
                                                   chunk_rows=7, verify=False,
                                                   isolate=False)
    assert tree_digest(built.path) == digest, "the source was modified"
    references = {}
    for dtype in FORMATS:
        keys = [t.checkpoint_key for t in reports[dtype, "fused"].tables]
        references[dtype] = os.path.join(workdir, f"dequantized_{dtype}")
        dequantized_copy(built.path, references[dtype], keys, dtype)
    plain = run_models(workdir, "plain", [built.path] + list(references.values()),
                       built.examples, load_ops=False)
    stock = run_models(workdir, "stock", [paths[d, "stock"] for d in FORMATS],
                       built.examples, load_ops=False)
    fused = run_models(workdir, "fused", [paths[d, "fused"] for d in FORMATS],
                       built.examples, load_ops=True)
    outputs = {v: {**stock, **fused}[paths[v]] for v in VARIANTS}
    reference = {d: plain[references[d]] for d in references}
    return Exported(built, plain[built.path], reference, reports, outputs, paths, workdir)


def _no_errors(results):
    errors = [str(v) for k, v in results.items() if k.startswith("error")]
    assert not errors, errors


def _compare(got, want, relative):
    """Both loaders' outputs in `got` against the `tf.saved_model.load`
    outputs in `want` (some sources, e.g. Keras saved with
    tf.saved_model.save, do not load in the TF1 loader; their exports do)."""
    _no_errors(got)
    assert "error_tf2" not in want, str(want.get("error_tf2"))
    want = {k[len("tf2/"):]: v for k, v in want.items() if k.startswith("tf2/")}
    assert sorted(got) == sorted(f"{loader}/{k}" for loader in ("tf1", "tf2") for k in want)
    tolerance = relative * max(1.0, max(float(np.abs(v).max()) for v in want.values()
                                        if v.size))
    for key, value in got.items():
        np.testing.assert_allclose(value, want[key.split("/", 1)[1]], rtol=0,
                                   atol=tolerance, err_msg=key)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("kind", EXPORTABLE)
def test_matches_dequantized_source(exported, kind, variant):
    """Both loaders give the dequantized source's outputs, to float rounding."""
    e = exported(kind)
    _compare(e.outputs[variant], e.reference[variant[0]], 1e-5)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("kind", EXPORTABLE)
def test_within_quantization_error_of_source(exported, kind, variant):
    e = exported(kind)
    # A decoded row differs from FP32 by at most max_decode_error relative
    # to the row's largest magnitude; outputs add and mix a few rows.
    relative = 8 * float(quantization.max_decode_error(variant[0], 1.0))
    _compare(e.outputs[variant], e.src_outputs, relative)


@pytest.mark.parametrize("kind", EXPORTABLE)
def test_converts_exactly_the_expected_tables(exported, kind):
    e = exported(kind)
    for report in e.reports.values():
        names = {t.name for t in report.tables}
        # A TF1 partition 'x/part_i' is a piece of the partitioned variable 'x'.
        wholes = {n.rsplit("/part_", 1)[0] for n in names}
        assert wholes == set(e.built.tables)
        for t in report.tables:
            rows, dim = e.built.tables[t.name.rsplit("/part_", 1)[0]]
            assert t.dim == dim and t.rows <= rows
        for whole, (rows, _) in e.built.tables.items():
            assert sum(t.rows for t in report.tables
                       if t.name.rsplit("/part_", 1)[0] == whole) == rows


def _meta_graph(path):
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(open(os.path.join(path, "saved_model.pb"), "rb").read())
    return saved.meta_graphs[0]


def _signature_summary(path):
    meta = _meta_graph(path)

    def tensors(infos):
        return {k: (v.dtype, [d.size for d in v.tensor_shape.dim],
                    v.tensor_shape.unknown_rank) for k, v in infos.items()}
    return {k: (s.method_name, tensors(s.inputs), tensors(s.outputs))
            for k, s in meta.signature_def.items() if not k.startswith("__")}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("kind", EXPORTABLE)
def test_signatures_identical(exported, kind, variant):
    e = exported(kind)
    assert _signature_summary(e.paths[variant]) == _signature_summary(e.built.path)
    assert "serve" in _meta_graph(e.paths[variant]).meta_info_def.tags


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("kind", EXPORTABLE)
def test_checkpoint_holds_compressed_tables_only(exported, kind, variant):
    """Each table is stored as its format's data (and int8_split's float32
    scales [V]) in the checkpoint; no float32 copy of any table is left; the
    ops are as asked, the fused ones naming the rowwise formats."""
    e = exported(kind)
    dtype, ops = variant
    reader = tf.train.load_checkpoint(os.path.join(e.paths[variant], "variables",
                                                   "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    found = collections.Counter((tuple(shapes[k]), dtypes[k]) for k in shapes)
    report = e.reports[variant]
    storage = tf.as_dtype(quantization.storage_dtype(dtype))
    # Each table once, however many lookups (and Keras' duplicate paths) share it.
    assert sorted(k for k in found.elements() if k[1] == storage) == sorted(
        (quantization.data_shape(dtype, t.rows, t.dim), storage) for t in report.tables)
    for t in report.tables:
        assert t.format == dtype
        assert t.bytes_after == t.rows * quantization.row_bytes(dtype, t.dim)
        if quantization.scales_shape(dtype, t.rows) != (0,):
            assert found[(t.rows,), tf.float32] >= 1
        assert found[(t.rows, t.dim), tf.float32] == 0, f"FP32 copy of {t.name}"
    meta = _meta_graph(e.paths[variant])
    nodes = [n for f in meta.graph_def.library.function for n in f.node_def]
    ops_used = {n.op for n in nodes}
    if ops == "stock":
        assert not ops_used & FUSED_OPS
    else:
        assert ops_used & FUSED_OPS
        for node in nodes:
            if node.op == "BatchedFusedDecodeAxpy":  # per-feature list attrs
                # tables go in as variable handles (or, in the Session path's
                # copies, by their variables' names), their dtypes in an attr
                types = {tf.as_dtype(t) for t in node.attr["Ttables"].list.type}
                assert types == {tf.resource} or (
                    not types and node.attr["table_names"].list.s)
                assert {tf.as_dtype(t) for t in node.attr["table_dtypes"].list.type} \
                    == {storage}
                row_formats = {f.decode() for f in node.attr["row_formats"].list.s}
                dims = set(node.attr["dims"].list.i)
                if dtype in quantization.ROWWISE_FORMATS:
                    assert row_formats == {quantization.op_row_format(dtype)}
                    assert dims <= {t.dim for t in report.tables}
                else:
                    assert (row_formats, dims) == ({"plain"}, {-1})
            elif node.op in FUSED_OPS:
                assert tf.as_dtype(node.attr["T"].type) == storage
                if dtype in quantization.ROWWISE_FORMATS:
                    assert node.attr["row_format"].s.decode() == \
                        quantization.op_row_format(dtype)
                    assert node.attr["dim"].i in {t.dim for t in report.tables}
                else:  # left at their defaults: what 0.1.0 servers know
                    assert "row_format" not in node.attr and "dim" not in node.attr
    const_shapes = {tuple(d.size for d in n.attr["value"].tensor.tensor_shape.dim)
                    for n in nodes if n.op == "Const"}
    assert not const_shapes & {quantization.data_shape(dtype, t.rows, t.dim)
                               for t in report.tables}, "a table became a graph constant"


# Pooled lookups per kind: module_lookups has sum/mean/sqrtn unweighted and
# weighted, a dense mean and sum, a sum weighted by a tiled mask and a
# safe_embedding_lookup_sparse; the Keras
# models a masked GlobalAveragePooling1D (per signature) and a dense sum;
# tf1_resource_plain an unweighted sum and a safe lookup; the TF1 feature
# columns one per embedding column (the partitioned one has two more, sharing
# a table); the TF1 partitioned tables one each, their partitions merged into
# one table.
FUSED_POOLING = {"module_lookups": 10, "keras_export": 2, "keras_saved_model_save": 2,
                 "tf1_resource_plain": 2, "tf1_feature_columns_ref": 4,
                 "tf1_feature_columns_resource": 4, "tf1_ref_partitioned_div": 1,
                 "tf1_ref_partitioned_mod": 1, "tf1_resource_partitioned_div": 1,
                 "tf1_feature_columns_partitioned": 6}


def _pooled_features(function):
    """(FusedDecodeAxpy nodes, BatchedFusedDecodeAxpy nodes, the features
    they pool) in one function of a meta graph."""
    fused = sum(n.op == "FusedDecodeAxpy" for n in function.node_def)
    batched = [len(n.attr["Ttables"].list.type) or len(n.attr["table_names"].list.s)
               for n in function.node_def if n.op == "BatchedFusedDecodeAxpy"]
    return fused, len(batched), fused + sum(batched)


def _object_graph_functions(meta):
    """The library's functions but the Session path's copies (session_tables)."""
    return [f for f in meta.graph_def.library.function
            if not f.signature.name.endswith(session_tables.COPY_SUFFIX)]


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("kind", sorted(FUSED_POOLING))
def test_pooled_lookups_become_one_batched_node(exported, kind, dtype):
    """Every pooled form is fused; a signature's independent pooled lookups
    are one BatchedFusedDecodeAxpy (a lone one stays a FusedDecodeAxpy); no
    stock segment reduction is left on compressed rows."""
    e = exported(kind)
    meta = _meta_graph(e.paths[dtype, "fused"])
    counts = collections.Counter(n.op for f in meta.graph_def.library.function
                                 for n in f.node_def)
    features = 0
    for function in _object_graph_functions(meta):
        fused, batched, pooled = _pooled_features(function)
        features += pooled
        if pooled >= 2:  # no model here chains one pooled lookup into another
            assert (fused, batched) == (0, 1), function.signature.name
    assert features == FUSED_POOLING[kind]
    for op in ("SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "SegmentSum"):
        assert counts[op] == 0, op


class _PreprocessedIds(tf.Module):
    """Lookups whose id preprocessing the batched node absorbs: two
    RaggedTensor inputs (values + row splits), padded ids made a
    SparseTensor with tf.where(ids >= 0), and a dense [B, L] gather pooled
    over its bag axis."""

    def __init__(self, seed=5):
        rng = np.random.default_rng(seed)
        self.tables = [tf.Variable(rng.standard_normal(shape).astype(np.float32))
                       for shape in ((50, 8), (40, 4), (30, 6), (20, 5))]

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64),
                                  tf.RaggedTensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None, None], tf.int64),
                                  tf.TensorSpec([None, None], tf.int32)])
    def serve(self, ragged, ragged32, padded, dense):
        where = tf.where(padded >= 0)
        sparse = tf.SparseTensor(where, tf.gather_nd(padded, where),
                                 tf.shape(padded, out_type=tf.int64))
        return {"ragged": tf.nn.embedding_lookup_sparse(self.tables[0], ragged, None,
                                                        combiner="mean"),
                "ragged32": tf.nn.embedding_lookup_sparse(self.tables[1], ragged32, None,
                                                          combiner="sum"),
                "padded": tf.nn.embedding_lookup_sparse(self.tables[2], sparse, None,
                                                        combiner="sqrtn"),
                "dense": tf.reduce_mean(tf.gather(self.tables[3], dense), axis=1)}


def test_batched_node_absorbs_id_preprocessing(tmp_path):
    """Ragged, padded and dense ids go into the batched node as they come
    (bag kinds row_splits, padded, dense), their preprocessing is pruned,
    and the outputs are the --no-batch export's, bit for bit, with TF's
    row counts (trailing empty rows of ragged and padded ids dropped)."""
    module = _PreprocessedIds()
    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"serving_default": module.serve})
    paths, nodes = {}, {}
    for batch in (True, False):
        paths[batch] = str(tmp_path / f"batch_{batch}")
        compress_saved_model(src, paths[batch], dtype="int8", ops="fused", min_rows=1,
                             verify=True, isolate=False, batch=batch)
        function = max(_object_graph_functions(_meta_graph(paths[batch])),
                       key=lambda f: len(f.node_def))
        nodes[batch] = [n for n in function.node_def if n.op != "Const"]
    batched = [n for n in nodes[True] if n.op == "BatchedFusedDecodeAxpy"]
    assert len(batched) == 1
    assert sorted(batched[0].attr["bag_kinds"].list.s) == [
        b"dense", b"padded", b"row_splits", b"row_splits"]
    # Only the inputs these features need: their tables and ids and the
    # ragged ones' row splits; no scales, weights or row counts (counted).
    assert len([i for i in batched[0].input if not i.startswith("^")]) == 4 + 4 + 2
    # The tables go in as their variables' handles, which the op reads.
    assert list(batched[0].attr["Ttables"].list.type) == [tf.resource.as_datatype_enum] * 4
    assert set(batched[0].attr["bag_counts"].list.s) <= {b"rows_of_bags", b"rows_with_ids"}
    ops = collections.Counter(n.op for n in nodes[True])
    assert ops["Where"] == ops["GatherNd"] == ops["FloorDiv"] == 0, ops
    # ... and the four tables' ReadVariableOps are gone.
    reads = {batch: sum(n.op == "ReadVariableOp" for n in nodes[batch]) for batch in nodes}
    assert reads[True] == reads[False] - 4, reads
    assert len(nodes[True]) < len(nodes[False]) / 3, (len(nodes[True]), len(nodes[False]))

    ragged = tf.ragged.constant([[1, 2], [], [3, 4, 49], [], []], tf.int64)
    ragged32 = tf.ragged.constant([[1], [2, 3, 3], [], []], tf.int32)
    padded = tf.constant([[-1, 3, 4], [-1, -1, -1], [29, -1, 0], [-1, -1, -1]], tf.int64)
    dense = tf.constant([[0, 19], [5, 5], [7, 1]], tf.int32)
    feed = {"ragged": ragged.flat_values, "ragged_1": ragged.row_splits,
            "ragged32": ragged32.flat_values, "ragged32_1": ragged32.row_splits,
            "padded": padded, "dense": dense}
    want = module.serve(ragged, ragged32, padded, dense)
    got = {b: tf.saved_model.load(paths[b]).signatures["serving_default"](**feed)
           for b in paths}
    for key, value in want.items():
        np.testing.assert_array_equal(got[True][key], got[False][key], err_msg=key)
        assert got[True][key].shape == value.shape, key
        np.testing.assert_allclose(got[True][key], value, atol=0.05, err_msg=key)


class _ConcatenatedLookups(tf.Module):
    """Pooled lookups whose one use is a concat along the last axis: with a
    dense input, in an order that is not the lookups' (`mlp`); alone
    (`only_pooled`); and with one of them also returned (`shared`), which
    keeps the lookups' outputs apart."""

    def __init__(self, seed=6):
        rng = np.random.default_rng(seed)
        self.tables = [tf.Variable(rng.standard_normal(shape).astype(np.float32))
                       for shape in ((50, 8), (40, 4), (30, 6))]
        self.weights = tf.Variable(rng.standard_normal((21, 2)).astype(np.float32))

    def _pooled(self, ids):
        return [tf.nn.embedding_lookup_sparse(t, i, None, combiner=c)
                for t, i, c in zip(self.tables, ids, ("mean", "sum", "sqrtn"))]

    SPEC = [tf.RaggedTensorSpec([None, None], tf.int64)] * 3

    @tf.function(input_signature=SPEC + [tf.TensorSpec([None, 3], tf.float32)])
    def mlp(self, a, b, c, dense):
        pooled = self._pooled((a, b, c))
        features = tf.concat([dense, pooled[2], pooled[0], pooled[1]], axis=-1)
        return {"out": tf.matmul(features, self.weights)}

    @tf.function(input_signature=SPEC)
    def only_pooled(self, a, b, c):
        return {"out": tf.concat(self._pooled((a, b, c)), axis=1)}

    @tf.function(input_signature=SPEC)
    def shared(self, a, b, c):
        pooled = self._pooled((a, b, c))
        return {"out": tf.concat(pooled, axis=1), "first": pooled[0]}


def _concatenated_lookups_feeds(signatures):
    """(ragged ids, dense input, {signature: feed}, the feeds as numpy
    examples) for _ConcatenatedLookups' `signatures`. Verification's own
    inputs would not give the dense input and the ragged ones the same rows:
    it is given these."""
    ids = [tf.ragged.constant(v, tf.int64) for v in (
        [[1, 2], [], [3, 4, 49], [7]], [[0], [39, 39], [5], [1, 2, 3]],
        [[29], [0, 1], [], [2]])]
    dense = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    feeds = {key: {} for key in signatures}
    for key, feed in feeds.items():
        for name, ragged in zip("abc", ids):
            feed[name], feed[name + "_1"] = ragged.flat_values, ragged.row_splits
        if key == "mlp":
            feed["dense"] = dense
    examples = {key: {name: value.numpy() for name, value in feed.items()}
                for key, feed in feeds.items()}
    return ids, dense, feeds, examples


def test_batched_node_writes_the_concatenation_a_concat_takes(tmp_path):
    """Lookups whose one use is a concat side by side become one batched
    node with its concatenated output (in the concat's order), which the
    concat takes in their place (an Identity when nothing else is
    concatenated); a lookup used elsewhere too keeps the outputs apart.
    Outputs are the --no-batch export's bit for bit, through both loaders."""
    module = _ConcatenatedLookups()
    src = str(tmp_path / "src")
    signatures = {"mlp": module.mlp, "only_pooled": module.only_pooled,
                  "shared": module.shared}
    tf.saved_model.save(module, src, signatures=signatures)
    ids, dense, feeds, examples = _concatenated_lookups_feeds(signatures)
    inputs = {"mlp": (*ids, dense), "only_pooled": ids, "shared": ids}
    paths = {}
    for batch in (True, False):
        paths[batch] = str(tmp_path / f"batch_{batch}")
        compress_saved_model(src, paths[batch], dtype="int8", ops="fused", min_rows=1,
                             verify=True, examples=examples, isolate=False, batch=batch)
    shapes = []
    for function in _object_graph_functions(_meta_graph(paths[True])):
        for node in function.node_def:
            if node.op != "BatchedFusedDecodeAxpy":
                continue
            users = [n for n in function.node_def for i in n.input
                     if i.split(":")[0] == node.name]
            if node.attr["concat"].b:
                assert node.attr["num_outputs"].i == 1
                (user,) = users
                shapes.append((user.op, list(node.attr["dims"].list.i),
                               user.attr["N"].i if user.op == "ConcatV2" else 1))
            else:
                shapes.append(("apart", list(node.attr["dims"].list.i), len(users)))
    # mlp: [dense, c, a, b] -> ConcatV2(dense, batched); only_pooled: an
    # Identity of the batched output; shared: three outputs, four uses.
    assert sorted(shapes) == [("ConcatV2", [6, 8, 4], 2), ("Identity", [8, 4, 6], 1),
                              ("apart", [8, 4, 6], 4)], shapes

    loaded = {b: tf.saved_model.load(paths[b]) for b in paths}
    for key, function in signatures.items():
        want = function(*inputs[key])
        got = {b: loaded[b].signatures[key](**feeds[key]) for b in paths}
        for name, value in want.items():
            np.testing.assert_array_equal(got[True][name], got[False][name],
                                          err_msg=f"{key}/{name}")
            np.testing.assert_allclose(got[True][name], value, atol=0.1,
                                       err_msg=f"{key}/{name}")
    # TF Serving's path: the signature run by a TF1 Session.
    for batch, path in paths.items():
        with tf.compat.v1.Session(graph=tf.Graph()) as session:
            signature = tf.compat.v1.saved_model.loader.load(
                session, ["serve"], path).signature_def["mlp"]
            out = session.run(signature.outputs["out"].name,
                              {signature.inputs[k].name: v.numpy()
                               for k, v in feeds["mlp"].items()})
        np.testing.assert_array_equal(out, loaded[False].signatures["mlp"](
            **feeds["mlp"])["out"], err_msg=f"Session, batch={batch}")


def test_session_path_reads_the_tables_by_name(tmp_path):
    """TF Serving's path runs copies of the signature functions whose batched
    node names its tables (export_tools/session_tables.py): once Grappler
    has inlined the calls, the Session runs no handle node for a table, only
    the MLP weights' one. The object graph's functions keep the handles, and
    both loaders give the same outputs, bit for bit."""
    module = _ConcatenatedLookups()
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    tf.saved_model.save(module, src, signatures={"mlp": module.mlp})
    _, _, feeds, examples = _concatenated_lookups_feeds(["mlp"])
    compress_saved_model(src, dst, dtype="int8", ops="fused", min_rows=1, verify=True,
                         examples=examples, isolate=False)
    meta = _meta_graph(dst)
    shared_names = {n.name: n.attr["shared_name"].s.decode()
                    for n in meta.graph_def.node if n.op == "VarHandleOp"}
    tables = {name for name in shared_names.values()
              if name.startswith("compressed_table_")}
    assert len(tables) == 3, shared_names
    (call,) = [n for n in meta.graph_def.node if n.op in session_tables.CALL_OPS
               and n.attr["f"].func.name.endswith(session_tables.COPY_SUFFIX)]
    assert not {shared_names.get(i.split(":")[0]) for i in call.input} & tables
    functions = {f.signature.name: f for f in meta.graph_def.library.function}
    for name, function in functions.items():
        for node in function.node_def:
            if node.op != "BatchedFusedDecodeAxpy":
                continue
            if name.endswith(session_tables.COPY_SUFFIX):
                assert not node.attr["Ttables"].list.type
                assert {t.decode() for t in node.attr["table_names"].list.s} == tables
            else:  # what tf.saved_model.load runs
                assert list(node.attr["Ttables"].list.type) == [tf.resource] * 3
                assert "table_names" not in node.attr
    assert sum(name.endswith(session_tables.COPY_SUFFIX) for name in functions) == 2
    # Every attr has a value (a C++ loader refuses one without).
    for node in [*meta.graph_def.node, *(n for f in functions.values() for n in f.node_def)]:
        assert all(value.WhichOneof("value") for value in node.attr.values()), node.name

    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        signature = tf.compat.v1.saved_model.loader.load(
            session, ["serve"], dst).signature_def["mlp"]
        metadata = tf.compat.v1.RunMetadata()
        out = session.run(signature.outputs["out"].name,
                          {signature.inputs[k].name: v.numpy()
                           for k, v in feeds["mlp"].items()},
                          options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                          run_metadata=metadata)
    ran = [n for graph in metadata.partition_graphs for n in graph.node]
    ops = collections.Counter(n.op for n in ran)
    # The MLP's MatMul runs as _MklMatMul where TF turns oneDNN on (by
    # default on CPUs with AVX512_VNNI, AVX512_BF16 or AMX).
    assert ops["BatchedFusedDecodeAxpy"] == 1, ops
    assert ops["MatMul"] + ops["_MklMatMul"] == 1, ops
    assert not any(ops[op] for op in session_tables.CALL_OPS), ops
    handles = [n.attr["shared_name"].s.decode() for n in ran if n.op == "VarHandleOp"]
    assert len(handles) == 1 and handles[0] not in tables, handles
    want = tf.saved_model.load(dst).signatures["mlp"](**feeds["mlp"])["out"]
    np.testing.assert_array_equal(out, want)


def test_verification_runs_the_session_path(tmp_path, monkeypatch):
    """An export whose Session path reads the wrong tables fails
    verification, naming that loader."""
    module = _ConcatenatedLookups()
    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"only_pooled": module.only_pooled})
    _, _, _, examples = _concatenated_lookups_feeds(["only_pooled"])
    name_tables = session_tables.name_tables

    def swapped(meta):  # the first two tables' names swapped
        named = name_tables(meta)
        for function in meta.graph_def.library.function:
            for node in function.node_def:
                if "table_names" in node.attr:  # the Session path's nodes
                    names = node.attr["table_names"].list.s
                    names[0], names[1] = names[1], names[0]
        return named

    monkeypatch.setattr(session_tables, "name_tables", swapped)
    with pytest.raises(ExportError, match=r"verification: .*the Session loader "
                                          r"\(TF Serving's path\)"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", ops="fused",
                             min_rows=1, examples=examples, isolate=False)


@pytest.mark.parametrize("kind", sorted(FUSED_POOLING))
def test_batched_export_equals_one_node_per_lookup(exported, kind, tmp_path):
    """The batched node's outputs are those of the FusedDecodeAxpy nodes it
    replaces (--no-batch), bit for bit, through both loaders: every pooled
    source kind the tool rewrites."""
    e = exported(kind)
    apart = str(tmp_path / "no_batch")
    report = compress_saved_model(e.built.path, apart, dtype="int8", ops="fused",
                                  min_rows=1, chunk_rows=7, verify=False,
                                  isolate=False, batch=False)
    assert not any(report.batched_lookups.values())
    meta = _meta_graph(apart)
    assert all(_pooled_features(f)[1] == 0 for f in meta.graph_def.library.function)
    got = run_models(str(tmp_path), "no_batch", [apart], e.built.examples,
                     load_ops=True)[apart]
    _no_errors(got)
    want = e.outputs["int8", "fused"]
    assert sorted(got) == sorted(want)
    for key, value in got.items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)


def test_fused_export_needs_the_ops_and_stock_does_not(exported, tmp_path):
    e = exported("module_lookups")
    results = run_models(str(tmp_path), "no_ops",
                         [e.paths["int8", "fused"], e.paths["int8", "stock"]],
                         e.built.examples, load_ops=False)
    fused = results[e.paths["int8", "fused"]]
    for loader in ("tf1", "tf2"):
        assert "Op type not registered" in str(fused[f"error_{loader}"])
    _no_errors(results[e.paths["int8", "stock"]])


def test_assets_and_extra_assets_carried_over(exported):
    e = exported("module_hash_table")
    for path in e.paths.values():
        assert sorted(os.listdir(os.path.join(path, "assets"))) == sorted(
            os.listdir(os.path.join(e.built.path, "assets")))
        for name in os.listdir(os.path.join(e.built.path, "assets.extra")):
            assert open(os.path.join(path, "assets.extra", name), "rb").read() == open(
                os.path.join(e.built.path, "assets.extra", name), "rb").read()


# The formats each refusal model is refused in: beyond float16's range, fp16
# values and int4 scales (the row's range / 15) are; int8 stores it.
REFUSED_FORMATS = {"refuse_fp16_overflow": ("fp16", "int4")}


@pytest.mark.parametrize("kind, dtype", [
    (k, d) for k in export_models.BUILDERS if k.startswith("refuse_")
    for d in REFUSED_FORMATS.get(k, ("int8",))])
def test_refusals(kind, dtype, tmp_path):
    built = export_models.BUILDERS[kind](str(tmp_path / "src"))
    digest = tree_digest(built.path)
    with pytest.raises(ExportError, match=built.refusal):
        compress_saved_model(built.path, str(tmp_path / "dst"), dtype=dtype, min_rows=1)
    assert sorted(os.listdir(tmp_path)) == ["src"], "a partial output was left behind"
    assert tree_digest(built.path) == digest


def test_fp16_overflow_table_converts_to_int8(tmp_path):
    built = export_models.build_refuse_fp16_overflow(str(tmp_path / "src"))
    report = compress_saved_model(built.path, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1)
    assert report.verified and [t.name for t in report.tables] == list(built.tables)


def test_tied_table_kept_fp32_when_named(tmp_path):
    built = export_models.build_refuse_tied(str(tmp_path / "src"))
    with pytest.raises(ExportError, match="no table to compress"):
        compress_saved_model(built.path, str(tmp_path / "dst"), min_rows=1, keep="^emb$")
    assert not os.path.exists(tmp_path / "dst")

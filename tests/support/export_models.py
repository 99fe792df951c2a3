"""Builders of small SavedModels of every source kind `export_tools` handles.

Each `build_<kind>(export_dir, rows, dim, seed)` builds its model in-process,
writes it to `export_dir` (which must not exist yet: the TF1 builder refuses
an existing directory) and returns a `BuiltModel` describing it:

* `tables`: the variables the tool is expected to convert when called with
  `min_rows=1`, i.e. every rank-2 float variable consumed only by lookups,
  keyed by the name TF gives it (without ':0'; the full name of a TF1
  partitioned variable) with its full (rows, dim) shape. Dense kernels are
  listed nowhere. For refusal models these are the tables the refusal is
  about.
* `examples`: per signature key, a feed of dense numpy inputs (batch of 5)
  whose ids cover row 0 and the last row of every table.
* `refusal`: for models the tool must refuse, a substring expected in its
  error. Refusal models are still valid TF models that load and run.

Bags of ids are fed densely as `[B, L]` with -1 padding (0 padding for Keras
masked embeddings); models that need a `SparseTensor` build it in-graph.
"""
import dataclasses
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute.sharded_variable import ShardedVariable

BATCH = 5
BAG = 4
v1 = tf.compat.v1


@dataclasses.dataclass
class BuiltModel:
    """What a builder wrote (see the module docstring)."""
    path: str  # the SavedModel directory written
    tables: dict  # variable name -> (rows, dim) of the tables to convert
    examples: dict  # signature key -> {input name: np.ndarray}
    refusal: str | None = None  # substring of the tool's refusal, if any


# ---------------------------------------------------------------- helpers --

def _table(rng, rows, dim):
    """A random-normal table scaled by 0.1."""
    return (rng.standard_normal((rows, dim)) * 0.1).astype(np.float32)


def _ids(rng, rows, dtype=np.int64):
    """`[BATCH]` ids into a `rows`-row table, first 0 and last rows-1."""
    ids = rng.integers(0, rows, BATCH)
    ids[0], ids[-1] = 0, rows - 1
    return ids.astype(dtype)


def _bags(rng, rows, pad=-1, full=False, empty_row=None, dtype=np.int64):
    """`[BATCH, BAG]` bags of ids padded with `pad` at the end of each row.

    Every bag holds at least one id (all BAG ids if `full`) except row
    `empty_row`, which is all padding; ids 0 and rows-1 always occur. With
    `pad=0` (Keras `mask_zero`) ids are drawn from 1..rows-1 and row 0 is
    padded, so 0 occurs only as padding and no bag is fully masked.
    """
    low = 1 if pad == 0 else 0
    bags = np.full((BATCH, BAG), pad, np.int64)
    for b in range(BATCH):
        n = BAG if full else int(rng.integers(1, BAG + 1))
        bags[b, :n] = rng.integers(low, rows, n)
    bags[-1, 0] = rows - 1
    if pad == 0:
        bags[0, 0], bags[0, -1] = 1, 0
    else:
        bags[0, 0] = 0
    if empty_row is not None:
        bags[empty_row] = pad
    return bags.astype(dtype)


def _weights(rng, bags):
    """Positive float32 weights of the same shape, 0 at padded positions."""
    w = rng.uniform(0.5, 1.5, bags.shape).astype(np.float32)
    return np.where(bags >= 0, w, 0.0).astype(np.float32)


def _to_sparse(ids, weights=None):
    """In-graph SparseTensors of the non-negative ids (and their weights)."""
    idx = tf.where(ids >= 0)
    shape = tf.shape(ids, out_type=tf.int64)
    sp_ids = tf.SparseTensor(idx, tf.gather_nd(ids, idx), shape)
    if weights is None:
        return sp_ids, None
    return sp_ids, tf.SparseTensor(idx, tf.gather_nd(weights, idx), shape)


def _spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


def _save_module(module, export_dir, functions):
    """Saves `module` with one signature per tf.function in `functions`."""
    tf.saved_model.save(module, export_dir, signatures={
        key: fn.get_concrete_function() for key, fn in functions.items()})


def _randomize_keras(model, rng):
    """Sets every weight of `model` to random normal values * 0.1."""
    for w in model.weights:
        value = rng.standard_normal(tuple(w.shape)) * 0.1
        w.assign(value.astype(np.float32))


# ------------------------------------------------------------------ Keras --

def build_keras_export(export_dir, rows=50, dim=8, seed=0):
    """Keras functional model saved with `model.export` ('serve' and
    'serving_default'): user_id [B] -> Embedding; hist_ids [B, L] (0-padded)
    -> masked Embedding + GlobalAveragePooling1D; concat -> Dense(1)."""
    rng = np.random.default_rng(seed)
    items = 2 * rows
    user_id = keras.Input((), dtype="int32", name="user_id")
    hist_ids = keras.Input((None,), dtype="int32", name="hist_ids")
    user = keras.layers.Embedding(rows, dim, name="user_emb")(user_id)
    hist = keras.layers.Embedding(items, dim, mask_zero=True,
                                  name="item_emb")(hist_ids)
    pooled = keras.layers.GlobalAveragePooling1D()(hist)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([user, pooled]))
    model = keras.Model([user_id, hist_ids], out)
    _randomize_keras(model, rng)
    model.export(export_dir, verbose=False)
    feed = {"user_id": _ids(rng, rows, np.int32),
            "hist_ids": _bags(rng, items, pad=0, dtype=np.int32)}
    return BuiltModel(
        export_dir,
        {"user_emb/embeddings": (rows, dim),
         "item_emb/embeddings": (items, dim)},
        {"serve": feed, "serving_default": feed})


def build_keras_saved_model_save(export_dir, rows=50, dim=8, seed=0):
    """Keras functional model saved with `tf.saved_model.save(model, path)`.

    As `keras_export` plus a dense bag summed with `keras.ops.sum` over the
    bag axis of an unmasked Embedding. The default signature names the
    (list) inputs positionally: 'inputs' (user_id), 'inputs_1' (hist_ids),
    'inputs_2' (tag_ids).
    """
    rng = np.random.default_rng(seed)
    items, tags = 2 * rows, rows + 10
    user_id = keras.Input((), dtype="int64", name="user_id")
    hist_ids = keras.Input((None,), dtype="int64", name="hist_ids")
    tag_ids = keras.Input((BAG,), dtype="int64", name="tag_ids")
    user = keras.layers.Embedding(rows, dim, name="user_emb")(user_id)
    hist = keras.layers.Embedding(items, dim, mask_zero=True,
                                  name="item_emb")(hist_ids)
    pooled = keras.layers.GlobalAveragePooling1D()(hist)
    tag = keras.ops.sum(keras.layers.Embedding(tags, dim, name="tag_emb")(
        tag_ids), axis=1)
    out = keras.layers.Dense(1)(
        keras.layers.Concatenate()([user, pooled, tag]))
    model = keras.Model([user_id, hist_ids, tag_ids], out)
    _randomize_keras(model, rng)
    tf.saved_model.save(model, export_dir)
    feed = {"inputs": _ids(rng, rows),
            "inputs_1": _bags(rng, items, pad=0),
            "inputs_2": _bags(rng, tags, full=True)}
    return BuiltModel(
        export_dir,
        {"user_emb/embeddings": (rows, dim),
         "item_emb/embeddings": (items, dim),
         "tag_emb/embeddings": (tags, dim)},
        {"serving_default": feed})


# -------------------------------------------------------------- tf.Module --

def build_module_lookups(export_dir, rows=50, dim=8, seed=0):
    """A tf.Module with five tables of different shapes and three signatures.

    'serving_default': `tf.nn.embedding_lookup(user, user_id)` and
    `tf.gather(user, peer_id)` share the user table;
    `tf.gather(ctx.read_value(), ctx_id)`.
    'pooled': `tf.nn.embedding_lookup_sparse` on item with and without
    weights for each combiner; `reduce_mean` / `reduce_sum` over
    `tf.gather(tag, dense_ids)` (int32 ids, full bags), and DeepCTR's
    masked mean (rows times the id != 0 mask tiled to `[B, L, D]`, summed,
    over the count plus an epsilon).
    'safe': `tf.nn.safe_embedding_lookup_sparse` on query with weights; the
    example has an empty row (row 2).
    """
    rng = np.random.default_rng(seed)
    shapes = {"user": (rows, dim), "item": (2 * rows, min(16, dim + 4)),
              "ctx": (rows // 2 + 3, max(3, dim // 2)),
              "tag": (rows + 10, max(3, dim - 2)),
              "query": (3 * rows, dim)}
    module = tf.Module()
    var = {name: tf.Variable(_table(rng, *shape), name=name)
           for name, shape in shapes.items()}
    module.tables = var

    @tf.function(input_signature=[_spec([None], tf.int64, "user_id"),
                                  _spec([None], tf.int64, "peer_id"),
                                  _spec([None], tf.int64, "ctx_id")])
    def serve(user_id, peer_id, ctx_id):
        user = tf.nn.embedding_lookup(var["user"], user_id)
        peer = tf.gather(var["user"], peer_id)
        return {"user": user,
                "affinity": tf.reduce_sum(user * peer, axis=1),
                "ctx": tf.gather(var["ctx"].read_value(), ctx_id)}

    @tf.function(input_signature=[
        _spec([None, None], tf.int64, "bag_ids"),
        _spec([None, None], tf.float32, "bag_weights"),
        _spec([None, None], tf.int32, "dense_ids")])
    def pooled(bag_ids, bag_weights, dense_ids):
        sp_ids, sp_weights = _to_sparse(bag_ids, bag_weights)
        out = {}
        for combiner in ("sum", "mean", "sqrtn"):
            out[combiner] = tf.nn.embedding_lookup_sparse(
                var["item"], sp_ids, None, combiner=combiner)
            out[combiner + "_weighted"] = tf.nn.embedding_lookup_sparse(
                var["item"], sp_ids, sp_weights, combiner=combiner)
        tag_rows = tf.gather(var["tag"], dense_ids)
        out["dense_mean"] = tf.reduce_mean(tag_rows, axis=1)
        out["dense_sum"] = tf.reduce_sum(tag_rows, axis=1)
        mask = tf.cast(tf.not_equal(dense_ids, 0), tf.float32)
        tiled = tf.tile(tf.expand_dims(mask, 2), [1, 1, shapes["tag"][1]])
        out["dense_masked_mean"] = tf.reduce_sum(tag_rows * tiled, axis=1) / (
            tf.reduce_sum(mask, axis=-1, keepdims=True) + 1e-8)
        return out

    @tf.function(input_signature=[_spec([None, None], tf.int64, "query_ids"),
                                  _spec([None, None], tf.float32,
                                        "query_weights")])
    def safe(query_ids, query_weights):
        sp_ids, sp_weights = _to_sparse(query_ids, query_weights)
        return {"query": tf.nn.safe_embedding_lookup_sparse(
            var["query"], sp_ids, sp_weights, combiner="mean")}

    module.serve, module.pooled, module.safe = serve, pooled, safe
    _save_module(module, export_dir,
                 {"serving_default": serve, "pooled": pooled, "safe": safe})
    bags = _bags(rng, shapes["item"][0])
    query = _bags(rng, shapes["query"][0], empty_row=2)
    return BuiltModel(
        export_dir, dict(shapes),
        {"serving_default": {"user_id": _ids(rng, rows),
                             "peer_id": _ids(rng, rows)[::-1].copy(),
                             "ctx_id": _ids(rng, shapes["ctx"][0])},
         "pooled": {"bag_ids": bags, "bag_weights": _weights(rng, bags),
                    "dense_ids": _bags(rng, shapes["tag"][0], full=True,
                                       dtype=np.int32)},
         "safe": {"query_ids": query,
                  "query_weights": _weights(rng, query)}})


def build_module_hash_table(export_dir, rows=50, dim=8, seed=0):
    """Raw int64 keys -> `StaticHashTable` (from a `TextFileInitializer` on an
    asset vocabulary file; unknown keys map to the last row) -> embedding
    lookup. An `assets.extra/model_card.txt` is written after saving."""
    rng = np.random.default_rng(seed)
    keys = 1000 + 7 * np.arange(rows - 1)
    module = tf.Module()
    module.emb = tf.Variable(_table(rng, rows, dim), name="emb")
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.tsv")
        with open(vocab, "w") as f:
            f.writelines(f"{k}\t{i}\n" for i, k in enumerate(keys))
        module.lookup_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                vocab, tf.int64, 0, tf.int64, 1, delimiter="\t"),
            default_value=rows - 1)

        @tf.function(input_signature=[_spec([None], tf.int64, "raw_key")])
        def serve(raw_key):
            row = module.lookup_table.lookup(raw_key)
            return {"emb": tf.nn.embedding_lookup(module.emb, row)}

        module.serve = serve
        _save_module(module, export_dir, {"serving_default": serve})
    extra = os.path.join(export_dir, "assets.extra")
    os.makedirs(extra)
    with open(os.path.join(extra, "model_card.txt"), "w") as f:
        f.write("test model: raw keys -> hash table -> embedding\n")
    raw = keys[rng.integers(0, rows - 1, BATCH)]
    raw[0], raw[-1] = keys[0], 999  # 999 is unknown -> row rows-1
    return BuiltModel(export_dir, {"emb": (rows, dim)},
                      {"serving_default": {"raw_key": raw.astype(np.int64)}})


# ------------------------------------------------------------------- TF1 --

def _np_initializer(table):
    """A TF1 initializer giving each partition its slice of `table`."""
    def init(shape, dtype=None, partition_info=None):
        del dtype
        offset = partition_info.single_offset(shape) if partition_info else 0
        return tf.constant(table[offset:offset + shape[0]])
    return init


def _save_tf1(sess, export_dir, inputs, outputs, main_op=None):
    """Saves the session's graph with tag 'serve' and one predict
    signature 'serving_default' (`main_op`, e.g. the tables' initializer,
    runs at load)."""
    builder = v1.saved_model.Builder(export_dir)
    builder.add_meta_graph_and_variables(
        sess, [tf.saved_model.SERVING], signature_def_map={
            "serving_default": v1.saved_model.predict_signature_def(
                inputs, outputs)},
        strip_default_attrs=True, main_op=main_op,
        assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS))
    builder.save()


def _build_tf1_partitioned(export_dir, rows, dim, seed, strategy,
                           use_resource):
    """TF1 graph: 'model/emb' partitioned 4 ways, pooled with
    `embedding_lookup_sparse(partition_strategy=strategy, combiner='mean')`
    with weights, and an unpartitioned 'model/user' table looked up with
    `embedding_lookup`."""
    rng = np.random.default_rng(seed)
    users, user_dim = rows // 2 + 5, max(3, dim // 2)
    graph = tf.Graph()
    with graph.as_default():
        user_id = v1.placeholder(tf.int64, [None], name="user_id")
        bag_ids = v1.placeholder(tf.int64, [None, None], name="bag_ids")
        bag_weights = v1.placeholder(tf.float32, [None, None],
                                     name="bag_weights")
        with v1.variable_scope("model", use_resource=use_resource):
            emb = v1.get_variable(
                "emb", [rows, dim], tf.float32,
                _np_initializer(_table(rng, rows, dim)),
                partitioner=v1.fixed_size_partitioner(4))
            user = v1.get_variable(
                "user", [users, user_dim], tf.float32,
                _np_initializer(_table(rng, users, user_dim)))
        sp_ids, sp_weights = _to_sparse(bag_ids, bag_weights)
        pooled = v1.nn.embedding_lookup_sparse(
            emb, sp_ids, sp_weights, partition_strategy=strategy,
            combiner="mean")
        user_vec = v1.nn.embedding_lookup(user, user_id)
        score = tf.reduce_sum(pooled[:, :user_dim] * user_vec, axis=1)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            _save_tf1(sess, export_dir,
                      {"user_id": user_id, "bag_ids": bag_ids,
                       "bag_weights": bag_weights},
                      {"pooled": pooled, "user": user_vec, "score": score})
    bags = _bags(rng, rows)
    return BuiltModel(
        export_dir,
        {"model/emb": (rows, dim), "model/user": (users, user_dim)},
        {"serving_default": {"user_id": _ids(rng, users), "bag_ids": bags,
                             "bag_weights": _weights(rng, bags)}})


def build_tf1_ref_partitioned_div(export_dir, rows=50, dim=8, seed=0):
    """TF1 ref variables (VariableV2), 4 partitions, 'div' strategy."""
    return _build_tf1_partitioned(export_dir, rows, dim, seed, "div", False)


def build_tf1_ref_partitioned_mod(export_dir, rows=50, dim=8, seed=0):
    """TF1 ref variables (VariableV2), 4 partitions, 'mod' strategy: logical
    id i is row i // 4 of partition i % 4."""
    return _build_tf1_partitioned(export_dir, rows, dim, seed, "mod", False)


def build_tf1_resource_partitioned_div(export_dir, rows=50, dim=8, seed=0):
    """TF1 resource variables, 4 partitions, 'div' strategy."""
    return _build_tf1_partitioned(export_dir, rows, dim, seed, "div", True)


def build_tf1_resource_plain(export_dir, rows=50, dim=8, seed=0):
    """TF1 resource variables without partitions: 'emb' pooled with
    `embedding_lookup_sparse(combiner='sum')` without weights, 'query'
    pooled with weighted `safe_embedding_lookup_sparse` (the example's
    row 1 of query_ids is empty)."""
    rng = np.random.default_rng(seed)
    queries = 2 * rows
    graph = tf.Graph()
    with graph.as_default():
        bag_ids = v1.placeholder(tf.int64, [None, None], name="bag_ids")
        query_ids = v1.placeholder(tf.int64, [None, None], name="query_ids")
        query_weights = v1.placeholder(tf.float32, [None, None],
                                       name="query_weights")
        emb = v1.get_variable("emb", [rows, dim], tf.float32,
                              _np_initializer(_table(rng, rows, dim)),
                              use_resource=True)
        query = v1.get_variable("query", [queries, dim], tf.float32,
                                _np_initializer(_table(rng, queries, dim)),
                                use_resource=True)
        sp_ids, _ = _to_sparse(bag_ids)
        pooled = v1.nn.embedding_lookup_sparse(emb, sp_ids, None,
                                               combiner="sum")
        sq_ids, sq_weights = _to_sparse(query_ids, query_weights)
        safe = v1.nn.safe_embedding_lookup_sparse(query, sq_ids, sq_weights)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            _save_tf1(sess, export_dir,
                      {"bag_ids": bag_ids, "query_ids": query_ids,
                       "query_weights": query_weights},
                      {"pooled": pooled, "query": safe})
    q = _bags(rng, queries, empty_row=1)
    return BuiltModel(
        export_dir, {"emb": (rows, dim), "query": (queries, dim)},
        {"serving_default": {"bag_ids": _bags(rng, rows), "query_ids": q,
                             "query_weights": _weights(rng, q)}})


def _build_tf1_feature_columns(export_dir, rows, dim, seed, use_resource,
                               partitions=None):
    """An estimator-era TF1 graph: `input_layer` over embedding columns of
    a vocabulary-list column ('country', strings, mean), a vocabulary-file
    column ('tags', an asset; "" pads the bags, sqrtn), a hashed column
    ('query', sum) and a weighted identity column ('item' with
    'item_weight', sum); the tables' initializer runs as the main op.
    With `partitions`, every table is split that many ways by
    `fixed_size_partitioner` (as estimators did) and two more identity
    columns ('clicked', 'viewed', mean) share one table
    (`shared_embedding_columns`)."""
    rng = np.random.default_rng(seed)
    fc = v1.feature_column
    countries = [f"country_{i}" for i in range(rows)]
    tags = [f"tag_{i}" for i in range(rows + 3)]
    graph = tf.Graph()
    with graph.as_default(), tempfile.TemporaryDirectory() as tmp:
        vocab_file = os.path.join(tmp, "tags.txt")
        with open(vocab_file, "w") as f:
            f.write("".join(t + "\n" for t in tags))
        feeds = {
            "country": v1.placeholder(tf.string, [None], name="country"),
            "tags": v1.placeholder(tf.string, [None, BAG], name="tags"),
            "query": v1.placeholder(tf.string, [None], name="query"),
            "item": v1.placeholder(tf.int64, [None, BAG], name="item"),
            "item_weight": v1.placeholder(tf.float32, [None, BAG],
                                          name="item_weight")}
        columns = [
            fc.embedding_column(fc.categorical_column_with_vocabulary_list(
                "country", countries), dim, combiner="mean"),
            fc.embedding_column(fc.categorical_column_with_vocabulary_file(
                "tags", vocab_file, vocabulary_size=len(tags)), dim,
                combiner="sqrtn"),
            fc.embedding_column(fc.categorical_column_with_hash_bucket(
                "query", rows), dim, combiner="sum"),
            fc.embedding_column(fc.weighted_categorical_column(
                fc.categorical_column_with_identity("item", rows),
                "item_weight"), dim, combiner="sum")]
        names = {"country": rows, "tags": len(tags), "query": rows,
                 "item_weighted_by_item_weight": rows}
        tables = {f"model/input_layer/{c}_embedding/embedding_weights": (n, dim)
                  for c, n in names.items()}
        if partitions:
            for name in ("clicked", "viewed"):
                feeds[name] = v1.placeholder(tf.int64, [None, BAG], name=name)
            columns += fc.shared_embedding_columns(
                [fc.categorical_column_with_identity(n, rows)
                 for n in ("clicked", "viewed")], dim, combiner="mean",
                shared_embedding_collection_name="history")
            tables["model/input_layer/history/embedding_weights"] = (rows, dim)
        partitioner = v1.fixed_size_partitioner(partitions) if partitions else None
        with v1.variable_scope("model", use_resource=use_resource,
                               partitioner=partitioner):
            features = fc.input_layer(feeds, columns)
        logit = tf.reduce_sum(features, axis=1)
        with v1.Session(graph=graph) as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            for variable in v1.global_variables():
                sess.run(variable.assign(_table(rng, *variable.shape.as_list())))
            _save_tf1(sess, export_dir, feeds,
                      {"features": features, "logit": logit},
                      main_op=v1.tables_initializer())
    tag_bags = np.array([[tags[i] for i in rng.integers(0, len(tags), BAG)]
                         for _ in range(BATCH)])
    tag_bags[1, 2:] = ""   # a shorter bag
    tag_bags[2, 0] = "tag_unknown"  # out of vocabulary: dropped
    item = _bags(rng, rows)
    examples = {
        "country": np.array([countries[i] for i in rng.integers(0, rows, BATCH)]),
        "tags": tag_bags,
        "query": np.array([f"q{i}" for i in range(BATCH)]),
        "item": item, "item_weight": _weights(rng, item)}
    if partitions:
        examples.update(clicked=_bags(rng, rows), viewed=_bags(rng, rows))
    return BuiltModel(export_dir, tables, {"serving_default": examples})


def build_tf1_feature_columns_ref(export_dir, rows=50, dim=8, seed=0):
    """TF1 feature columns over ref variables (VariableV2)."""
    return _build_tf1_feature_columns(export_dir, rows, dim, seed, False)


def build_tf1_feature_columns_resource(export_dir, rows=50, dim=8, seed=0):
    """TF1 feature columns over resource variables."""
    return _build_tf1_feature_columns(export_dir, rows, dim, seed, True)


def build_tf1_feature_columns_partitioned(export_dir, rows=50, dim=8, seed=0):
    """TF1 feature columns over ref variables partitioned 3 ways, with a
    shared embedding table."""
    return _build_tf1_feature_columns(export_dir, rows, dim, seed, False,
                                      partitions=3)


# ------------------------------------------------------- --dtype auto ----

def build_module_scaled(export_dir, rows=60, dim=8, seed=0):
    """Tables of different magnitudes for `--dtype auto` (not in BUILDERS:
    no new source kind). 'serving_default' returns `mixed`, the sum of a row
    of 'small' (values * 0.01), 'medium' (* 0.1) and 'large' (* 1): their
    errors add up in every element, so they share the bound. 'side' returns
    a row of 'side' (* 0.1), which no other table moves."""
    rng = np.random.default_rng(seed)
    scales = {"small": 0.01, "medium": 0.1, "large": 1.0}
    module = tf.Module()
    var = {name: tf.Variable((rng.standard_normal((rows, dim)) * s).astype(np.float32),
                             name=name) for name, s in scales.items()}
    var["side"] = tf.Variable(_table(rng, rows + 5, dim), name="side")
    module.tables = var

    @tf.function(input_signature=[_spec([None], tf.int64, "ids")])
    def serve(ids):
        return {"mixed": tf.add_n([tf.nn.embedding_lookup(var[n], ids) for n in scales])}

    @tf.function(input_signature=[_spec([None], tf.int64, "side_ids")])
    def side(side_ids):
        return {"side": tf.nn.embedding_lookup(var["side"], side_ids)}

    module.serve, module.side = serve, side
    _save_module(module, export_dir, {"serving_default": serve, "side": side})
    return BuiltModel(
        export_dir, {**{n: (rows, dim) for n in scales}, "side": (rows + 5, dim)},
        {"serving_default": {"ids": _ids(rng, rows)},
         "side": {"side_ids": _ids(rng, rows + 5)}})


def build_module_product(export_dir, rows=40, dim=6, seed=0):
    """Two tables whose column 1 is 0 in every row (the others in [-1, 1],
    -1 and 1 in each row), and one output, `a[ids, 1] * b[ids, 1]`. Either
    table compressed alone changes nothing (its column times the other's
    zeros), both compressed do (int4 does not store 0 exactly in rows
    spanning [-1, 1], int8 does): effects that do not add, for the proof of
    `--dtype auto`."""
    rng = np.random.default_rng(seed)
    module = tf.Module()

    def table():
        t = rng.uniform(-1, 1, (rows, dim)).astype(np.float32)
        t[:, 0], t[:, 2], t[:, 1] = -1.0, 1.0, 0.0
        return t
    module.a = tf.Variable(table(), name="a")
    module.b = tf.Variable(table(), name="b")

    @tf.function(input_signature=[_spec([None], tf.int64, "ids")])
    def serve(ids):
        return {"product": tf.nn.embedding_lookup(module.a, ids)[:, 1]
                * tf.nn.embedding_lookup(module.b, ids)[:, 1]}

    module.serve = serve
    _save_module(module, export_dir, {"serving_default": serve})
    return BuiltModel(export_dir, {"a": (rows, dim), "b": (rows, dim)},
                      {"serving_default": {"ids": _ids(rng, rows)}})


# ---------------------------------------------------------------- refusals --

def _single_table_model(export_dir, table, body, inputs, refusal):
    """Saves a tf.Module holding `table` as variable 'emb', serving
    `body(variable, *inputs)` as 'serving_default'; `inputs` maps input
    name -> example array (its dtype and rank give the input spec)."""
    module = tf.Module()
    module.emb = tf.Variable(table, name="emb")
    specs = [_spec([None] * a.ndim, tf.as_dtype(a.dtype), k)
             for k, a in inputs.items()]
    fn = tf.function(lambda *args: body(module.emb, *args),
                     input_signature=specs)
    module.serve = fn
    _save_module(module, export_dir, {"serving_default": fn})
    return BuiltModel(export_dir, {"emb": table.shape},
                      {"serving_default": dict(inputs)}, refusal)


def build_refuse_nan(export_dir, rows=50, dim=8, seed=0):
    """A plain lookup of a table with a NaN in a row the example avoids."""
    rng = np.random.default_rng(seed)
    table = _table(rng, rows, dim)
    table[rows // 2, 1] = np.nan
    ids = _ids(rng, rows)
    ids[ids == rows // 2] = 1
    return _single_table_model(
        export_dir, table,
        lambda t, ids: {"emb": tf.nn.embedding_lookup(t, ids)},
        {"ids": ids}, "NaN")


def build_refuse_fp16_overflow(export_dir, rows=50, dim=8, seed=0):
    """A plain lookup of a table holding 1e6 (beyond fp16's 65504): refused
    for fp16 only; int8 converts it."""
    rng = np.random.default_rng(seed)
    table = _table(rng, rows, dim)
    table[1, 0] = 1e6
    return _single_table_model(
        export_dir, table,
        lambda t, ids: {"emb": tf.nn.embedding_lookup(t, ids)},
        {"ids": _ids(rng, rows)}, "65504")


def build_refuse_while(export_dir, rows=50, dim=8, seed=0):
    """The table is gathered inside a `tf.while_loop` body summing a bag."""
    rng = np.random.default_rng(seed)

    def body(t, ids):
        def step(i, acc):
            return i + 1, acc + tf.gather(t, ids[:, i])
        _, total = tf.while_loop(
            lambda i, acc: i < tf.shape(ids)[1], step,
            (tf.constant(0), tf.zeros([tf.shape(ids)[0], dim])))
        return {"sum": total}

    return _single_table_model(
        export_dir, _table(rng, rows, dim), body,
        {"ids": _bags(rng, rows, full=True)}, "While")


def build_refuse_gather_axis(export_dir, rows=50, dim=8, seed=0):
    """Columns of the table are selected with `tf.gather(t, cols, axis=1)`
    before the rows are looked up."""
    rng = np.random.default_rng(seed)
    cols = [0, dim - 1, dim // 2]
    return _single_table_model(
        export_dir, _table(rng, rows, dim),
        lambda t, ids: {"emb": tf.gather(tf.gather(t, cols, axis=1), ids)},
        {"ids": _ids(rng, rows)}, "axis")


def build_refuse_batch_dims(export_dir, rows=50, dim=8, seed=0):
    """`tf.gather(t, picks, batch_dims=1)` picks one column per table row
    (picks are [rows, 1]), then ids select rows of that and of the table."""
    rng = np.random.default_rng(seed)

    def body(t, ids):
        picks = tf.math.floormod(tf.range(rows), dim)[:, None]
        per_row = tf.gather(t, picks, batch_dims=1)
        return {"emb": tf.gather(t, ids) * tf.gather(per_row, ids)}

    return _single_table_model(
        export_dir, _table(rng, rows, dim), body,
        {"ids": _ids(rng, rows)}, "batch_dims")


def build_refuse_tied(export_dir, rows=50, dim=8, seed=0):
    """Tied embeddings: the looked-up rows are scored against the whole
    table with `tf.matmul(h, table, transpose_b=True)`."""
    rng = np.random.default_rng(seed)

    def body(t, ids):
        h = tf.nn.embedding_lookup(t, ids)
        return {"logits": tf.matmul(h, t, transpose_b=True)}

    return _single_table_model(
        export_dir, _table(rng, rows, dim), body,
        {"ids": _ids(rng, rows)}, "MatMul")


def _sharded_model(export_dir, rows, dim, seed, pre_trace):
    """A tf.Module holding a 4-shard `ShardedVariable` 'emb' (shards
    'emb/part_i') looked up with `tf.nn.embedding_lookup`."""
    rng = np.random.default_rng(seed)
    shards = np.array_split(_table(rng, rows, dim), 4)
    module = tf.Module()
    module.emb = ShardedVariable(
        [tf.Variable(s, name=f"emb/part_{i}") for i, s in enumerate(shards)],
        name="emb")
    fn = tf.function(
        lambda ids: {"emb": tf.nn.embedding_lookup(module.emb, ids)},
        input_signature=[_spec([None], tf.int64, "ids")])
    signature = fn.get_concrete_function() if pre_trace else fn
    tf.saved_model.save(module, export_dir, signatures=signature)
    return BuiltModel(export_dir, {"emb": (rows, dim)},
                      {"serving_default": {"ids": _ids(rng, rows)}},
                      "ShardedVariable" if pre_trace else None)


def build_refuse_sharded_broken(export_dir, rows=50, dim=8, seed=0):
    """A concrete function traced before saving captures the 4 shard
    handles; the SavedModel stores the ShardedVariable as ONE full 'emb'
    variable that all 4 captures resolve to, so the saved div-partitioned
    lookup (DynamicPartition -> 4 ResourceGather of shard-local ids ->
    ParallelDynamicStitch) reads the wrong rows: loads and runs, but its
    outputs are wrong for ids beyond the first shard."""
    return _sharded_model(export_dir, rows, dim, seed, pre_trace=True)


def build_sharded_ok(export_dir, rows=50, dim=8, seed=0):
    """As `refuse_sharded_broken` but passing the tf.function itself: it is
    traced while saving, where the ShardedVariable stands for one full
    variable, so the saved graph is a single ResourceGather on 'emb'
    [rows, dim] and outputs are correct."""
    return _sharded_model(export_dir, rows, dim, seed, pre_trace=False)


BUILDERS = {
    "keras_export": build_keras_export,
    "keras_saved_model_save": build_keras_saved_model_save,
    "module_lookups": build_module_lookups,
    "module_hash_table": build_module_hash_table,
    "tf1_ref_partitioned_div": build_tf1_ref_partitioned_div,
    "tf1_ref_partitioned_mod": build_tf1_ref_partitioned_mod,
    "tf1_resource_partitioned_div": build_tf1_resource_partitioned_div,
    "tf1_feature_columns_partitioned": build_tf1_feature_columns_partitioned,
    "tf1_resource_plain": build_tf1_resource_plain,
    "tf1_feature_columns_ref": build_tf1_feature_columns_ref,
    "tf1_feature_columns_resource": build_tf1_feature_columns_resource,
    "refuse_nan": build_refuse_nan,
    "refuse_fp16_overflow": build_refuse_fp16_overflow,
    "refuse_while": build_refuse_while,
    "refuse_gather_axis": build_refuse_gather_axis,
    "refuse_batch_dims": build_refuse_batch_dims,
    "refuse_tied": build_refuse_tied,
    "refuse_sharded_broken": build_refuse_sharded_broken,
    "sharded_ok": build_sharded_ok,
}

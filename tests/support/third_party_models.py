"""Small SavedModels built with real recommender libraries, for trying the
export tool on models it was not written against.

    python tests/support/third_party_models.py KIND EXPORT_DIR

builds model KIND, trains it for a step or two on random data, saves it as a
SavedModel with a `serving_default` signature at EXPORT_DIR (which must not
exist yet) and prints one JSON line to stdout:

    {"tables": {variable_name: [rows, dim], ...}}

naming every embedding table the saved model holds, by the name TensorFlow
gives its variable (without ':0'). Everything else the libraries print goes
to stderr. `python tests/support/third_party_models.py --list` prints the
kinds.

The libraries are test-only and not dependencies of the package. They are
installed next to the system TensorFlow without letting pip pull another
TensorFlow or Keras:

    python3 -m pip install --no-deps tf-keras==2.21.0 \
        tensorflow-recommenders==0.7.7 deepctr==0.9.4 keras-rs==0.4.0

Keras 2 libraries (TFRS, DeepCTR, feature columns through DenseFeatures) run
on tf-keras: for those kinds `TF_USE_LEGACY_KERAS=1` is set before TensorFlow
is imported, which is why the kind is read from `sys.argv` first and every
builder imports its libraries itself. The Keras 3 kinds clear the variable.
"""
import json
import os
import sys

ROWS = 1000      # rows of the tables, where the library lets us choose
BATCH = 8
BAG = 4          # length of padded bags / behaviour sequences
SEED = 1234

# Kinds whose library is Keras 2 (tf-keras); all others use Keras 3.
LEGACY_KERAS_KINDS = frozenset({
    "tfrs_dcn_ranking", "tfrs_two_tower_retrieval",
    "deepctr_deepfm", "deepctr_dcn", "deepctr_din",
    "tf2_dense_features",
})


def configure_environment(kind):
    """Sets the environment KIND needs; call before TensorFlow is imported."""
    if "tensorflow" in sys.modules:
        raise RuntimeError("configure_environment must run before tensorflow is "
                           "imported (TF_USE_LEGACY_KERAS is read at import)")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if kind in LEGACY_KERAS_KINDS:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)


# ---------------------------------------------------------------- helpers --

def _rng():
    import numpy as np
    return np.random.default_rng(SEED)


def _vocab(prefix, n=ROWS):
    return [f"{prefix}{i}" for i in range(n)]


def _variable_name(variable):
    """The name TF gives a variable, without ':0' (a Keras 3 variable is
    named through the tf.Variable it wraps)."""
    tf_variable = getattr(variable, "_value", variable)
    return tf_variable.name.split(":")[0]


def _tables_of(variables):
    """{name: [rows, dim]} of the given (embedding) variables."""
    tables = {}
    for v in variables:
        shape = [int(d) for d in v.shape]
        if len(shape) != 2:
            raise RuntimeError(f"{_variable_name(v)} is not a table: shape {shape}")
        tables[_variable_name(v)] = shape
    return tables


def _embedding_layers(model, embedding_class):
    """The table variables of every `embedding_class` layer reachable from
    `model` (a table reached twice is listed once)."""
    seen, variables = set(), []
    layers = [model] + list(getattr(model, "_flatten_layers", lambda **_: [])(
        include_self=False, recursive=True))
    for layer in layers:
        if isinstance(layer, embedding_class) and id(layer.embeddings) not in seen:
            seen.add(id(layer.embeddings))
            variables.append(layer.embeddings)
    return variables


def _embedding_tables(model, embedding_class):
    """{name: [rows, dim]} of the tables of `model`'s `embedding_class` layers."""
    return _tables_of(_embedding_layers(model, embedding_class))


def _quiet_deepctr_import():
    """Imports deepctr without its import-time version check, which starts a
    thread that requests pypi.python.org and prints to stdout when offline."""
    import requests

    class _NoResponse:
        status_code = 0  # not requests.codes.ok: the check does nothing

    real_get = requests.get
    requests.get = lambda *args, **kwargs: _NoResponse()
    try:
        import deepctr  # noqa: F401 - starts the check
        import threading
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(timeout=10)
    finally:
        requests.get = real_get


# ------------------------------------------------------------------- TFRS --

def build_tfrs_dcn_ranking(export_dir):
    """TensorFlow Recommenders DCN ranking model: string user ids through a
    StringLookup and int64 movie ids through an IntegerLookup, each into an
    Embedding (dim 8); the concatenation goes through tfrs.layers.dcn.Cross,
    a Dense ReLU layer and a Dense rating head, trained with tfrs.tasks.Ranking
    (MSE) for 2 steps. Saved with tf.saved_model.save and a tf.function
    serving signature {user_id: string [None], movie_id: int64 [None]} ->
    {rating: float [None, 1]}."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_recommenders as tfrs

    keras = tf.keras  # tf-keras under TF_USE_LEGACY_KERAS=1
    users = _vocab("user_")
    movies = np.arange(1, 1500 + 1, dtype=np.int64) * 7

    class DCNRanking(tfrs.models.Model):
        def __init__(self):
            super().__init__()
            self.user_lookup = keras.layers.StringLookup(vocabulary=users,
                                                         name="user_lookup")
            self.user_embedding = keras.layers.Embedding(
                len(users) + 1, 8, name="user_embedding")
            self.movie_lookup = keras.layers.IntegerLookup(vocabulary=movies,
                                                           name="movie_lookup")
            self.movie_embedding = keras.layers.Embedding(
                len(movies) + 1, 8, name="movie_embedding")
            self.cross = tfrs.layers.dcn.Cross(name="cross")
            self.deep = keras.layers.Dense(16, activation="relu", name="deep")
            self.head = keras.layers.Dense(1, name="rating")
            self.task = tfrs.tasks.Ranking(loss=keras.losses.MeanSquaredError())

        def call(self, features):
            user = self.user_embedding(self.user_lookup(features["user_id"]))
            movie = self.movie_embedding(self.movie_lookup(features["movie_id"]))
            x0 = tf.concat([user, movie], axis=1)
            return self.head(self.deep(self.cross(x0)))

        def compute_loss(self, features, training=False):
            return self.task(labels=features["rating"], predictions=self(features))

    rng = _rng()
    n = 2 * BATCH
    data = {
        "user_id": np.array(rng.choice(users + ["unknown_user"], n)),
        "movie_id": rng.choice(np.append(movies, 3), n).astype(np.int64),
        "rating": rng.uniform(1, 5, (n, 1)).astype(np.float32),
    }
    model = DCNRanking()
    model.compile(optimizer=keras.optimizers.Adagrad(0.1))
    model.fit(tf.data.Dataset.from_tensor_slices(data).batch(BATCH), epochs=1,
              verbose=0)

    @tf.function(input_signature=[{
        "user_id": tf.TensorSpec([None], tf.string, name="user_id"),
        "movie_id": tf.TensorSpec([None], tf.int64, name="movie_id")}])
    def serve(features):
        return {"rating": model(features)}

    tf.saved_model.save(model, export_dir, signatures={"serving_default": serve})
    return _tables_of([model.user_embedding.embeddings,
                       model.movie_embedding.embeddings])


def build_tfrs_two_tower_retrieval(export_dir):
    """TensorFlow Recommenders two-tower retrieval: a user tower (StringLookup
    -> Embedding(1001, 8)) and a movie tower (StringLookup -> Embedding(1501,
    8)) trained with tfrs.tasks.Retrieval for 2 steps; then a
    tfrs.layers.factorized_top_k.BruteForce index (k=10) over the user tower,
    indexed with the movie tower's embeddings of all movies and their string
    ids. Saved with tf.saved_model.save of the index and a serving signature
    {user_id: string [None]} -> {scores: float [None, 10], movie_ids: string
    [None, 10]}. Only the user table is in the saved model: the movie tower
    is not, its embeddings live on as the index's `candidates` variable (read
    by a MatMul, not a lookup)."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_recommenders as tfrs

    keras = tf.keras
    users = _vocab("user_")
    movies = _vocab("movie_", 1500)

    user_model = keras.Sequential([
        keras.layers.StringLookup(vocabulary=users, name="user_lookup"),
        keras.layers.Embedding(len(users) + 1, 8, name="user_embedding"),
    ], name="user_model")
    movie_model = keras.Sequential([
        keras.layers.StringLookup(vocabulary=movies, name="movie_lookup"),
        keras.layers.Embedding(len(movies) + 1, 8, name="movie_embedding"),
    ], name="movie_model")

    class TwoTower(tfrs.models.Model):
        def __init__(self):
            super().__init__()
            self.user_model, self.movie_model = user_model, movie_model
            self.task = tfrs.tasks.Retrieval()  # no top-k metrics: fast steps

        def compute_loss(self, features, training=False):
            return self.task(self.user_model(features["user_id"]),
                             self.movie_model(features["movie_id"]))

    rng = _rng()
    n = 2 * BATCH
    data = {"user_id": np.array(rng.choice(users, n)),
            "movie_id": np.array(rng.choice(movies, n))}
    model = TwoTower()
    model.compile(optimizer=keras.optimizers.Adagrad(0.1))
    model.fit(tf.data.Dataset.from_tensor_slices(data).batch(BATCH), epochs=1,
              verbose=0)

    index = tfrs.layers.factorized_top_k.BruteForce(user_model, k=10, name="index")
    movie_ids = tf.constant(movies)
    index.index(movie_model(movie_ids), movie_ids)
    index(tf.constant(["user_1"]))  # builds it

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="user_id")])
    def serve(user_id):
        scores, ids = index(user_id)
        return {"scores": scores, "movie_ids": ids}

    tf.saved_model.save(index, export_dir, signatures={"serving_default": serve})
    return _tables_of([user_model.layers[1].embeddings])


# ---------------------------------------------------------------- DeepCTR --

def _deepctr_data(feature_columns, rng, n):
    """Random inputs for DeepCTR's `Input`s: ids in range (0 is padding of a
    behaviour sequence), lengths in 1..BAG, floats for dense features."""
    import numpy as np
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

    data = {}
    for fc in feature_columns:
        if isinstance(fc, SparseFeat):
            data[fc.name] = rng.integers(0, fc.vocabulary_size, n).astype(np.int32)
        elif isinstance(fc, VarLenSparseFeat):
            lengths = rng.integers(1, fc.maxlen + 1, n)
            ids = rng.integers(1, fc.vocabulary_size, (n, fc.maxlen))
            ids[np.arange(fc.maxlen)[None, :] >= lengths[:, None]] = 0
            data[fc.name] = ids.astype(np.int32)
            if fc.length_name:
                data[fc.length_name] = lengths.astype(np.int32)
        elif isinstance(fc, DenseFeat):
            data[fc.name] = rng.standard_normal((n, fc.dimension)).astype(np.float32)
    return data


def _deepctr_save(model, feature_columns, export_dir):
    """Trains 2 steps of BATCH, then tf.saved_model.save of the functional
    tf-keras model: its `serving_default` is the model's call on its named
    Inputs (DeepCTR builds them with shape [None, 1] or [None, maxlen])."""
    import numpy as np
    import tensorflow as tf

    rng = _rng()
    data = _deepctr_data(feature_columns, rng, 2 * BATCH)
    data = {name: data[name] for name in model.input_names}
    labels = rng.integers(0, 2, (2 * BATCH, 1)).astype(np.float32)
    model.compile("adam", "binary_crossentropy")
    model.fit(data, labels, batch_size=BATCH, epochs=1, verbose=0)
    tables = _embedding_layers(model, tf.keras.layers.Embedding)
    for table in tables:
        # DeepCTR initializes tables with stddev 1e-4, which would make any
        # quantization error invisible in the outputs: give them weights of
        # a trained model's magnitude.
        table.assign(rng.normal(0.0, 0.1, table.shape).astype(np.float32))
    tf.saved_model.save(model, export_dir)
    return _tables_of(tables)


def _deepctr_ctr_features():
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

    return [
        SparseFeat("user_id", vocabulary_size=ROWS, embedding_dim=8),
        SparseFeat("item_id", vocabulary_size=1500, embedding_dim=8),
        SparseFeat("category", vocabulary_size=ROWS, embedding_dim=8),
        VarLenSparseFeat(SparseFeat("genres", vocabulary_size=ROWS, embedding_dim=8),
                         maxlen=BAG, combiner="mean"),
        DenseFeat("age", 1),
    ]


def build_deepctr_deepfm(export_dir):
    """DeepCTR DeepFM (binary): SparseFeat user_id (1000), item_id (1500),
    category (1000), a VarLenSparseFeat genres bag (1000 rows, maxlen 4,
    mean combiner, 0-padded) and a DenseFeat age, each sparse feature with a
    dim-8 table for FM/DNN and a dim-1 table for the linear part."""
    _quiet_deepctr_import()
    from deepctr.models import DeepFM

    features = _deepctr_ctr_features()
    model = DeepFM(features, features, dnn_hidden_units=(16, 16), task="binary",
                   seed=SEED)
    return _deepctr_save(model, features, export_dir)


def build_deepctr_dcn(export_dir):
    """DeepCTR DCN (binary, 2 vector cross layers): the DeepFM kind's features
    (user_id, item_id, category, a genres bag, age), dim-8 tables for the
    cross/DNN part and dim-1 tables for the linear part."""
    _quiet_deepctr_import()
    from deepctr.models import DCN

    features = _deepctr_ctr_features()
    model = DCN(features, features, cross_num=2, dnn_hidden_units=(16, 16),
                task="binary", seed=SEED)
    return _deepctr_save(model, features, export_dir)


def build_deepctr_din(export_dir):
    """DeepCTR DIN: SparseFeat user (1000, dim 8), gender (2, dim 4), item_id
    (1501, dim 8), cate_id (1001, dim 4), DenseFeat pay_score, and the
    behaviour sequences hist_item_id / hist_cate_id (maxlen 4, 0-padded,
    length input seq_length) sharing the item_id / cate_id tables
    (embedding_name), pooled by DIN's attention over the candidate item."""
    _quiet_deepctr_import()
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat
    from deepctr.models import DIN

    features = [
        SparseFeat("user", ROWS, embedding_dim=8),
        SparseFeat("gender", 2, embedding_dim=4),
        SparseFeat("item_id", 1500 + 1, embedding_dim=8),
        SparseFeat("cate_id", ROWS + 1, embedding_dim=4),
        DenseFeat("pay_score", 1),
        VarLenSparseFeat(SparseFeat("hist_item_id", 1500 + 1, embedding_dim=8,
                                    embedding_name="item_id"),
                         maxlen=BAG, length_name="seq_length"),
        VarLenSparseFeat(SparseFeat("hist_cate_id", ROWS + 1, embedding_dim=4,
                                    embedding_name="cate_id"),
                         maxlen=BAG, length_name="seq_length"),
    ]
    model = DIN(features, ["item_id", "cate_id"], dnn_hidden_units=(16, 8),
                att_hidden_size=(16, 8), seed=SEED)
    return _deepctr_save(model, features, export_dir)


# --------------------------------------------------------------- Keras 3 --

def build_keras_rs_dlrm(export_dir):
    """DLRM-style Keras 3 model with keras-rs layers: 4 dense features through
    a bottom MLP to dim 8; three int32 ids into keras.layers.Embedding tables
    (1000, 1200 and 1500 rows, dim 8); keras_rs.layers.DotInteraction over the
    four dim-8 vectors, concatenated with the bottom output, then
    keras_rs.layers.FeatureCross and a top MLP with a sigmoid. Trained 2 steps,
    exported with model.export (serving_default)."""
    import keras
    import keras_rs
    import numpy as np

    sizes = {"user_id": ROWS, "item_id": 1200, "ad_id": 1500}
    dense_in = keras.Input((4,), name="dense_features")
    id_inputs = {k: keras.Input((), dtype="int32", name=k) for k in sizes}
    bottom = keras.layers.Dense(8, activation="relu", name="bottom")(dense_in)
    embeddings = [keras.layers.Embedding(rows, 8, name=f"{k}_embedding")(id_inputs[k])
                  for k, rows in sizes.items()]
    interactions = keras_rs.layers.DotInteraction(name="dot_interaction")(
        [bottom] + embeddings)
    x = keras.layers.Concatenate(name="concat")([bottom, interactions])
    x = keras_rs.layers.FeatureCross(name="feature_cross")(x)
    x = keras.layers.Dense(16, activation="relu", name="top")(x)
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(x)
    model = keras.Model({"dense_features": dense_in, **id_inputs}, out, name="dlrm")

    rng = _rng()
    n = 2 * BATCH
    data = {"dense_features": rng.standard_normal((n, 4)).astype(np.float32)}
    data.update({k: rng.integers(0, rows, n).astype(np.int32)
                 for k, rows in sizes.items()})
    model.compile("adam", "binary_crossentropy")
    model.fit(data, rng.integers(0, 2, (n, 1)).astype(np.float32),
              batch_size=BATCH, epochs=1, verbose=0)
    model.export(export_dir, verbose=False)
    return _embedding_tables(model, keras.layers.Embedding)


def build_keras3_string_lookup(export_dir):
    """Plain Keras 3 next-item model. Input `history`: string [None, 4], bags
    of item ids padded with "" (the StringLookup mask token: "" -> 0, unknown
    -> 1) into Embedding(1002, 8, mask_zero=True) and a masked
    GlobalAveragePooling1D; input `candidate`: string [None] into a second
    StringLookup and the tied table `item_table` (Embedding(1001, 8)), which
    is both a lookup (the candidate's embedding) and the output projection
    (logits = user_vector @ item_table^T, a MatMul of the whole table).
    Outputs {"logits": [None, 1001], "score": [None, 1]}. Trained 2 steps,
    exported with model.export (serving_default)."""
    import keras
    import numpy as np
    import tensorflow as tf
    from keras import ops

    items = _vocab("item_")

    class TiedProjection(keras.layers.Layer):
        """logits = x @ embedding.embeddings^T (weights tied to `embedding`)."""

        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def call(self, x):
            return ops.matmul(x, ops.transpose(self.embedding.embeddings))

    history = keras.Input((BAG,), dtype="string", name="history")
    candidate = keras.Input((), dtype="string", name="candidate")
    history_ids = keras.layers.StringLookup(vocabulary=items, mask_token="",
                                            name="history_lookup")(history)
    bag = keras.layers.Embedding(len(items) + 2, 8, mask_zero=True,
                                 name="history_embedding")(history_ids)
    user = keras.layers.GlobalAveragePooling1D(name="bag_mean")(bag)
    user = keras.layers.Dense(8, name="user_tower")(user)
    item_table = keras.layers.Embedding(len(items) + 1, 8, name="item_table")
    candidate_ids = keras.layers.StringLookup(vocabulary=items,
                                              name="candidate_lookup")(candidate)
    candidate_vec = item_table(candidate_ids)
    score = keras.layers.Dense(1, name="score")(
        keras.layers.Concatenate()([user, candidate_vec]))
    logits = TiedProjection(item_table, name="tied_projection")(user)
    model = keras.Model({"history": history, "candidate": candidate},
                        {"logits": logits, "score": score}, name="string_lookup")

    rng = _rng()
    n = 2 * BATCH
    hist = np.array(rng.choice(items, (n, BAG)), dtype=object)
    lengths = rng.integers(1, BAG + 1, n)
    hist[np.arange(BAG)[None, :] >= lengths[:, None]] = ""
    data = {"history": hist.astype(bytes),
            "candidate": np.array(rng.choice(items, n)).astype(bytes)}
    targets = {"logits": rng.integers(0, len(items) + 1, n),
               "score": rng.integers(0, 2, (n, 1)).astype(np.float32)}
    model.compile("adam", {"logits": keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), "score": "mse"})
    # Keras 3's array adapter refuses numpy string arrays; tf.data takes them.
    model.fit(tf.data.Dataset.from_tensor_slices((data, targets)).batch(BATCH),
              epochs=1, verbose=0)
    model.export(export_dir, verbose=False)
    return _embedding_tables(model, keras.layers.Embedding)


# -------------------------------------------------------- feature columns --

def build_tf2_dense_features(export_dir):
    """TF2 feature columns through tf-keras' DenseFeatures layer: an
    embedding_column (dim 8, mean) over categorical_column_with_vocabulary_list
    `country` (1000 strings + 1 OOV bucket: 1001 rows), and
    tf.feature_column.shared_embeddings (dim 8, mean) over two
    vocabulary-list columns `query` and `clicked` (the same 1000 strings:
    one shared 1000-row table), fed as string bags [None, 4] padded with "",
    plus a numeric column `price`; then Dense layers. Trained 2 steps; saved
    with tf.saved_model.save and a serving signature {country [None, 1],
    query [None, 4], clicked [None, 4]: string, price [None, 1]: float} ->
    {ctr: [None, 1]}.

    TF refuses to create shared embedding columns under eager execution
    (`RuntimeError: shared_embedding_columns are not supported when eager
    execution is enabled.`), so they are created inside a throwaway
    tf.Graph (the columns are plain Python objects; no op is made there).
    Their table is made on the layer's first call by the columns'
    SharedEmbeddingColumnCreator (`get_variable`), which tracks it, so it is
    saved; but Keras does not list it among the model's weights, so fit
    leaves it at its initial values (truncated normal, stddev 1/sqrt(8))."""
    import numpy as np
    import tensorflow as tf

    fc = tf.feature_column
    keras = tf.keras
    words = _vocab("w_")
    countries = _vocab("c_")
    country = fc.categorical_column_with_vocabulary_list(
        "country", countries, num_oov_buckets=1)
    query = fc.categorical_column_with_vocabulary_list("query", words)
    clicked = fc.categorical_column_with_vocabulary_list("clicked", words)
    with tf.Graph().as_default():  # see the docstring
        shared = fc.shared_embeddings([query, clicked], 8, combiner="mean")
    columns = [fc.embedding_column(country, 8, combiner="mean"), *shared,
               fc.numeric_column("price")]
    dense_features = keras.layers.DenseFeatures(columns, name="features")

    inputs = {
        "country": keras.Input((1,), dtype=tf.string, name="country"),
        "query": keras.Input((BAG,), dtype=tf.string, name="query"),
        "clicked": keras.Input((BAG,), dtype=tf.string, name="clicked"),
        "price": keras.Input((1,), dtype=tf.float32, name="price"),
    }
    x = dense_features(inputs)
    x = keras.layers.Dense(16, activation="relu", name="hidden")(x)
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(x)
    model = keras.Model(inputs, out)

    rng = _rng()
    n = 2 * BATCH

    def bags():
        b = np.array(rng.choice(words, (n, BAG)), dtype=object)
        lengths = rng.integers(1, BAG + 1, n)
        b[np.arange(BAG)[None, :] >= lengths[:, None]] = ""
        return b.astype(bytes)

    data = {"country": np.array(rng.choice(countries + ["xx"], (n, 1))).astype(bytes),
            "query": bags(), "clicked": bags(),
            "price": rng.uniform(0, 10, (n, 1)).astype(np.float32)}
    model.compile("adam", "binary_crossentropy")
    model.fit(data, rng.integers(0, 2, (n, 1)).astype(np.float32), batch_size=BATCH,
              epochs=1, verbose=0)

    @tf.function(input_signature=[{
        "country": tf.TensorSpec([None, 1], tf.string, name="country"),
        "query": tf.TensorSpec([None, BAG], tf.string, name="query"),
        "clicked": tf.TensorSpec([None, BAG], tf.string, name="clicked"),
        "price": tf.TensorSpec([None, 1], tf.float32, name="price")}])
    def serve(features):
        return {"ctr": model(features)}

    tf.saved_model.save(model, export_dir, signatures={"serving_default": serve})
    tables = [v for v in dense_features.variables
              if len(v.shape) == 2 and v.dtype == tf.float32]
    # The shared table, made by the creator (one per graph key; one here).
    creator = shared[0].shared_embedding_column_creator
    shared_tables = list(creator._embedding_weights.values())  # noqa: SLF001
    if len(shared_tables) != 1:
        raise RuntimeError(f"expected one shared embedding table, the creator made "
                           f"{len(shared_tables)}")
    return _tables_of(tables + shared_tables)


KINDS = {
    "tfrs_dcn_ranking": build_tfrs_dcn_ranking,
    "tfrs_two_tower_retrieval": build_tfrs_two_tower_retrieval,
    "deepctr_deepfm": build_deepctr_deepfm,
    "deepctr_dcn": build_deepctr_dcn,
    "deepctr_din": build_deepctr_din,
    "keras_rs_dlrm": build_keras_rs_dlrm,
    "keras3_string_lookup": build_keras3_string_lookup,
    "tf2_dense_features": build_tf2_dense_features,
}


def main(argv):
    if len(argv) == 2 and argv[1] == "--list":
        for name, builder in KINDS.items():
            print(f"{name}: {builder.__doc__.splitlines()[0]}")
        return 0
    if len(argv) != 3 or argv[1] not in KINDS:
        print(f"usage: {argv[0]} KIND EXPORT_DIR  (KIND: {', '.join(KINDS)})",
              file=sys.stderr)
        return 2
    kind, export_dir = argv[1], argv[2]
    if os.path.exists(export_dir):
        print(f"{export_dir} exists; give a new directory", file=sys.stderr)
        return 2
    configure_environment(kind)
    # Libraries print to stdout (Keras' export summary, DeepCTR's version
    # check): send fd 1 to stderr while building, keep the real stdout for
    # the JSON line.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        tables = KINDS[kind](export_dir)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    print(json.dumps({"tables": tables}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""What verification runs on and how it compares: inputs generated valid for
the graph (table keys, ragged and sparse components), string inputs and
outputs, the user's examples (.npz with strings, TFRecord of PredictionLogs,
other integer widths), the source's own warmup requests, ranked ids that
trade places on near ties, and errors of a failing run quoted in full."""
import os

import numpy as np
import pytest
import tensorflow as tf

from export_tools import ExportError, compress_saved_model, warmup
from export_tools import input_generation
from export_tools import examples as examples_module
from export_tools.examples import load_examples
from export_tools.signature_rewrite import analyze
from export_tools.source import SourceModel

ROWS, DIM, K, CANDIDATES = 60, 8, 10, 512
VOCAB = [f"country_{i}" for i in range(ROWS - 1)]  # unknown -> row ROWS-1


def _spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


def build_string_model(path, seed=0):
    """country (string) -> StaticHashTable -> row of `countries`; item
    (int32) -> row of `items`; returns both rows concatenated."""
    rng = np.random.default_rng(seed)
    module = tf.Module()
    module.countries = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(
        np.float32), name="countries")
    module.items = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(
        np.float32), name="items")
    module.vocab = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(VOCAB), tf.range(ROWS - 1, dtype=tf.int64)),
        default_value=ROWS - 1)

    @tf.function(input_signature=[_spec([None], tf.string, "country"),
                                  _spec([None], tf.int32, "item")])
    def serve(country, item):
        rows = module.vocab.lookup(country)
        return {"out": tf.concat([tf.nn.embedding_lookup(module.countries, rows),
                                  tf.nn.embedding_lookup(module.items, item)], 1)}

    module.serve = serve
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return path


def string_feed(rng, batch=5):
    country = np.array([VOCAB[i] for i in rng.integers(0, ROWS - 1, batch)])
    country[-1] = "nowhere"  # unknown: the default row
    return {"country": country,
            "item": rng.integers(0, ROWS, batch).astype(np.int32)}


def build_ranking_model(path, with_scores, seed=0):
    """user (int64) -> a row of `users` (the compressed table) -> dot with
    CANDIDATES FP32 candidates -> top-K names (strings), with their scores if
    `with_scores`. With that many candidates, adjacent scores are closer than
    int8's error on the user row moves them, so compressing the users table
    reorders some."""
    rng = np.random.default_rng(seed)
    module = tf.Module()
    module.users = tf.Variable(rng.standard_normal((ROWS, DIM)).astype(
        np.float32), name="users")
    candidates = tf.constant(rng.standard_normal((CANDIDATES, DIM)).astype(
        np.float32))
    names = tf.constant([f"cand_{i}" for i in range(CANDIDATES)])

    @tf.function(input_signature=[_spec([None], tf.int64, "user")])
    def serve(user):
        query = tf.nn.embedding_lookup(module.users, user)
        scores, top = tf.math.top_k(tf.matmul(query, candidates,
                                              transpose_b=True), k=K)
        out = {"names": tf.gather(names, top)}
        if with_scores:
            out["scores"] = scores
        return out

    module.serve = serve
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return path


def run_saved_model(path, feed, load_ops):
    if load_ops:
        import tf_compressed_embedding  # noqa: F401
    model = tf.saved_model.load(path)
    out = model.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in feed.items()})
    return {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def string_model(tmp_path_factory):
    return build_string_model(str(tmp_path_factory.mktemp("m") / "src"))


def _assert_matches_source(src, dst, feed):
    want = run_saved_model(src, feed, False)
    got = run_saved_model(dst, feed, True)
    np.testing.assert_allclose(got["out"], want["out"], atol=0.05)
    assert not np.array_equal(got["out"], want["out"])  # int8 really changed it


# -- string inputs ---------------------------------------------------------

@pytest.mark.parametrize("as_object", [False, True], ids=["str", "object"])
def test_npz_examples_with_strings(string_model, tmp_path, as_object):
    feed = string_feed(np.random.default_rng(1))
    stored = dict(feed, country=feed["country"].astype(object) if as_object
                  else feed["country"])
    np.savez(tmp_path / "ex.npz",
             **{f"serving_default/{k}": v for k, v in stored.items()})
    examples = load_examples(str(tmp_path / "ex.npz"))
    report = compress_saved_model(string_model, str(tmp_path / "dst"),
                                  dtype="int8", min_rows=1, examples=examples, isolate=False)
    assert report.verified and report.verification["serving_default"]["out"] > 0
    _assert_matches_source(string_model, str(tmp_path / "dst"), feed)


def test_object_npz_with_non_strings_is_refused(tmp_path):
    np.savez(tmp_path / "ex.npz", **{"serving_default/country": np.array(
        ["a", 3], dtype=object)})
    with pytest.raises(ExportError, match="object array holding other than str"):
        load_examples(str(tmp_path / "ex.npz"))


def _write_prediction_logs(path, requests):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature, feed in requests:
            writer.write(warmup.predict_log(signature, feed))


def test_prediction_log_examples(string_model, tmp_path):
    rng = np.random.default_rng(2)
    first, second = string_feed(rng), string_feed(rng, batch=3)
    _write_prediction_logs(tmp_path / "requests.tfrecord",
                           [("serving_default", first),
                            ("serving_default", second)])
    examples = load_examples(str(tmp_path / "requests.tfrecord"))
    assert list(examples) == ["serving_default"]
    assert [r["country"].tolist() for r in examples["serving_default"]] == [
        [s.encode() for s in f["country"]] for f in (first, second)]
    report = compress_saved_model(string_model, str(tmp_path / "dst"),
                                  dtype="fp16", min_rows=1, examples=examples, isolate=False)
    assert report.verified
    # Without a warmup file of its own, the source's requests become the output's.
    assert report.warmup_requests == 2


def test_prediction_log_examples_are_capped_per_signature(tmp_path):
    rng = np.random.default_rng(5)
    cap = examples_module.REQUESTS_PER_SIGNATURE
    _write_prediction_logs(tmp_path / "requests.tfrecord",
                           [("serving_default", string_feed(rng))] * (cap + 3)
                           + [("other", string_feed(rng))])
    examples = load_examples(str(tmp_path / "requests.tfrecord"))
    assert {k: len(v) for k, v in examples.items()} == {"serving_default": cap,
                                                        "other": 1}


def test_every_source_warmup_request_is_verified_on(tmp_path):
    """A request after the first that the source itself refuses (an item id
    past the table) stops the export, naming that request."""
    src = build_string_model(str(tmp_path / "src"))
    good = string_feed(np.random.default_rng(6))
    bad = dict(good, item=np.full_like(good["item"], ROWS + 5))
    os.makedirs(os.path.join(src, "assets.extra"))
    _write_prediction_logs(os.path.join(src, warmup.WARMUP_FILE),
                           [("serving_default", good)] * 2 + [("serving_default", bad)])
    with pytest.raises(ExportError, match=r"running .*src failed: signature "
                                          r"'serving_default' request 2: "
                                          r"InvalidArgumentError"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", min_rows=1, isolate=False)
    assert not os.path.exists(tmp_path / "dst")


def test_examples_file_of_another_format_is_refused(tmp_path):
    (tmp_path / "ex.csv").write_text("country,item\nx,1\n")
    with pytest.raises(ExportError, match="neither an .npz file nor a TFRecord"):
        load_examples(str(tmp_path / "ex.csv"))


def test_source_warmup_requests_are_verified_on_and_kept(tmp_path):
    src = build_string_model(str(tmp_path / "src"))
    feed = string_feed(np.random.default_rng(3))
    os.makedirs(os.path.join(src, "assets.extra"))
    source_warmup = os.path.join(src, warmup.WARMUP_FILE)
    _write_prediction_logs(source_warmup, [("serving_default", feed)] * 3)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, isolate=False)  # default options
    assert report.verified and report.warmup_requests == 3
    with open(source_warmup, "rb") as a, open(
            os.path.join(tmp_path / "dst", warmup.WARMUP_FILE), "rb") as b:
        assert a.read() == b.read()


def test_corrupt_source_warmup_file_is_named(tmp_path):
    src = build_string_model(str(tmp_path / "src"))
    os.makedirs(os.path.join(src, "assets.extra"))
    with open(os.path.join(src, warmup.WARMUP_FILE), "wb") as f:
        f.write(b"not a tfrecord at all, but long enough to have a header")
    with pytest.raises(ExportError, match="tf_serving_warmup_requests is not a "
                                          "TFRecord.*--examples"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", min_rows=1, isolate=False)


# -- examples checked against the signature --------------------------------

def test_wider_integer_examples_are_cast_when_lossless(string_model, tmp_path):
    feed = string_feed(np.random.default_rng(4))
    examples = {"serving_default": dict(feed, item=feed["item"].astype(np.int64))}
    report = compress_saved_model(string_model, str(tmp_path / "dst"),
                                  dtype="int8", min_rows=1, examples=examples, isolate=False)
    assert report.verified


@pytest.mark.parametrize("change, message", [
    (lambda f: dict(f, item=f["item"].astype(np.int64) + 2**40),
     "input 'item' is int64 and its values do not all fit int32"),
    (lambda f: dict(f, item=f["item"] + 0.5),
     "input 'item' is float64 and its values do not all fit int32"),
    (lambda f: dict(f, country=np.arange(5)),
     "input 'country' is int64; the signature wants strings"),
    (lambda f: dict(f, item=f["country"]),
     "input 'item' holds strings; the signature wants int32"),
    (lambda f: dict(f, item=f["item"].reshape(5, 1)),
     r"input 'item' has shape \[5, 1\]; the signature wants \(None,\)"),
    (lambda f: {"country": f["country"]},
     r"needs inputs \['item'\] it does not give"),
    (lambda f: dict(f, extra=f["item"]), r"has no inputs \['extra'\]"),
], ids=["too-wide", "fraction", "not-strings", "strings", "shape", "missing",
        "unknown"])
def test_examples_that_do_not_fit_the_signature_are_named(
        string_model, tmp_path, change, message):
    examples = {"serving_default": change(string_feed(np.random.default_rng(5)))}
    with pytest.raises(ExportError, match=message):
        compress_saved_model(string_model, str(tmp_path / "dst"), dtype="int8",
                             min_rows=1, examples=examples, isolate=False)
    assert not os.path.exists(tmp_path / "dst")


def test_examples_for_a_signature_not_exported(string_model, tmp_path):
    examples = {"serving_default": string_feed(np.random.default_rng(6)),
                "other": {}}
    with pytest.raises(ExportError, match=r"signatures \['other'\] are not exported"):
        compress_saved_model(string_model, str(tmp_path / "dst"), dtype="int8",
                             min_rows=1, examples=examples, isolate=False)


# -- outputs that are not floats -------------------------------------------

def _differing_names(src, dst, feed):
    want = run_saved_model(src, feed, False)
    got = run_saved_model(dst, feed, True)
    return int(np.count_nonzero(want["names"] != got["names"])), want, got


def test_ranked_names_with_scores_may_trade_places_on_near_ties(tmp_path):
    src = build_ranking_model(str(tmp_path / "src"), with_scores=True)
    feed = {"user": np.arange(ROWS, dtype=np.int64)}
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, examples={"serving_default": feed}, isolate=False)
    assert report.verified
    # Run both models here too: int8 does reorder near ties on this feed,
    # the tool counted exactly those, and the scores stay within the
    # tolerance at every rank.
    swapped, want, got = _differing_names(src, str(tmp_path / "dst"), feed)
    assert swapped > 0
    assert report.verification["serving_default"]["names"] == swapped
    assert np.abs(got["scores"] - want["scores"]).max() <= report.tolerance
    assert [w for w in report.warnings if "near ties trading places" in w
            and f"'names' (object): {swapped} of {ROWS * K} values" in w]


def test_ranked_names_without_scores_that_differ_are_refused(tmp_path):
    src = build_ranking_model(str(tmp_path / "src"), with_scores=False)
    user = np.arange(ROWS, dtype=np.int64)
    with pytest.raises(ExportError, match="output 'names' .* values differ from "
                                          "the source.*no scores of its shape"):
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                             min_rows=1, examples={"serving_default": {"user": user}},
                             isolate=False)


def test_string_outputs_that_agree_verify(tmp_path):
    src = build_ranking_model(str(tmp_path / "src"), with_scores=False)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="fp16",
                                  min_rows=1, ops="stock", isolate=False)
    assert report.verified
    assert report.verification["serving_default"]["names"] == 0


# -- a model that fails on the inputs ---------------------------------------

def test_a_failing_run_is_quoted_with_its_message(tmp_path):
    module = tf.Module()
    module.table = tf.Variable(np.ones((ROWS, DIM), np.float32), name="table")

    @tf.function(input_signature=[_spec([None], tf.int64, "ids"),
                                  _spec([None], tf.float32, "weight")])
    def serve(ids, weight):
        check = tf.debugging.assert_less(
            weight, -1.0, message="weights must be below -1 for this model")
        with tf.control_dependencies([check]):
            rows = tf.nn.embedding_lookup(module.table, ids)
        return {"out": rows * weight[:, None]}

    module.serve = serve
    src = str(tmp_path / "src")
    tf.saved_model.save(module, src, signatures={"serving_default": serve})
    with pytest.raises(ExportError) as raised:
        compress_saved_model(src, str(tmp_path / "dst"), dtype="int8", min_rows=1, isolate=False)
    message = str(raised.value)
    assert "signature 'serving_default': InvalidArgumentError" in message
    assert "weights must be below -1 for this model" in message
    assert "--examples" in message and "\n" not in message
    assert "most recent call last" not in message


def test_error_message_drops_the_build_stack_and_keeps_the_node():
    from export_tools.errors import tf_error_message

    class FakeOpError(Exception):
        message = ("Graph execution error:\n\nDetected at node lookup/Assert "
                   "defined at (most recent call last):\n  File \"model.py\", "
                   "line 3, in serve\n    rows = lookup(ids)\n\nindices[2] = 70 "
                   "is not in [0, 60)\n\t [[{{node lookup/Assert}}]]")

    assert tf_error_message(FakeOpError()) == (
        "indices[2] = 70 is not in [0, 60) [[{{node lookup/Assert}}]]")


# -- generated inputs, valid for the graph ----------------------------------

def generated_feed(src, signature="serving_default"):
    """The feed the tool generates for `signature` of `src` (no examples)."""
    source = SourceModel(src)
    analysis = analyze(source, signature, source.loaded.signatures[signature])
    return input_generation.generate_inputs(
        analysis, input_generation.id_bounds(analysis, {}),
        input_generation.table_keys(analysis),
        input_generation.composite_inputs(analysis))


def test_string_keys_are_drawn_from_the_loaded_table(string_model, tmp_path):
    feed = generated_feed(string_model)
    country = [c.decode() for c in feed["country"]]
    assert set(country) - set(VOCAB) == {input_generation.UNKNOWN_KEY}
    assert len(set(country) & set(VOCAB)) >= 2
    report = compress_saved_model(string_model, str(tmp_path / "dst"),
                                  dtype="int8", min_rows=1, isolate=False)  # default options
    assert report.verified


def _save(module, path, fn):
    module.serve = fn
    tf.saved_model.save(module, path, signatures={"serving_default": fn})
    return path


def _table_module(seed=0):
    module = tf.Module()
    module.table = tf.Variable(np.random.default_rng(seed).standard_normal(
        (ROWS, DIM)).astype(np.float32), name="table")
    return module


def _assert_valid_splits(splits, values, rows):
    assert splits[0] == 0 and splits[-1] == len(values) and len(splits) == rows + 1
    assert np.all(np.diff(splits) >= 0)
    assert 0 in np.diff(splits)  # an empty row is covered


def test_ragged_tensor_spec_argument(tmp_path):
    module = _table_module()

    @tf.function(input_signature=[tf.RaggedTensorSpec(
        [None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)])
    def serve(ids):
        rows = tf.nn.embedding_lookup(module.table, ids)
        return {"out": tf.reduce_mean(rows, axis=1)}

    src = _save(module, str(tmp_path / "src"), serve)
    feed = generated_feed(src)
    assert sorted(feed) == ["ids", "ids_1"]  # TF's flattened components
    _assert_valid_splits(feed["ids_1"], feed["ids"], input_generation.DEFAULT_BATCH)
    assert feed["ids"].min() >= 0 and feed["ids"].max() < ROWS
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, isolate=False)
    assert report.verified


@pytest.mark.parametrize("partition", ["row_splits", "row_lengths"])
def test_hand_written_values_and_row_partition(tmp_path, partition):
    module = _table_module()

    @tf.function(input_signature=[_spec([None], tf.int64, "tags_values"),
                                  _spec([None], tf.int32, f"tags_{partition}")])
    def serve(tags_values, partition_tensor):
        make = (tf.RaggedTensor.from_row_splits if partition == "row_splits"
                else tf.RaggedTensor.from_row_lengths)
        ids = make(tags_values, tf.cast(partition_tensor, tf.int64))  # validated
        return {"out": tf.nn.embedding_lookup_sparse(
            module.table, ids.to_sparse(), None, combiner="sum")}

    src = _save(module, str(tmp_path / "src"), serve)
    feed = generated_feed(src)
    part = feed[f"tags_{partition}"]
    assert part.dtype == np.int32
    splits = part if partition == "row_splits" else np.concatenate(
        [[0], np.cumsum(part)])
    _assert_valid_splits(splits, feed["tags_values"], input_generation.DEFAULT_BATCH)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="fp16",
                                  min_rows=1, isolate=False)
    assert report.verified


def test_sparse_tensor_spec_argument(tmp_path):
    module = _table_module()

    @tf.function(input_signature=[
        tf.SparseTensorSpec([None, None], tf.int64),
        tf.SparseTensorSpec([None, None], tf.float32)])
    def serve(ids, weights):
        return {"out": tf.nn.safe_embedding_lookup_sparse(
            module.table, ids, weights, combiner="mean")}

    src = _save(module, str(tmp_path / "src"), serve)
    feed = generated_feed(src)
    assert len(feed) == 6
    for indices, values, shape in (("ids", "ids_1", "ids_2"),
                                   ("weights", "weights_1", "weights_2")):
        cells = feed[indices]
        assert cells.shape == (len(feed[values]), 2)
        assert np.all(cells >= 0) and np.all(cells < feed[shape])
        flat = np.ravel_multi_index(cells.T, feed[shape])
        assert np.all(np.diff(flat) > 0)  # unique, row-major
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, isolate=False)
    assert report.verified


def test_hashed_string_input_gets_words(tmp_path):
    module = _table_module()

    @tf.function(input_signature=[_spec([None], tf.string, "query")])
    def serve(query):
        rows = tf.strings.to_hash_bucket_fast(query, ROWS)
        return {"out": tf.nn.embedding_lookup(module.table, rows)}

    src = _save(module, str(tmp_path / "src"), serve)
    assert generated_feed(src)["query"].dtype == object
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, isolate=False)
    assert report.verified


def test_serialized_examples_for_a_parse_example_signature(tmp_path):
    """The estimator-era signature: one string input of serialized
    tf.Examples, parsed by ParseExampleV2 into feature columns."""
    v1 = tf.compat.v1
    fc = v1.feature_column
    columns = [
        fc.embedding_column(fc.categorical_column_with_vocabulary_list(
            "country", VOCAB), DIM),
        fc.embedding_column(fc.categorical_column_with_identity("item", ROWS),
                            DIM, combiner="sum"),
        fc.numeric_column("age", shape=(2,))]
    spec = fc.make_parse_example_spec(columns)
    src = str(tmp_path / "src")
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, [None], name="examples")
        features = fc.input_layer(v1.parse_example(serialized, spec), columns)
        with v1.Session(graph=graph) as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            builder = v1.saved_model.Builder(src)
            builder.add_meta_graph_and_variables(
                sess, ["serve"], main_op=v1.tables_initializer(),
                signature_def_map={"serving_default": v1.saved_model.predict_signature_def(
                    {"inputs": serialized}, {"features": features})})
            builder.save()

    feed = generated_feed(src)
    parsed = tf.io.parse_example(feed["inputs"], spec)  # TF's own parser
    countries = [c.decode() for c in parsed["country"].values.numpy()]
    assert set(countries) <= set(VOCAB) | {input_generation.UNKNOWN_KEY}
    assert set(countries) & set(VOCAB)
    items = parsed["item"].values.numpy()
    assert items.size and items.min() >= 0 and items.max() < ROWS
    assert parsed["age"].shape == (input_generation.DEFAULT_BATCH, 2)
    report = compress_saved_model(src, str(tmp_path / "dst"), dtype="int8",
                                  min_rows=1, isolate=False)
    assert report.verified
    assert sorted(t.pooled_lookups for t in report.tables) == [1, 1]

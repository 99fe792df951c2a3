"""The cases TensorFlow's own tests of tf.nn.embedding_lookup /
embedding_lookup_sparse / safe_embedding_lookup_sparse check (their
embedding_ops_test.py), run against our drop-ins and compared with TF's op on
``ct.dequantize()``, so quantization error is not counted. Where we differ
from TF on purpose, the test pins the refusal and its message (README's
"Differences from tf.nn" table lists them)."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization

VOCAB, DIM = 8, 4
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module", params=quantization.FORMATS)
def table(request):
    """Every test that takes the table runs once per format."""
    rng = np.random.default_rng(7)
    ct = tfce.quantize(rng.normal(size=(VOCAB, DIM)).astype(np.float32),
                       request.param)
    return ct, tf.constant(ct.dequantize())


def same_as_tf(table, ours, theirs, *args, **kwargs):
    """Calls our drop-in on the compressed table and TF's op on its decoded
    values with the same arguments; asserts they agree. Returns ours."""
    ct, decoded = table
    got = ours(ct, *args, **kwargs)
    want = theirs(decoded, *args, **kwargs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL)
    return got


def ids_and_weights_2d(ragged):
    # The rows TF's safe-lookup tests use: several valid ids and one invalid
    # (weighted mean), only invalid ids, no ids, a single id, only weights
    # <= 0.
    indices = [[0, 0], [0, 1], [0, 2], [1, 0], [3, 0], [4, 0], [4, 1]]
    ids = tf.SparseTensor(indices, tf.constant([0, 1, -1, -1, 2, 0, 1],
                                               tf.int64), [5, 4])
    weights = tf.SparseTensor(indices, [1.0, 2.0, 1.0, 1.0, 3.0, 0.0, -0.5],
                              [5, 4])
    if ragged:
        return (tf.RaggedTensor.from_sparse(ids),
                tf.RaggedTensor.from_sparse(weights))
    return ids, weights


def ids_and_weights_3d():
    indices = [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [1, 0, 0],
               [1, 1, 0], [1, 1, 1]]
    ids = tf.SparseTensor(indices, tf.constant([0, 1, -1, -1, 2, 0, 1],
                                               tf.int64), [2, 3, 4])
    weights = tf.SparseTensor(indices, [1.0, 2.0, 1.0, 1.0, 3.0, 0.0, -0.5],
                              [2, 3, 4])
    return ids, weights


@pytest.mark.parametrize(
    "ragged,allow_fast_lookup,weighted,default_id",
    list(itertools.product([False, True], [False, True], [False, True],
                           [None, 3])))
def test_safe_lookup_2d(table, ragged, allow_fast_lookup, weighted,
                        default_id):
    ids, weights = ids_and_weights_2d(ragged)
    weights = weights if weighted else None
    same_as_tf(table, tfce.safe_embedding_lookup_sparse,
               tf.nn.safe_embedding_lookup_sparse, ids, weights,
               default_id=default_id, allow_fast_lookup=allow_fast_lookup)


@pytest.mark.parametrize("weighted,default_id",
                         list(itertools.product([False, True], [None, 3])))
def test_safe_lookup_3d(table, weighted, default_id):
    ids, weights = ids_and_weights_3d()
    weights = weights if weighted else None
    ours = same_as_tf(table, tfce.safe_embedding_lookup_sparse,
                      tf.nn.safe_embedding_lookup_sparse, ids, weights,
                      default_id=default_id)
    assert ours.shape == (2, 3, DIM)


@pytest.mark.parametrize("weighted,default_id,combiner",
                         list(itertools.product([False, True], [None, 3],
                                                ["sum", "mean", "sqrtn"])))
def test_safe_lookup_takes_entries_in_any_order(table, weighted, default_id,
                                                combiner):
    ids, weights = ids_and_weights_2d(ragged=False)
    order = np.random.default_rng(3).permutation(len(ids.values))
    shuffle = lambda sp: tf.SparseTensor(  # noqa: E731
        tf.gather(sp.indices, order), tf.gather(sp.values, order),
        sp.dense_shape)
    ids, weights = shuffle(ids), shuffle(weights) if weighted else None
    same_as_tf(table, tfce.safe_embedding_lookup_sparse,
               tf.nn.safe_embedding_lookup_sparse, ids, weights, combiner,
               default_id=default_id)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("safe", [False, True])
def test_incompatible_weight_shapes_fail_when_the_graph_is_built(table,
                                                                 ragged, safe):
    ct, decoded = table
    ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]],
                          tf.constant([0, 1, 2], tf.int64), [2, 2])
    weights = tf.SparseTensor([[0, 0], [0, 1]], [12.0, 5.0], [1, 2])
    if ragged:
        ids = tf.RaggedTensor.from_sparse(ids)
        weights = tf.RaggedTensor.from_sparse(weights)
    lookup = (tfce.safe_embedding_lookup_sparse if safe
              else tfce.embedding_lookup_sparse)
    reference = (tf.nn.safe_embedding_lookup_sparse if safe
                 else tf.nn.embedding_lookup_sparse)
    with pytest.raises(ValueError):
        reference(decoded, ids, weights)
    with pytest.raises(ValueError, match="sp_weights must have one weight "
                                         "per id"):
        lookup(ct, ids, weights)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_lookup_sparse_allow_fast_lookup(table, ragged, combiner):
    # Only valid ids: embedding_lookup_sparse does not prune.
    keep = lambda sp: tf.sparse.retain(sp, ids_sp.values >= 0)  # noqa: E731
    ids_sp, weights_sp = ids_and_weights_2d(False)
    ids_sp, weights_sp = keep(ids_sp), keep(weights_sp)
    if ragged:
        ids_sp = tf.RaggedTensor.from_sparse(ids_sp)
        weights_sp = tf.RaggedTensor.from_sparse(weights_sp)
    for fast in (False, True):
        same_as_tf(table, tfce.embedding_lookup_sparse,
                   tf.nn.embedding_lookup_sparse, ids_sp, weights_sp,
                   combiner, allow_fast_lookup=fast)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("max_norm", [None, 0.5, 100.0])
def test_lookup_ids_of_any_rank_and_max_norm(table, shape, max_norm):
    ids = np.random.default_rng(1).integers(0, VOCAB, size=shape)
    ours = same_as_tf(table, tfce.compressed_embedding_lookup,
                      tf.nn.embedding_lookup, ids, max_norm=max_norm)
    assert ours.shape == shape + (DIM,)
    if max_norm == 0.5:  # the clip really happened
        norms = np.linalg.norm(tf.reshape(ours, [-1, DIM]), axis=1)
        assert norms.max() <= 0.5 + 1e-6


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_lookup_ragged_ids_give_a_ragged_result(table, max_norm):
    ct, decoded = table
    ids = tf.ragged.constant([[1, 2, 3], [], [7]], tf.int64)
    ours = tfce.compressed_embedding_lookup(ct, ids, max_norm)
    theirs = tf.nn.embedding_lookup(decoded, ids, max_norm)
    assert isinstance(ours, tf.RaggedTensor)
    np.testing.assert_array_equal(ours.row_splits, theirs.row_splits)
    np.testing.assert_allclose(ours.flat_values, theirs.flat_values, **TOL)


@pytest.mark.parametrize("safe", [False, True])
def test_pooled_max_norm_is_refused_with_the_way_round(table, safe):
    ct, _ = table
    ids, _ = ids_and_weights_2d(ragged=False)
    lookup = (tfce.safe_embedding_lookup_sparse if safe
              else tfce.embedding_lookup_sparse)
    with pytest.raises(ValueError, match=r"max_norm is not supported when "
                       r"pooling.*tf\.clip_by_norm\(table, max_norm, "
                       r"axes=\[1\]\)"):
        lookup(ct, ids, max_norm=1.0)


@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_bfloat16_tables_quantize_as_their_float32_values(fmt):
    rng = np.random.default_rng(5)
    bf16 = tf.cast(rng.normal(size=(VOCAB, DIM)), tf.bfloat16)
    from_bf16 = tfce.quantize(bf16, fmt)
    from_f32 = tfce.quantize(tf.cast(bf16, tf.float32), fmt)
    np.testing.assert_array_equal(from_bf16.dequantize(),
                                  from_f32.dequantize())
    var = tfce.quantize(tf.Variable(bf16), fmt)
    np.testing.assert_array_equal(var.dequantize(), from_f32.dequantize())


@pytest.mark.parametrize("fmt", quantization.FORMATS)
def test_tables_of_higher_rank_are_refused_with_the_way_round(fmt):
    # TF gathers [V, d1, d2] params; the formats store rows of one dim.
    with pytest.raises(ValueError, match=r"rank 2 .*table\.reshape\(rows, "
                                         r"-1\)"):
        tfce.quantize(np.ones((VOCAB, 2, 2), np.float32), fmt)

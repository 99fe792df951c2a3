"""FusedDecodeAxpy is differentiable w.r.t. weights; tables are not trainable."""
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import reference
import tf_compressed_embedding as tfce
from tf_compressed_embedding import quantization

FORMATS = quantization.FORMATS

class GradientTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.product(combiner=("sum", "mean", "sqrtn"), fmt=FORMATS)
    def test_weights_gradient_matches_numerical(self, combiner, fmt):
        rng = np.random.default_rng(31)
        ct = tfce.quantize(reference.random_table(rng, 20, 5), fmt)
        ids = rng.integers(0, 20, size=12)
        segment_ids = np.sort(rng.integers(0, 4, size=12))
        weights = rng.uniform(0.5, 1.5, 12).astype(np.float32)

        def f(w):
            return tfce.fused_decode_axpy(ct, ids, segment_ids, w, combiner,
                                          num_segments=5)

        def check():
            theoretical, numerical = tf.test.compute_gradient(f, [weights],
                                                              delta=1e-2)
            self.assertAllClose(theoretical[0], numerical[0], atol=2e-3,
                                rtol=2e-3)

        check()

    @parameterized.parameters(*FORMATS)
    def test_weights_gradient_against_closed_form(self, fmt):
        # d out[s] / d w_i = decode(ids[i]) (sum): for int4, the row's
        # values and its bias.
        rng = np.random.default_rng(32)
        ct = tfce.quantize(reference.random_table(rng, 10, 4), fmt)
        table = reference.decoded(ct)
        ids, segment_ids = np.array([1, 2, 3]), np.array([0, 0, 1])
        w = tf.constant([0.5, 2.0, 1.5])
        upstream = rng.standard_normal((2, 4))
        with tf.GradientTape() as tape:
            tape.watch(w)
            out = tfce.fused_decode_axpy(ct, ids, segment_ids, w, "sum")
            loss = tf.reduce_sum(out * upstream)

        def check():
            got = tape.gradient(loss, w)
            want = [table[i] @ upstream[s] for i, s in zip(ids, segment_ids)]
            self.assertAllClose(got, want, rtol=1e-5)

        check()

    @parameterized.parameters(*FORMATS)
    def test_gradient_inside_tf_function_with_unknown_weight_count(self, fmt):
        ct = tfce.quantize(np.arange(8, dtype=np.float32).reshape(4, 2), fmt)
        table = reference.decoded(ct)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def grad(w):
            with tf.GradientTape() as tape:
                tape.watch(w)
                out = tfce.fused_decode_axpy(ct, [1, 3], [0, 0], w, "sum")
                loss = tf.reduce_sum(out)
            return tape.gradient(loss, w)

        self.assertAllClose(grad(tf.constant([1.0, 1.0])), table[[1, 3]].sum(axis=1))

    @parameterized.parameters(*FORMATS)
    def test_tables_get_no_gradient(self, fmt):
        ct = tfce.quantize(np.ones((4, 2), np.float32), fmt)
        w = tf.constant([1.0, 1.0])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(w)
            pooled = tfce.fused_decode_axpy(ct, [1, 2], [0, 0], w)
            rows = tfce.compressed_embedding_lookup(ct, [1, 2])
            loss = tf.reduce_sum(pooled) + tf.reduce_sum(rows)

        def check():
            self.assertIsNone(tape.gradient(loss, ct.data))
            self.assertIsNone(tape.gradient(loss, ct.scales))
            self.assertIsNotNone(tape.gradient(loss, w))

        check()
        self.assertEqual(ct.trainable_variables, ())

    @parameterized.parameters(*FORMATS)
    def test_making_a_table_trainable_is_refused(self, fmt):
        ct = tfce.quantize(np.ones((4, 2), np.float32), fmt)
        self.assertFalse(ct.trainable)
        with self.assertRaisesRegex(ValueError, "not trainable: train the "
                                                "float32 table"):
            ct.trainable = True


if __name__ == "__main__":
    tf.test.main()

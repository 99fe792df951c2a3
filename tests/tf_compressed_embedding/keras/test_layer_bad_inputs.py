"""CompressedEmbedding's answers to bad ids, weights, masks and constructor
arguments."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tf_compressed_embedding.layers import (CompressedEmbedding,
                                            UnsupportedQuantizationModeError)
from layer_testing import D, MODES, V


def out_of_range(bad_id):
    """The error of tf.gather ("indices[i] = 50 is not in [0, 50)") and of
    the ops ("ids[i] = 50 (in segment 0) is not in [0, 50)")."""
    return rf"\[[\d,]+\] = {bad_id} (\(in segment \d+\) )?is not in \[0, {V}\)"


class BadInputTest(tf.test.TestCase, parameterized.TestCase):

    def layer(self, mode, **kwargs):
        layer = CompressedEmbedding(V, D, **kwargs)
        layer.build()
        if mode:
            layer.quantize(mode)
        return layer

    @parameterized.product(mode=(None, *MODES), combiner=(None, "mean"))
    def test_ids_out_of_range(self, mode, combiner):
        layer = self.layer(mode, combiner=combiner)
        for bad in (V, -V - 3):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        out_of_range(bad)):
                layer(np.array([[1, bad]]))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
        def graph(ids):
            return layer(ids)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    out_of_range(V)):
            graph(tf.constant([[V]], tf.int64))
        if combiner:
            ragged = tf.ragged.constant([[1], [V + 1]], tf.int64)
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        out_of_range(V + 1)):
                layer(ragged)

    @parameterized.parameters(None, *MODES)
    def test_wrong_id_dtypes(self, mode):
        layer = self.layer(mode)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "ids must be whole numbers"):
            layer(np.array([[1.0, 2.5]], np.float32))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "whole numbers"):
            layer(np.array([[np.nan]], np.float32))
        with self.assertRaisesRegex(TypeError, "ids must be integers"):
            layer(tf.constant([["a"]]))
        pooled = self.layer(mode, combiner="sum")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "whole numbers"):
            pooled(tf.ragged.constant([[1.5]], tf.float32))

    @parameterized.parameters(None, *MODES)
    def test_weights_without_combiner(self, mode):
        layer = self.layer(mode)
        with self.assertRaisesRegex(ValueError, "`weights` need a combiner"):
            layer(np.array([[1]]), weights=np.array([[1.0]], np.float32))

    @parameterized.parameters(None, *MODES)
    def test_bad_pooled_inputs(self, mode):
        layer = self.layer(mode, combiner="mean")
        with self.assertRaisesRegex(ValueError, r"\[batch, length\]"):
            layer(np.zeros((2, 3, 4), np.int64))
        with self.assertRaisesRegex(ValueError, "`mask` is for dense"):
            layer(tf.ragged.constant([[1]], tf.int64),
                  mask=tf.constant([[True]]))
        with self.assertRaisesRegex(TypeError, "must be a RaggedTensor"):
            layer(tf.ragged.constant([[1]], tf.int64),
                  weights=tf.constant([[1.0]]))
        with self.assertRaisesRegex(TypeError, "floating point"):
            layer(np.array([[1, 2]]), weights=np.array([[1, 2]]))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "shape of the ids"):
            layer(np.array([[1, 2]]), weights=np.ones((1, 3), np.float32))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "row lengths"):
            layer(tf.ragged.constant([[1, 2], [3]], tf.int64),
                  weights=tf.ragged.constant([[1.0], [2.0, 3.0]]))

    def test_bad_constructor_arguments(self):
        with self.assertRaisesRegex(NotImplementedError, "LoRA"):
            CompressedEmbedding(V, D, lora_rank=4)
        with self.assertRaisesRegex(ValueError, "combiner"):
            CompressedEmbedding(V, D, combiner="max")
        with self.assertRaisesRegex(ValueError, "input_dim"):
            CompressedEmbedding(0, D)
        with self.assertRaisesRegex(ValueError, "output_dim"):
            CompressedEmbedding(V, 2.5)
        for mode in ("int2", "float8", "int8_rowwise"):
            with self.assertRaisesRegex(UnsupportedQuantizationModeError,
                                        f"must be one of .*got '{mode}'"):
                CompressedEmbedding(V, D, quantization_mode=mode)
        with self.assertRaisesRegex(NotImplementedError,
                                    "quantization_config"):
            CompressedEmbedding(V, D, quantization_config="int8")

    @parameterized.parameters(*MODES)
    def test_wrong_saved_variables_are_refused(self, mode):
        # Variables of another layout than the layer's (what a file from
        # another mode, or a corrupt one, holds) are refused, naming both.
        layer = CompressedEmbedding(V, D, quantization_mode=mode)
        layer.build()
        wrong = {"0": np.zeros((V, D + 1), np.float16),
                 "1": np.zeros([V], np.float32)}
        with self.assertRaisesRegex(ValueError, r"saved variable 0 is "
                                    rf"float16\[{V}, {D + 1}\], expected"):
            layer.load_own_variables(wrong)
        with self.assertRaisesRegex(ValueError, "expects 2 saved variable"):
            layer.load_own_variables({"0": wrong["0"]})
        self.assertFalse(layer.embeddings_data.numpy().any())


if __name__ == "__main__":
    tf.test.main()

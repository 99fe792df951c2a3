"""op_bench.py's TensorFlow systems: stock TF, Keras and tfce, each timed
in-graph (one tf.function call runs n consecutive batches in a sequential
tf.while_loop)."""
import os

import numpy as np

from _harness.timing import Timed


def setup(threads):
    """Imports TF with ``threads`` intra- and inter-op threads (before TF
    initialises: one process per thread count); returns (tf, tfce, the
    versions for the report)."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    tf.get_logger().setLevel("ERROR")  # one tf.function per system: no
    # retracing warnings
    import keras
    import tf_compressed_embedding as tfce
    return tf, tfce, dict(tensorflow=tf.__version__, keras=keras.__version__,
                          tfce_isa=tfce.active_isa())


def tfce_settings():
    """Settings the tfce numbers depend on (see kernels/core/prefetch_policy.h,
    kernels/tf/parallel_run.h and kernels/tf/huge_pages.h); huge pages "off": no
    table was backed by them."""
    from tf_compressed_embedding import _loader
    meta = {name.lower(): os.environ.get(name, "default")
            for name in ("TFCE_PREFETCH_ROWS", "TFCE_STANDBY_US",
                         "TFCE_MIN_PARALLEL_COST")}
    meta["tfce_huge_pages"] = ("on" if _loader.huge_page_bytes() > 0
                               else "off")
    return meta


class TFTables:
    """Every variable a TF system reads, for one (rows, dim) table.

    Each variable is read in one way only: the tfce ops and Keras read theirs
    densely (no copy: nothing ever gathers from them, so they never enter
    copy-on-read mode); the stock paths have their own copies and read them
    only with ResourceGather (tf.gather on a ResourceVariable).

    ``ct``: {format: CompressedTable} for the tfce formats the wanted
    systems use, each ``tfce.quantize(table, format)`` (made from
    ``quantization.encode``, as quantize does, so that ``cached(key, make)``
    can keep int4's slow range search across the worker processes)."""

    def __init__(self, tf, tfce, table, want, cached=None):
        from op_bench_systems import SYSTEMS
        from tf_compressed_embedding import quantization
        self.dim = table.shape[1]
        self.ct, self.keras = {}, None
        if "keras_int8" in want:
            # first: Keras' quantize() has the largest temporaries, and the
            # memory it frees is reused by the copies below (lower peak)
            import keras
            emb = keras.layers.Embedding(table.shape[0], self.dim,
                                         embeddings_initializer="zeros",
                                         name="keras_emb")
            emb.build((None,))
            emb.embeddings.assign(table)
            emb.quantize("int8")
            self.keras = emb
        self.v32 = tf.Variable(table, trainable=False, name="fp32")
        formats = {SYSTEMS[n][3] for n in want if n.startswith("tfce_")}
        # The stock paths' own copies: int8 values with separate scales
        # (int8_split: a stock-op decode of the rowwise records would need
        # bitcasts of byte slices) and float16 values.
        need_split = any(n in want for n in ("tf_naive_int8",
                                             "tf_naive_lookup_int8"))
        need_half = any(n in want for n in ("tf_naive_fp16",
                                            "tf_naive_lookup_fp16"))
        for fmt in sorted(formats | ({"int8_split"} if need_split else set())
                          | ({"fp16"} if need_half else set())):
            def make(fmt=fmt):
                return quantization.encode(table, fmt)
            if fmt == "int4" and cached is not None:
                data = cached("tfce_int4", lambda: make()[0])
                scales = np.zeros(quantization.scales_shape(fmt, len(data)),
                                  np.float32)
            else:
                data, scales = make()
            self.ct[fmt] = tfce.CompressedTable(data, scales, fmt,
                                                dim=self.dim)
        if need_split:
            self.q8 = tf.Variable(self.ct["int8_split"].data.numpy(),
                                  trainable=False)
            self.s8 = tf.Variable(self.ct["int8_split"].scales.numpy(),
                                  trainable=False)
            if "int8_split" not in formats:
                del self.ct["int8_split"]
        if need_half:
            self.h16 = tf.Variable(self.ct["fp16"].data.numpy(),
                                   trainable=False)
            if "fp16" not in formats:
                del self.ct["fp16"]


def tf_step_fns(tf, tfce, tabs, bags):
    """name -> step(ids, w, seg, sp_idx) building the graph for one batch."""
    v32 = tabs.v32

    def elsparse(ids, w, seg, sp_idx):
        shape = tf.stack([tf.constant(bags, tf.int64),
                          tf.cast(tf.size(ids) // bags, tf.int64)])
        sp_ids = tf.SparseTensor(sp_idx, ids, shape)
        sp_w = tf.SparseTensor(sp_idx, w, shape)
        return tf.nn.embedding_lookup_sparse(v32, sp_ids, sp_w, combiner="sum")

    def gather_segsum(ids, w, seg, sp_idx):
        return tf.math.segment_sum(tf.gather(v32, ids) * w[:, None], seg)

    def naive_int8(ids, w, seg, sp_idx):
        q = tf.cast(tf.gather(tabs.q8, ids), tf.float32)
        s = tf.gather(tabs.s8, ids)
        return tf.math.segment_sum(q * (s * w)[:, None], seg)

    def naive_fp16(ids, w, seg, sp_idx):
        h = tf.cast(tf.gather(tabs.h16, ids), tf.float32)
        return tf.math.segment_sum(h * w[:, None], seg)

    def fused(ct, max_threads=0):
        def f(ids, w, seg, sp_idx):
            out = tfce.fused_decode_axpy(ct, ids, seg, w, "sum",
                                         num_segments=bags)
            if max_threads:
                # The ops' internal thread cap (kernels/tf/parallel_run.h).
                from tf_compressed_embedding.ops import _with_max_threads
                out = _with_max_threads(out, max_threads)
            return out
        return f

    def lookup(ct):
        def f(ids, w, seg, sp_idx):
            return tfce.compressed_embedding_lookup(ct, ids)
        return f

    def gather(ids, w, seg, sp_idx):
        return tf.gather(v32, ids)

    def naive_lookup_int8(ids, w, seg, sp_idx):
        q = tf.cast(tf.gather(tabs.q8, ids), tf.float32)
        return q * tf.gather(tabs.s8, ids)[:, None]

    def naive_lookup_fp16(ids, w, seg, sp_idx):
        return tf.cast(tf.gather(tabs.h16, ids), tf.float32)

    def keras_int8(ids, w, seg, sp_idx):
        return tabs.keras(ids)

    def floor(ids, w, seg, sp_idx):
        return tf.reshape(tf.cast(ids[0], tf.float32), [1, 1])

    fns = {"tf_elsparse_fp32": elsparse,
           "tf_gather_segsum_fp32": gather_segsum,
           "tf_gather_fp32": gather, "tf_loop_floor": floor}
    if hasattr(tabs, "q8"):
        fns.update(tf_naive_int8=naive_int8,
                   tf_naive_lookup_int8=naive_lookup_int8)
    if hasattr(tabs, "h16"):
        fns.update(tf_naive_fp16=naive_fp16,
                   tf_naive_lookup_fp16=naive_lookup_fp16)
    for fmt, ct in tabs.ct.items():
        fns[f"tfce_{fmt}"] = fused(ct)
        fns[f"tfce_{fmt}_1t"] = fused(ct, max_threads=1)
        fns[f"tfce_lookup_{fmt}"] = lookup(ct)
    if tabs.keras is not None:
        fns["keras_int8"] = keras_int8
    return fns


def tf_timed(tf, name, step, ids_pool, w_pool, seg, sp_idx):
    """Timed wrapper: one call = n batches in a sequential while_loop."""
    nb, n_ids = ids_pool.shape

    spec = [tf.TensorSpec([None, None], tf.int64),
            tf.TensorSpec([None, None], tf.float32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None, 2], tf.int64)]

    def batch(ids_pool, w_pool, b):
        # Slice (not Gather) of whole aligned rows aliases the pool: no copy.
        ids = tf.reshape(tf.slice(ids_pool, [b, 0], [1, -1]), [-1])
        w = tf.reshape(tf.slice(w_pool, [b, 0], [1, -1]), [-1])
        return ids, w

    @tf.function(jit_compile=False, input_signature=spec + [
        tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])
    def loop(ids_pool, w_pool, seg, sp_idx, n, start):
        nbt = tf.shape(ids_pool)[0]

        def body(i, acc):
            ids, w = batch(ids_pool, w_pool, tf.math.floormod(start + i, nbt))
            out = step(ids, w, seg, sp_idx)
            return i + 1, acc + out[0, 0]  # keeps the op alive, costs nothing

        _, acc = tf.while_loop(lambda i, acc: i < n, body,
                               [tf.constant(0), tf.constant(0.0)],
                               parallel_iterations=1)
        return acc

    @tf.function(jit_compile=False, input_signature=spec + [
        tf.TensorSpec([], tf.int32)])
    def one(ids_pool, w_pool, seg, sp_idx, b):
        ids, w = batch(ids_pool, w_pool, b)
        return step(ids, w, seg, sp_idx)

    ids_t = tf.constant(ids_pool)
    w_t = tf.constant(w_pool)
    seg_t = tf.constant(seg)
    sp_t = tf.constant(sp_idx)

    def run(n, start):
        loop(ids_t, w_t, seg_t, sp_t, tf.constant(n, tf.int32),
             tf.constant(start % nb, tf.int32)).numpy()

    def output(b):
        return one(ids_t, w_t, seg_t, sp_t, tf.constant(b, tf.int32)).numpy()

    return Timed(name, run, output)

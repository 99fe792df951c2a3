"""The Keras layer against Keras' own: a pooled multi-valued feature.

    python benchmarks/layer_bench.py [--rows 1000000] [--dim 16] [--bags 512] [--ids 20]
    python benchmarks/layer_bench.py --quick   # smoke test: small, prints only

Times one pooled lookup, `[bags, ids]` padded ids (id 0 = padding) to `[bags,
D]` means, in inference (a `tf.function` over the model call), for:
`keras.layers.Embedding(mask_zero=True)` + `GlobalAveragePooling1D` in FP32
and after Keras' own `quantize("int8")`, and `tfce.layers.CompressedEmbedding
(mask_zero=True, combiner="mean")` in FP32, INT8, FP16 and (where the
layer has the mode) INT4. Medians over
repeats, variants interleaved in one process. Writes results/layer_bench.csv
and the `layer` section of RESULTS.md.
"""
import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _harness import markdown, results  # noqa: E402  (beside this script)
from _harness.timing import Timed, round_robin  # noqa: E402
from tf_compressed_embedding.layers import CompressedEmbedding  # noqa: E402

TITLE = "The Keras layer against Keras' own (`python benchmarks/layer_bench.py`)"


def keras_pooled(rows, dim, table, quantize=None):
    ids = keras.Input((None,), dtype="int64")
    layer = keras.layers.Embedding(rows, dim, mask_zero=True)
    model = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(layer(ids)))
    layer.embeddings.assign(table)
    if quantize:
        model.quantize(quantize)
    return model


def tfce_pooled(rows, dim, table, quantize=None):
    ids = keras.Input((None,), dtype="int64")
    layer = CompressedEmbedding(rows, dim, mask_zero=True, combiner="mean")
    model = keras.Model(ids, layer(ids))
    layer.embeddings.assign(table)
    if quantize:
        layer.quantize(quantize)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--bags", type=int, default=512)
    parser.add_argument("--ids", type=int, default=20, help="max ids per bag")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=50, help="calls per repeat")
    parser.add_argument("--no-results", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="100k rows, 3 repeats x 10 calls; implies "
                             "--no-results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats, args.calls = 100_000, 3, 10
        args.no_results = True
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((args.rows, args.dim)) * 0.05).astype(np.float32)
    lengths = rng.integers(1, args.ids + 1, args.bags)
    ids = np.zeros((args.bags, args.ids), np.int64)
    mask = np.arange(args.ids) < lengths[:, None]
    ids[mask] = rng.integers(1, args.rows, int(mask.sum()))
    ids = tf.constant(ids)
    variants = {
        "keras Embedding + GAP1D fp32": keras_pooled(args.rows, args.dim, table),
        "keras Embedding + GAP1D int8 (Keras')": keras_pooled(args.rows, args.dim, table,
                                                              "int8"),
        "tfce CompressedEmbedding fp32": tfce_pooled(args.rows, args.dim, table),
        "tfce CompressedEmbedding int8": tfce_pooled(args.rows, args.dim, table, "int8"),
        "tfce CompressedEmbedding fp16": tfce_pooled(args.rows, args.dim, table, "fp16"),
    }
    try:  # the layer's int4 mode, where it has one
        variants["tfce CompressedEmbedding int4"] = tfce_pooled(
            args.rows, args.dim, table, "int4")
    except (ValueError, NotImplementedError) as e:
        print(f"tfce CompressedEmbedding int4 skipped: {e}")
    calls = {name: tf.function(lambda m=model: m(ids, training=False))
             for name, model in variants.items()}
    want = calls["keras Embedding + GAP1D fp32"]().numpy()
    errors = {name: float(np.abs(fn().numpy() - want).max()) for name, fn in calls.items()}
    timed = [Timed(name, lambda n, start, fn=fn: [fn() for _ in range(n)], n=args.calls)
             for name, fn in calls.items()]
    round_robin(timed, args.repeats, rotate=False)  # noise hits every variant alike
    times = {t.name: [s * 1e3 for s in t.times] for t in timed}
    base = statistics.median(times["keras Embedding + GAP1D fp32"])
    keras_int8 = statistics.median(times["keras Embedding + GAP1D int8 (Keras')"])
    rows = [{"variant": name, "ms / call": statistics.median(t),
             "vs Keras fp32": statistics.median(t) / base,
             "vs Keras int8": statistics.median(t) / keras_int8,
             "max |out - Keras fp32|": errors[name]} for name, t in times.items()]
    lines = [f"Table {args.rows:,} x {args.dim}, {args.bags} bags of 1-{args.ids} ids "
             f"(padded with id 0, mask_zero=True), mean pooling, inference in a "
             f"tf.function; medians of {args.repeats} repeats x {args.calls} calls, "
             f"variants interleaved.", "",
             *markdown.header(["variant", "ms / call", "vs Keras fp32", "vs Keras int8",
                               "max abs diff vs Keras fp32"])]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['ms / call']:.3f} | {r['vs Keras fp32']:.2f}x | "
                     f"{r['vs Keras int8']:.2f}x | {r['max |out - Keras fp32|']:.2e} |")
    section = "\n".join(lines) + "\n"
    print(f"## {TITLE}\n\n{section}")
    if args.no_results:
        return
    results.write_csv("layer_bench.csv", rows)
    results.replace_section("layer", TITLE, section)


if __name__ == "__main__":
    main()

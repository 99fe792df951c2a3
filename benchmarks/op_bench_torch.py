"""op_bench.py's PyTorch / FBGEMM systems: ``F.embedding_bag`` fp32 and
fp16 and FBGEMM's 8-bit and 4-bit rowwise ops, timed in a Python loop under
``torch.inference_mode()``. PyTorch is a benchmark-only extra: ``pip install
--no-deps torch==2.13.0`` (the CPU wheel).

FBGEMM's rowwise rows (``torch.ops.quantized``):
- 8-bit, ``embedding_bag_byte_prepack(W)``: [D x uint8][f32 scale][f32 bias],
  scale = (max - min) / 255, bias = min of the row.
- 4-bit, ``embedding_bag_4bit_prepack(W, optimized_qparams=True)`` where
  this torch has the argument (else min/max): [ceil(D/2) bytes of
  nibbles][f16 scale][f16 bias]; the range is chosen per row by a greedy
  error search (Guan et al. 2019, as tfce's int4 encoder; FBGEMM's defaults
  ``nbins`` 200, ``ratio`` 0.16), or is the row's min/max.
"""
from _harness.timing import Timed

# FBGEMM's defaults for the 4-bit range search (the prepack op's schema):
# the range moves in steps of 1/FBGEMM4_NBINS of the row's full range, and
# stops before less than int(NBINS * (1 - RATIO)) steps are left.
FBGEMM4_NBINS = 200
FBGEMM4_RATIO = 0.16


def fbgemm4_search(torch):
    """True when this torch's ``embedding_bag_4bit_prepack`` takes
    ``optimized_qparams`` (the range search), else False (min/max)."""
    try:  # a 1 x 2 table: an unknown argument is rejected before any work
        torch.ops.quantized.embedding_bag_4bit_prepack(
            torch.zeros(1, 2), optimized_qparams=True)
    except (RuntimeError, TypeError):
        return False
    return True


def fbgemm4_prepack(torch, w32):
    """FBGEMM's 4-bit rows of the float32 tensor ``w32``, with the range
    search when this torch has it (fbgemm4_search)."""
    prepack = torch.ops.quantized.embedding_bag_4bit_prepack
    if fbgemm4_search(torch):
        return prepack(w32, optimized_qparams=True, nbins=FBGEMM4_NBINS,
                       ratio=FBGEMM4_RATIO)
    return prepack(w32)


def setup(threads, console):
    """Imports torch with ``threads`` threads; returns (torch, the versions
    for the report), or (None, {}) when torch is not installed."""
    try:
        import torch
    except ImportError:
        console.print("[yellow]torch is not installed: FBGEMM systems "
                      "skipped (pip install --no-deps torch==2.13.0)")
        return None, {}
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass
    search = fbgemm4_search(torch)
    return torch, dict(
        torch=torch.__version__,
        torch_cpu=torch.backends.cpu.get_cpu_capability(),
        fbgemm4_prepack=(f"optimized_qparams=True (nbins {FBGEMM4_NBINS}, "
                         f"ratio {FBGEMM4_RATIO})" if search
                         else "min/max (no optimized_qparams in this torch)"))


class TorchTables:
    """FBGEMM's tables for one float32 table. ``cached(key, make)`` returns
    make()'s numpy array, kept across the worker processes of a run (the
    4-bit range search takes about a minute on 2M x 128)."""

    def __init__(self, torch, table, want, cached=None):
        self.w32 = torch.from_numpy(table)  # shares the numpy table
        self.w16 = (self.w32.half() if any(n.startswith("pt_fp16_bag")
                                           for n in want) else None)
        self.p8 = (torch.ops.quantized.embedding_bag_byte_prepack(self.w32)
                   if any(n.startswith("pt_int8_bag") for n in want) else None)
        self.p4 = None
        if any(n.startswith("pt_int4_bag") for n in want):
            def make():
                return fbgemm4_prepack(torch, self.w32).numpy()
            key = ("fbgemm4_search" if fbgemm4_search(torch)
                   else "fbgemm4_minmax")
            self.p4 = torch.from_numpy(cached(key, make) if cached else make())


def torch_timed(torch, name, tabs, ids_pool, w_pool, bags):
    """FBGEMM system `name`; a "_1t" name runs on 1 thread (set around each
    timed call) inside a multi-thread process."""
    one_thread = name.endswith("_1t")
    name = name.removesuffix("_1t")
    F = torch.nn.functional
    nb, n_ids = ids_pool.shape
    length = n_ids // bags
    offsets = torch.arange(0, n_ids, length, dtype=torch.int64)
    ids_b = [torch.from_numpy(ids_pool[b]) for b in range(nb)]
    w_b = [torch.from_numpy(w_pool[b]) for b in range(nb)]
    if name == "pt_fp32_bag":
        table = tabs.w32

        def step(b):
            return F.embedding_bag(ids_b[b], table, offsets, mode="sum",
                                   per_sample_weights=w_b[b])
    elif name == "pt_fp16_bag":
        table = tabs.w16
        w_b = [w.half() for w in w_b]

        def step(b):
            return F.embedding_bag(ids_b[b], table, offsets, mode="sum",
                                   per_sample_weights=w_b[b])
    elif name in ("pt_int8_bag", "pt_int4_bag"):
        if name == "pt_int8_bag":
            packed = tabs.p8
            op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
        else:
            packed = tabs.p4
            op = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets

        def step(b):
            # (weight, indices, offsets, scale_grad_by_freq, mode=sum,
            # pruned_weights, per_sample_weights, compressed_indices_mapping,
            # include_last_offset)
            return op(packed, ids_b[b], offsets, False, 0, False, w_b[b],
                      None, False)
    else:
        raise KeyError(name)

    def run(n, start):
        threads = torch.get_num_threads()
        if one_thread:
            torch.set_num_threads(1)
            if torch.get_num_threads() != 1:  # some backends ignore it
                raise RuntimeError(f"{name}_1t: torch did not go to 1 thread")
        try:
            with torch.inference_mode():
                for k in range(n):
                    step((start + k) % nb)
        finally:
            torch.set_num_threads(threads)

    def output(b):
        with torch.inference_mode():
            return step(b).float().numpy()

    return Timed(name + ("_1t" if one_thread else ""), run, output)

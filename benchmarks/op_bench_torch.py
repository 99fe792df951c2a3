"""op_bench.py's PyTorch / FBGEMM systems: ``F.embedding_bag`` fp32 and
fp16 and FBGEMM's 8-bit rowwise ops, timed in a Python loop under
``torch.inference_mode()``. PyTorch is a benchmark-only extra: ``pip install
--no-deps torch==2.13.0`` (the CPU wheel)."""
from _harness.timing import Timed


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
    return torch, dict(torch=torch.__version__,
                       torch_cpu=torch.backends.cpu.get_cpu_capability())


class TorchTables:
    def __init__(self, torch, table, want):
        self.w32 = torch.from_numpy(table)  # shares the numpy table
        self.w16 = (self.w32.half() if any(n.startswith("pt_fp16_bag")
                                           for n in want) else None)
        self.p8 = (torch.ops.quantized.embedding_bag_byte_prepack(self.w32)
                   if any(n.startswith("pt_int8_bag") for n in want) else None)


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
    elif name == "pt_int8_bag":
        packed = tabs.p8
        op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets

        def step(b):
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

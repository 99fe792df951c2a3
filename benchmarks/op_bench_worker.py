"""op_bench.py's worker: one process, one thread count (TF's intra- and
inter-op threads must be set before TF initialises). op_bench.py runs it as
``op_bench_worker.py --worker --threads N ...`` and merges what it writes to
--worker-out: {"meta": versions, settings and load, "results": one record
per system and cell with its times and checks}."""
import gc
import json
import os
import statistics
import time

import numpy as np

import op_bench
from _harness.timing import measure
from op_bench import (RowStats, check_outputs, make_pool, make_table,
                      system_selected, table_cache)
from op_bench_systems import REF, SHORT, SYSTEMS


def cell_systems(args, threads, length, tf_parts, torch_parts, pools):
    """The systems timed in one cell, bound to its batches."""
    import op_bench_tf
    import op_bench_torch
    ids_pool, w_pool, seg, sp_idx = pools
    fns = (op_bench_tf.tf_step_fns(*tf_parts, args.bags)
           if tf_parts else {})
    systems = []
    for name, (_, fw, kind, _) in SYSTEMS.items():
        if not system_selected(args, name):
            continue
        if kind == "nopool" and length != 1:
            continue
        if kind == "pool1t" and (threads == 1 or length < 20):
            continue
        if fw == "tf" and tf_parts:
            if name in fns:
                systems.append(op_bench_tf.tf_timed(
                    tf_parts[0], name, fns[name], ids_pool, w_pool, seg,
                    sp_idx))
        elif fw == "torch" and torch_parts:
            torch, tabs = torch_parts
            systems.append(op_bench_torch.torch_timed(
                torch, name, tabs, ids_pool, w_pool, args.bags))
    return systems


def worker_main(args):
    threads = args.threads[0]
    frameworks = set(args.frameworks.split(","))
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                               TextColumn, TimeElapsedColumn)
    console = Console()  # stdout; the parent keeps stderr (TF logs) aside
    meta = {"threads": threads, "proc": args.proc_id,
            "frameworks": sorted(frameworks),
            "loadavg_start": os.getloadavg()[0]}
    tf = tfce = torch = None
    if "tf" in frameworks:
        import op_bench_tf
        tf, tfce, versions = op_bench_tf.setup(threads)
        meta.update(versions)
    fbgemm4_search = True
    if "torch" in frameworks:
        import op_bench_torch
        torch, versions = op_bench_torch.setup(threads, console)
        meta.update(versions)
        if torch is not None:
            fbgemm4_search = op_bench_torch.fbgemm4_search(torch)
    bags = args.bags
    warmup_s, target_s = args.warmup_ms / 1e3, args.target_ms / 1e3
    cells = [(r, d, dist, L) for r in args.rows for d in args.dims
             for dist in args.dists for L in args.lens]
    results = []
    t_start = time.time()
    with Progress(TextColumn(f"[bold]{threads} thread(s)[/] "
                             f"{'+'.join(sorted(frameworks))}"),
                  BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console,
                  transient=False) as progress:
        task = progress.add_task("", total=len(cells))
        current = None
        for (rows, dim, dist, length) in cells:
            cell_name = (f"R={rows:,} D={dim} L={length} {dist}")
            if current != (rows, dim):
                # free the previous table's copies before making the next
                tabs_tf = tabs_pt = table = stats = None
                gc.collect()
                progress.update(task, description=f"{cell_name}: tables")
                table = make_table(rows, dim)
                stats = RowStats(table)
                want = [n for n in SYSTEMS if system_selected(args, n)
                        and (SYSTEMS[n][2] != "nopool" or 1 in args.lens)]
                cached = table_cache(args.cache_dir, rows, dim)
                if tf is not None:
                    tabs_tf = op_bench_tf.TFTables(tf, tfce, table, want,
                                                   cached)
                if torch is not None:
                    tabs_pt = op_bench_torch.TorchTables(torch, table, want,
                                                         cached)
                current = (rows, dim)
            progress.update(task, description=f"{cell_name}: ids")
            ids_pool, w_pool = make_pool(rows, dist, length, bags,
                                         args.pool_ids, args.zipf_a)
            seg = np.repeat(np.arange(bags, dtype=np.int32), length)
            sp_idx = np.stack([np.repeat(np.arange(bags), length),
                               np.tile(np.arange(length), bags)],
                              axis=1).astype(np.int64)
            systems = cell_systems(
                args, threads, length,
                (tf, tfce, tabs_tf) if tf is not None else None,
                (torch, tabs_pt) if torch is not None else None,
                (ids_pool, w_pool, seg, sp_idx))
            if not systems:
                progress.advance(task)
                continue
            # correctness, once per cell, on batch 0
            progress.update(task, description=f"{cell_name}: check")
            checks = check_outputs(
                systems, table, stats, ids_pool, w_pool, bags,
                lambda text, cell_name=cell_name: console.print(
                    f"[bold red]WARNING[/] {cell_name} {text}"),
                fbgemm4_search)
            # timing
            measure(systems, args.repeats, warmup_s, target_s,
                    on_step=lambda m, cell_name=cell_name: progress.update(
                        task, description=f"{cell_name}: {m}"))
            for s in systems:
                rec = dict(threads=threads, rows=rows, dim=dim, L=length,
                           dist=dist, bags=bags, system=s.name,
                           n_per_repeat=s.n, proc=args.proc_id,
                           times_s=s.times, pool_batches=ids_pool.shape[0])
                rec.update(checks.get(s.name, {}))
                results.append(rec)
            progress.advance(task)
            med = {s.name: statistics.median(s.times) for s in systems}
            if REF in med:
                tf_time = med[REF] / (bags * length) * 1e9
                best = {k: med[REF] / v for k, v in med.items()
                        if k in ("tfce_int8", "pt_int8_bag", "tfce_int4",
                                 "pt_int4_bag", "tfce_fp16",
                                 "tfce_int8_split", "tfce_lookup_int8")}
                progress.console.print(
                    f"  {cell_name}: elsparse {tf_time:.1f} ns/row; speedup "
                    + ", ".join(f"{SHORT[k]} {v:.2f}x" for k, v in best.items()))
            del systems
    meta["seconds"] = time.time() - t_start
    meta["loadavg_end"] = os.getloadavg()[0]
    if tfce is not None:
        meta.update(op_bench_tf.tfce_settings())
    with open(args.worker_out, "w") as f:
        json.dump({"meta": meta, "results": results}, f)


if __name__ == "__main__":
    worker_main(op_bench.finish_args(op_bench.build_parser().parse_args()))

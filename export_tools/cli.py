"""`tfce-export SRC DST --dtype int8|int4|fp16|int8_split|auto`: the
command-line front end.

Exit status: 0 when DST is complete (and verified, unless --no-verify);
1 when the export is refused or fails (one line says why; DST is not
created); 2 for bad usage; 3 for an internal error.
"""
import argparse
import logging
import os
import sys
import warnings

from export_tools import options
from export_tools.errors import ExportError

_GIB = float(1 << 30)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfce-export",
        description="Rewrite a SavedModel so its FP32 embedding tables are stored as "
                    "INT8, INT4 or FP16 (one format, or per table the smallest that "
                    "keeps the outputs within a bound), with the same signatures. SRC "
                    "is never modified; DST appears only when complete and verified.")
    parser.add_argument("src", metavar="SRC", help="SavedModel directory to read")
    parser.add_argument("dst", metavar="DST", help="directory to write the compressed "
                        "SavedModel to")
    parser.add_argument("--dtype", choices=options.DTYPES, required=True,
                        help="storage format of the compressed tables (D: a row's "
                             "width): 'int8': each row's int8 values with its float32 "
                             "scale inline (4 + D bytes a row; steps of the row's "
                             "largest magnitude / 127); 'int4': two values a byte with "
                             "a float16 scale and bias (4 + ceil(D/2) bytes; steps of "
                             "the row's range / 15); 'fp16': half floats (2 D bytes); "
                             "'int8_split': int8 rows and a separate float32 scales "
                             "array (D + 4 bytes; version 0.1.0's int8 layout); "
                             "'auto': per table the smallest of int4, int8, fp16 or "
                             "FP32 that keeps the outputs within --max-error")
    parser.add_argument("--max-error", type=float, metavar="E",
                        help="with --dtype auto (and only there): the largest absolute "
                             "difference allowed between any float output element of "
                             "DST and of SRC, on the verification inputs (--examples, "
                             "else SRC's warmup requests, else generated; give real "
                             "requests, as the bound holds on them). Each table is "
                             "measured alone in each format; tables whose changes add "
                             "up in the same output values share E (the smallest "
                             "formats first, then the upgrades that remove the most "
                             "error per byte); the choice is measured together and "
                             "DST verified against E, a table moving up a format "
                             "until it holds")
    parser.add_argument("--ops", choices=options.OPS_MODES, default="fused",
                        help="'fused': this package's ops (a server built with them); "
                             "'stock': stock TF ops only, for an unmodified TF Serving "
                             "(default: %(default)s)")
    parser.add_argument("--batch", action=argparse.BooleanOptionalAction, default=True,
                        help="with --ops fused: one BatchedFusedDecodeAxpy node per "
                             "signature for all its pooled lookups that do not depend "
                             "on one another, so a request pays TensorFlow's per-node "
                             "cost once instead of once per table (same outputs); "
                             "--no-batch keeps one FusedDecodeAxpy node per lookup "
                             "(default: batch)")
    parser.add_argument("--tables", metavar="REGEX",
                        help="convert only tables whose name or checkpoint key matches "
                             "(default: every float32 rank-2 variable read only by "
                             "lookups)")
    parser.add_argument("--keep", metavar="REGEX",
                        help="leave matching tables FP32 (e.g. tied weights)")
    parser.add_argument("--min-rows", type=int, default=options.DEFAULT_MIN_ROWS,
                        metavar="N",
                        help="leave tables of fewer rows FP32 (default: %(default)s)")
    parser.add_argument("--signatures", metavar="KEY,...",
                        help="export only these signatures (default: all)")
    parser.add_argument("--chunk-rows", type=int, metavar="N",
                        help="rows encoded per chunk; bounds memory (default: about "
                             f"{options.DEFAULT_CHUNK_BYTES >> 20} MiB of FP32 rows)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace DST if it exists")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="run SRC and DST in fresh processes and compare every "
                             "output (default: on)")
    parser.add_argument("--examples", metavar="FILE",
                        help="inputs to verify on: an .npz with keys 'SIGNATURE/INPUT' "
                             "(strings as str, bytes or object arrays; object arrays "
                             "are unpickled, so pass only your own files), or a "
                             "TFRecord of TF Serving PredictionLog requests, the first "
                             "few of each signature (default: "
                             "SRC's assets.extra/tf_serving_warmup_requests if "
                             "present, else generated from the signatures)")
    parser.add_argument("--report", metavar="FILE.json", help="write a JSON report")
    parser.add_argument("--quiet", action="store_true", help="no progress, no summary")
    return parser


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


class RichProgress:
    """Draws the export's progress with rich: a spinner per stage, a bar per table."""

    def __init__(self, console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                                   SpinnerColumn, TextColumn, TimeElapsedColumn)
        self.console = console
        self.bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                             transient=True)
        self._stage = None
        self._table = None

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        self.bars.__exit__(*exc)

    def stage(self, text):
        if self._stage is not None:
            self.bars.update(self._stage, visible=False)
        self._stage = self.bars.add_task(text, total=None)
        self.console.log(text)

    def table(self, name, rows):
        if self._table is not None:
            self.bars.update(self._table, visible=False)
        self._table = self.bars.add_task(f"encoding {name}", total=rows)

    def rows_done(self, count):
        self.bars.advance(self._table, count)

    def warn(self, text):
        self.console.log(f"[yellow]warning:[/] {text}")

    def note(self, text):
        self.console.log(text)


def _mib(count):
    return f"{count / 2**20:.2f}"


def human_bytes(count):
    """'512 B', '12.3 KiB', '4.56 MiB', '1.23 GiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.3g} {unit}"
    return f"{count} B"


def print_summary(console, report):
    from rich.table import Table
    auto = report.auto is not None
    title = (f"tables → auto, max error {report.auto.max_error:g}" if auto
             else f"tables → {report.dtype}") + f" ({report.ops} ops)"
    tables = Table(title=title)
    several = len(report.verification) > 1 or len(
        {s for t in report.tables for s in t.signatures}) > 1
    columns = (["table", "rows", "dim"] + (["format"] if auto else [])
               + ["FP32 MiB", "stored MiB" if auto else f"{report.dtype} MiB",
                  "max |err|", "mean |err|"] + (["signatures"] if several else []))
    for column in columns:
        tables.add_column(column, justify="left" if column in ("table", "signatures")
                          else "right")
    for t in report.tables:
        tables.add_row(t.name, f"{t.rows:,}", str(t.dim), *([t.format] if auto else []),
                       _mib(t.bytes_before), _mib(t.bytes_after),
                       f"{t.max_abs_error:.3g}", f"{t.mean_abs_error:.3g}",
                       *([", ".join(t.signatures)] if several else []))
    console.print(tables)
    console.print(f"checkpoint: {report.checkpoint_bytes_before / _GIB:.3f} GiB → "
                  f"{report.checkpoint_bytes_after / _GIB:.3f} GiB; tables "
                  f"{_mib(report.table_bytes_before)} MiB → "
                  f"{_mib(report.table_bytes_after)} MiB")
    for key, nodes in sorted(report.batched_lookups.items()):
        for features in nodes:
            console.print(f"signature {key!r}: {features} pooled lookups in one "
                          f"BatchedFusedDecodeAxpy node")
    if auto:
        print_auto_summary(console, report.auto)
    for name in report.kept_fp32:
        console.print(f"left FP32 (--keep): {name}")
    if report.not_lookups:
        console.print("left FP32, not read by lookups: " + ", ".join(
            f"{name} ({op})" for name, op in sorted(report.not_lookups.items())))
    if report.verified:
        check = Table(title=f"verification against SRC (tolerance {report.tolerance:.3g})")
        for column in ("signature", "output", "max |diff|"):
            check.add_column(column)
        for sig, outputs in sorted(report.verification.items()):
            for key, diff in sorted(outputs.items()):
                check.add_row(sig, key, f"{diff:.3g}")
        console.print(check)
        console.print(f"{report.warmup_requests} warmup request(s) in "
                      f"assets.extra/tf_serving_warmup_requests")
    else:
        console.print("[yellow]not verified (--no-verify)[/]")


def print_auto_summary(console, auto):
    """What --dtype auto measured and chose, and the error it proved."""
    from rich.table import Table

    from export_tools.auto_plan import FP32
    formats = list(options.AUTO_FORMATS)
    choice = Table(title="--dtype auto: single-table errors (max |output change| with "
                         "only that table compressed) and the choice")
    for column in ["table", "rows", "dim", "choice", "bytes", "error"] + formats:
        choice.add_column(column, justify="left" if column == "table" else "right")

    def cell(t, fmt):
        if fmt not in t.errors:
            return "-"  # no smaller than FP32 at this dim
        return "unusable" if t.errors[fmt] is None else f"{t.errors[fmt]:.3g}"
    for t in auto.tables:
        choice.add_row(t.name, f"{t.rows:,}", str(t.dim),
                       "FP32" if t.format == FP32 else t.format, human_bytes(t.bytes),
                       f"{t.error:.3g}", *[cell(t, f) for f in formats])
    console.print(choice)
    for up in auto.upgrades:
        console.print(f"upgraded {up['table']}: {up['from']} → {up['to']} (measured "
                      f"{up['measured']:.3g} > {auto.max_error:g} on the {up['where']})")
    console.print(f"auto: tables {human_bytes(auto.bytes)} (all int8 "
                  f"{human_bytes(auto.bytes_int8)}, FP32 {human_bytes(auto.bytes_fp32)})")
    console.print(f"measured max |DST - SRC| over {auto.output_values} float output "
                  f"values: {auto.measured_error:.3g} <= {auto.max_error:g} (predicted "
                  f"{auto.predicted_error:.3g}, sum of single-table errors "
                  f"{auto.single_sum:.3g})")


def _check_usage(parser, args):
    if args.dtype == options.AUTO:
        if args.max_error is None:
            parser.error("--dtype auto needs --max-error E")
        if not args.max_error > 0:
            parser.error(f"--max-error must be > 0, got {args.max_error:g}")
        if not args.verify:
            parser.error("--dtype auto measures on the verification inputs and proves "
                         "the bound by verifying: it cannot run with --no-verify")
    elif args.max_error is not None:
        parser.error(f"--max-error is for --dtype auto only (got --dtype {args.dtype})")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_usage(parser, args)
    _quiet_tensorflow()
    from rich.console import Console
    console = Console(stderr=True)
    try:
        from export_tools.compress import Progress, compress_saved_model
        from export_tools.examples import load_examples
        examples = load_examples(args.examples) if args.examples else None
        signatures = args.signatures.split(",") if args.signatures else None
        kwargs = dict(dtype=args.dtype, ops=args.ops, tables=args.tables, keep=args.keep,
                      min_rows=args.min_rows, signatures=signatures,
                      chunk_rows=args.chunk_rows, overwrite=args.overwrite,
                      verify=args.verify, examples=examples, report=args.report,
                      max_error=args.max_error, batch=args.batch)
        if args.quiet:
            report = compress_saved_model(args.src, args.dst, progress=Progress(), **kwargs)
        else:
            with RichProgress(console) as progress:
                report = compress_saved_model(args.src, args.dst, progress=progress,
                                              **kwargs)
            print_summary(console, report)
    except ExportError as e:
        print(f"tfce-export: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tfce-export: interrupted; DST was not written", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line, not a TF traceback
        print(f"tfce-export: internal error: {type(e).__name__}: "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''} "
              f"(DST was not written; set TFCE_EXPORT_TRACEBACK=1 for details)",
              file=sys.stderr)
        if os.environ.get("TFCE_EXPORT_TRACEBACK") == "1":
            raise
        return 3
    return 0

"""`tfce-export SRC DST --dtype int8|fp16`: the command-line front end."""
import argparse
import sys


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfce-export",
        description="Rewrite a SavedModel so its FP32 embedding variables are "
                    "stored as INT8 (+ per-row scales) or FP16.")
    parser.add_argument("src", help="SavedModel directory to read (never modified)")
    parser.add_argument("dst", help="directory to write the compressed SavedModel to")
    parser.add_argument("--dtype", choices=["int8", "fp16"], required=True,
                        help="storage format of the compressed tables")
    parser.add_argument("--ops", choices=["fused", "stock"], default="fused",
                        help="emit this package's fused ops, or stock TF ops only")
    return parser


def main(argv=None):
    build_parser().parse_args(argv)
    print("tfce-export: the SavedModel rewriter is not implemented in this "
          "version yet", file=sys.stderr)
    return 2

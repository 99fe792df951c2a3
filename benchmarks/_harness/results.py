"""Where results go: benchmarks/RESULTS.md, in sections (one per benchmark,
each replaced whole when its benchmark runs again), and the CSVs in
benchmarks/results/."""
import csv
import os
import re

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
PATH = os.path.join(BENCH_DIR, "RESULTS.md")
HEADER = ("# Benchmark results\n\nEach section is written by the benchmark "
          "named in its title; rerun it to refresh the section.\n")


def replace_section(key, title, body):
    text = open(PATH).read() if os.path.exists(PATH) else HEADER
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    section = f"{begin}\n## {title}\n\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) \
        else text.rstrip() + "\n\n" + section + "\n"
    with open(PATH, "w") as f:
        f.write(text)


def write_csv(path, rows, fields=None, float_format=None):
    """Writes ``rows`` (dicts) as CSV and returns the path.

    ``path``: a bare file name goes to benchmarks/results/. ``fields``: the
    columns, in order (default: the first row's keys; a row may then have no
    other keys); with ``fields`` given, other keys are left out.
    ``float_format``: e.g. ``"{:.6g}"`` for float values (default: str)."""
    if os.path.dirname(path) == "":
        path = os.path.join(RESULTS_DIR, path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if fields is None:
        fields = list(rows[0])
    else:
        rows = [{k: r[k] for k in fields} for r in rows]
    if float_format is not None:
        rows = [{k: float_format.format(v) if isinstance(v, float) else v
                 for k, v in r.items()} for r in rows]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path

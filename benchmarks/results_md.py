"""Keeps benchmarks/RESULTS.md in sections, one per benchmark, each replaced
whole when its benchmark runs again; and the CSVs in benchmarks/results/."""
import csv
import os
import platform
import re

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "RESULTS.md")
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


def write_csv(name, rows):
    """Writes rows (dicts with the same keys) to benchmarks/results/NAME;
    returns the path."""
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", name)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def cpu_model():
    """The CPU's model name with its family and model numbers: the machines
    these benchmarks run on change between runs (AMD and Intel so far)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or "unknown"
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']} model {info['model']})"
    return name

"""Child processes: a benchmark's workers, and the C++ benchmarks.

A worker is a fresh process per configuration, because some settings only
take effect before a framework initialises (TF's intra- and inter-op
threads) and because a child's peak memory is its own (VmHWM)."""
import csv
import io
import json
import os
import subprocess
import sys

from _harness.host import ROOT


def child_env(threads=None):
    """The environment for a child: TF's C++ logging down to warnings
    unless the caller set it, and OpenMP's threads to ``threads``."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_worker(cmd, env, out_path, log_path, what):
    """Runs ``cmd`` with its stderr in ``log_path`` and returns the JSON it
    wrote to ``out_path``; if it fails, prints the end of its stderr and
    exits, naming it ``what``."""
    with open(log_path, "w") as err:
        rc = subprocess.call(cmd, env=env, stderr=err)
    if rc != 0:
        with open(log_path) as err:
            sys.stdout.write(err.read()[-6000:] + "\n")
        raise SystemExit(f"{what} failed with exit code {rc} (its stderr "
                         "is above)")
    with open(out_path) as f:
        return json.load(f)


def json_child(cmd, env):
    """Runs ``cmd``, stderr passed through; returns (exit code, the JSON on
    its last line of stdout, or None if it failed)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode:
        return proc.returncode, None
    return 0, json.loads(proc.stdout.strip().splitlines()[-1])


def build_cc(out_dir, name, flags=None):
    """Builds the C++ benchmark benchmarks/NAME.cc with the kernels, compiled
    with exactly setup.py's per-file flags (tools/kernel_objects.py);
    ``flags`` for the benchmark's own source. Returns the binary's path."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import kernel_objects
    print(f"building {name}", flush=True)
    kwargs = {} if flags is None else {"flags": flags}
    return kernel_objects.build_benchmark(out_dir, f"benchmarks/{name}.cc",
                                          **kwargs)


def run_csv(cmd, env=None, **columns):
    """Runs a benchmark that prints CSV; returns its rows as dicts, each
    with ``columns`` added (what the row was run with)."""
    out = subprocess.run(cmd, env=env, check=True, capture_output=True,
                         text=True).stdout
    return [dict(r, **columns) for r in csv.DictReader(io.StringIO(out))]

"""Compiles the TF-free kernel files with exactly setup.py's per-file flags,
for the C++ kernel tests and the C++ benchmarks (no TensorFlow needed)."""
import importlib.util
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TF-free sources the kernel tests and benchmarks link besides the kernels.
SUPPORT_SOURCES = ["kernels/dispatch.cc", "kernels/cpu_features.cc"]


def op_library_sources():
    """setup.py's {source: per-file flags} table."""
    spec = importlib.util.spec_from_file_location(
        "tfce_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() only runs as __main__
    return module.OP_LIBRARY_SOURCES


def kernel_sources():
    """{kernels/kernel_*.cc: flags}: the reference and one file per ISA."""
    return {src: flags for src, flags in op_library_sources().items()
            if re.fullmatch(r"kernels/kernel_\w+\.cc", src)}


def compile_kernels(out_dir, extra_flags=(), opt="-O3"):
    """Compiles every kernel file into out_dir; returns the object paths."""
    objects = []
    for src, flags in kernel_sources().items():
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        subprocess.run(["g++", "-std=c++17", opt, "-I.", *extra_flags, *flags,
                        "-c", src, "-o", obj], cwd=ROOT, check=True)
        objects.append(obj)
    return objects


def build_benchmark(out_dir, source, flags=("-O2",)):
    """Links the C++ benchmark `source` (a path from the repo root) with the
    kernels and their support sources; returns the binary's path."""
    objects = compile_kernels(out_dir)
    binary = os.path.join(out_dir, os.path.splitext(os.path.basename(source))[0])
    subprocess.run(["g++", "-std=c++17", *flags, "-I.", source,
                    *SUPPORT_SOURCES, *objects, "-o", binary, "-pthread"],
                   cwd=ROOT, check=True)
    return binary

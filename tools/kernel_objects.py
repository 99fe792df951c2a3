"""Compiles the TF-free core of the op library (kernels/core/) with exactly
the per-file flags of the one source table, kernels/sources.bzl, for the C++
kernel tests and the C++ benchmarks (no TensorFlow needed)."""
import ast
import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES_FILE = "kernels/sources.bzl"


def op_library_sources():
    """{source path from the repo root: its own flags}, read from
    kernels/sources.bzl (one statement assigning a plain dict literal)."""
    path = os.path.join(ROOT, SOURCES_FILE)
    (assign,) = ast.parse(open(path).read(), path).body
    return {"kernels/" + source: flags
            for source, flags in ast.literal_eval(assign.value).items()}


def kernel_sources():
    """{source: flags} of the kernel variants, the sources with flags of
    their own: the scalar reference and one file per ISA."""
    return {src: flags for src, flags in op_library_sources().items() if flags}


def support_sources():
    """The other TF-free sources (dispatch, CPU detection, ...) the kernel
    tests and benchmarks link besides the kernels."""
    return [src for src, flags in op_library_sources().items()
            if not flags and src.startswith("kernels/core/")]


SUPPORT_SOURCES = support_sources()


def compile_kernels(out_dir, extra_flags=(), opt="-O3"):
    """Compiles every kernel file into out_dir, one per CPU at a time;
    returns the object paths."""
    def compile_one(src, flags):
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        subprocess.run(["g++", "-std=c++17", opt, "-I.", *extra_flags, *flags,
                        "-c", src, "-o", obj], cwd=ROOT, check=True)
        return obj

    jobs = len(os.sched_getaffinity(0))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(compile_one, src, flags)
                   for src, flags in kernel_sources().items()]
        return [future.result() for future in futures]


CACHE_DIR = os.path.join(ROOT, "build", "kernel_objects")


def _cache_key():
    """A digest of all the kernel objects depend on: the compiler, the flags
    and every file in kernels/core/ (the kernel sources include only those
    and system headers)."""
    digest = hashlib.sha256()
    digest.update(subprocess.run(["g++", "--version"], capture_output=True,
                                 check=True).stdout)
    digest.update(repr(sorted(kernel_sources().items())).encode())
    core = os.path.join(ROOT, "kernels", "core")
    for name in sorted(os.listdir(core)):
        digest.update(name.encode())
        with open(os.path.join(core, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def cached_kernel_objects():
    """compile_kernels' objects (its default flags), kept in
    build/kernel_objects/ and reused while the compiler, the flags and
    kernels/core/ are unchanged: the C++ benchmarks each link them, and
    compiling them is most of a benchmark's build. Safe for concurrent
    callers: each compiles into a staging directory and the first to finish
    publishes it."""
    final = os.path.join(CACHE_DIR, _cache_key())
    if not os.path.isdir(final):
        os.makedirs(CACHE_DIR, exist_ok=True)
        staging = tempfile.mkdtemp(dir=CACHE_DIR, prefix=".staging-")
        try:
            compile_kernels(staging)
            os.rename(staging, final)
        except OSError:
            if not os.path.isdir(final):
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return [os.path.join(final, os.path.basename(src) + ".o")
            for src in kernel_sources()]


SANITIZED_BUILD_TEMP = os.path.join(ROOT, "build", "asan", "tmp")


def sanitized_core_objects():
    """The TF-free core's objects (kernels and support sources) of the
    ASan+UBSan op library build, tools/build_sanitized.sh, which this runs:
    it compiles only what is out of date, so after tools/sanitize.sh it only
    links. Returns their paths."""
    subprocess.run(["bash", "tools/build_sanitized.sh"], cwd=ROOT, check=True)
    objects = [os.path.join(SANITIZED_BUILD_TEMP, os.path.splitext(src)[0] + ".o")
               for src in [*kernel_sources(), *SUPPORT_SOURCES]]
    missing = [obj for obj in objects if not os.path.isfile(obj)]
    assert not missing, f"the sanitized build left no {missing}"
    return objects


def build_benchmark(out_dir, source, flags=("-O2",)):
    """Links the C++ benchmark `source` (a path from the repo root) with the
    kernels (cached_kernel_objects) and their support sources; returns the
    binary's path."""
    objects = cached_kernel_objects()
    binary = os.path.join(out_dir, os.path.splitext(os.path.basename(source))[0])
    subprocess.run(["g++", "-std=c++17", *flags, "-I.", source,
                    *SUPPORT_SOURCES, *objects, "-o", binary, "-pthread"],
                   cwd=ROOT, check=True)
    return binary

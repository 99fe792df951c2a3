"""Builds tf_compressed_embedding and its op library `_ops.so`.

The op library is compiled against the TensorFlow installed in the build
environment, with the flags `tf.sysconfig` reports, so install without build
isolation:

    pip install --no-build-isolation -e .

The sources and their per-file flags are one table, kernels/sources.bzl,
which the Bazel build reads too. ISA flags are given per file (kernel files
only), never globally (see that file).

Set TFCE_SANITIZE=1 to build the library with ASan+UBSan (for tests);
tools/sanitize.sh builds it that way into build/asan/ (`setup.py build_ext
--build-lib --build-temp`, leaving the in-place `_ops.so` alone) and runs the
op tests on it. GCC cannot compile TF's headers with UBSan's null checks
(see TF_HEADER_SANITIZER_FLAGS), so files that include them build without
those three checks; the TF-free files (the kernels) get every check.

Sources compile in parallel, one per CPU (TFCE_BUILD_JOBS=N sets the count),
and only those whose object is out of date are compiled again: after an edit,
or for a wheel after an in-place build, only what changed is rebuilt.
TFCE_BUILD_DRY_RUN=1 prints every compile command, in order, and builds
nothing (setuptools' own --dry-run did this; newer releases dropped it).
"""
import ast
import concurrent.futures
import os
import re
import runpy
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Every C++ source of the op library, with the extra flags it alone gets: the
# table both builds read (kernels/BUILD load()s the same file).
KERNEL_SOURCES_FILE = "kernels/sources.bzl"


def read_source_table(path=KERNEL_SOURCES_FILE):
    """{path from the repo root: per-file flags} from kernels/sources.bzl,
    whose one statement assigns a plain dict literal."""
    (assign,) = ast.parse(open(path).read(), path).body
    directory = os.path.dirname(path)
    return {os.path.join(directory, source): flags
            for source, flags in ast.literal_eval(assign.value).items()}


# The export tool's streaming checkpoint writer (a C shim over TF's BundleWriter).
BUNDLE_WRITER_SOURCES = {"export_tools/native/bundle_writer.cc": []}

# -fno-wrapv undoes the -fwrapv that Python's own CFLAGS put on every build_ext
# compile: under it signed overflow is defined, and UBSan would not check it
# (the Bazel build has no -fwrapv).
SANITIZER_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                   "-fno-sanitize-recover=undefined", "-fno-wrapv"]
# GCC 12 implies -fno-delete-null-pointer-checks under these three UBSan
# checks, and then `&function == nullptr` is not a constant expression, which
# Abseil's hash_policy_traits.h (in TF's headers) needs: the compile fails
# with "is not a constant expression". Only files that include TF's headers
# drop them; ASan still reports a null dereference there.
TF_HEADER_SANITIZER_FLAGS = [
    "-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"]
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes_tf_headers(path):
    """Whether `path` includes, directly or through our headers (found from
    the source root, as -I. does), a header that is not ours: TF's."""
    with open(path) as f:
        included = _QUOTED_INCLUDE.findall(f.read())
    return any(not os.path.isfile(h) or includes_tf_headers(h)
               for h in included)


def check_tf_version(version):
    """Refuses a TensorFlow older than the supported range, warns about one
    newer than the tested range (tf_compressed_embedding/supported_versions.py,
    read from its file: the package cannot be imported before it is built)."""
    supported = runpy.run_path(os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        "tf_compressed_embedding", "supported_versions.py"))
    refusal = supported["tf_too_old"](version)
    if refusal:
        raise SystemExit(f"error: {refusal}")
    warning = supported["tf_untested"](version)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def build_jobs():
    """How many sources compile at once: TFCE_BUILD_JOBS, else one per CPU
    this process may run on (each compile of a TF-including file is
    single-threaded and needs under 1 GB)."""
    jobs = os.environ.get("TFCE_BUILD_JOBS")
    if jobs:
        if not jobs.isdigit() or int(jobs) < 1:
            raise SystemExit(
                f"error: TFCE_BUILD_JOBS must be a positive integer, got {jobs!r}")
        return int(jobs)
    return len(os.sched_getaffinity(0))


def depfile_inputs(depfile):
    """The files a make-style depfile (g++ -MMD) says its object was built
    from: the source and every header it included."""
    with open(depfile) as f:
        text = f.read().replace("\\\n", " ")
    _, _, inputs = text.partition(": ")
    return inputs.split()


def object_is_current(obj, command):
    """Whether `obj` was compiled by exactly `command` and is newer than
    its source and every header the compile read (from its depfile)."""
    try:
        with open(obj + ".cmd") as f:
            if f.read() != command:
                return False
        built = os.path.getmtime(obj)
        return all(os.path.getmtime(path) <= built
                   for path in depfile_inputs(obj + ".d"))
    except OSError:  # no object, depfile or record yet, or an input is gone
        return False


class BuildOpLibrary(build_ext):
    """Compiles each source with its own flags and links `_ops.so`.

    Sources compile in parallel (build_jobs()), and a source whose object is
    current (object_is_current: same command, no newer source or header)
    is not compiled again: a wheel built after an in-place build, or a
    rebuild after editing one file, only compiles what changed.
    """

    def finalize_options(self):
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            # An editable install builds in a temporary directory; keep the
            # objects where a regular build puts them, so the next build of
            # either kind finds them.
            self.build_temp = os.path.join(
                os.path.dirname(os.path.abspath(__file__)), "build",
                f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
        # Absolute, so the compile commands (which name the object) of an
        # editable and a regular build are the same string.
        self.build_temp = os.path.abspath(self.build_temp)

    def get_ext_filename(self, fullname):
        # A TF op library, not a Python extension module: no ABI tag.
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext):
        import tensorflow as tf  # the TF this library will be loaded into

        check_tf_version(tf.__version__)
        common = tf.sysconfig.get_compile_flags() + [
            "-O3", "-fPIC", "-fvisibility=hidden", "-I.",
            f'-DTFCE_TF_VERSION="{tf.__version__}"',
        ]
        link = tf.sysconfig.get_link_flags() + ["-Wl,--no-undefined"]
        sanitize = os.environ.get("TFCE_SANITIZE") == "1"
        if sanitize:
            common += SANITIZER_FLAGS
            link += SANITIZER_FLAGS
        else:
            # Python's CFLAGS carry -g; the shipped library needs no debug
            # info (symbols stay for profilers), and it slows TF-header
            # compiles. Sanitizer builds keep it for file:line in reports.
            common.append("-g0")
        compiles = []
        for source, flags in ext.extra_per_file_flags.items():
            if sanitize and includes_tf_headers(source):
                flags = flags + TF_HEADER_SANITIZER_FLAGS
            (obj,) = self.compiler.object_filenames(
                [source], output_dir=self.build_temp)
            args = common + flags + ["-MMD", "-MF", obj + ".d"]
            command = " ".join(self.compiler.compiler_so + args + [source])
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            compiles.append((source, obj, args, command))
        if os.environ.get("TFCE_BUILD_DRY_RUN") == "1":
            for source, obj, args, _ in compiles:
                print(" ".join(self.compiler.compiler_so + args
                               + ["-c", source, "-o", obj]))
            return
        stale = [c for c in compiles
                 if self.force or not object_is_current(c[1], c[3])]
        jobs = build_jobs()
        if stale:
            print(f"compiling {len(stale)} of {len(compiles)} sources of "
                  f"{ext.name}, {jobs} at a time")
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for future in [pool.submit(self._compile_one, *c) for c in stale]:
                future.result()  # re-raises the first failed compile
        self.compiler.link_shared_object(
            [obj for _, obj, _, _ in compiles], self.get_ext_fullpath(ext.name),
            extra_postargs=link, target_lang="c++")

    def _compile_one(self, source, obj, args, command):
        # The record goes last, so an interrupted compile is redone.
        if os.path.exists(obj + ".cmd"):
            os.remove(obj + ".cmd")
        self.compiler.compile([source], output_dir=self.build_temp,
                              extra_postargs=args)
        with open(obj + ".cmd", "w") as f:
            f.write(command)


class OpLibrary(Extension):
    """A shared library linked against TF (no Python ABI), built per file."""

    def __init__(self, name, per_file_flags, headers_dir):
        super().__init__(name, sources=list(per_file_flags),
                         depends=sorted(
                             os.path.join(directory, f)
                             for directory, _, files in os.walk(headers_dir)
                             for f in files if f.endswith((".h", ".inc"))))
        self.extra_per_file_flags = per_file_flags


if __name__ == "__main__":
    setup(
        ext_modules=[
            OpLibrary("tf_compressed_embedding._ops", read_source_table(),
                      "kernels"),
            OpLibrary("export_tools._bundle_writer", BUNDLE_WRITER_SOURCES,
                      "export_tools/native"),
        ],
        cmdclass={"build_ext": BuildOpLibrary},
    )

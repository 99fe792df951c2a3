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
"""
import ast
import os
import re
import runpy
import sys

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


class BuildOpLibrary(build_ext):
    """Compiles each source with its own flags and links `_ops.so`."""

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
        objects = []
        for source, flags in ext.extra_per_file_flags.items():
            if sanitize and includes_tf_headers(source):
                flags = flags + TF_HEADER_SANITIZER_FLAGS
            objects += self.compiler.compile(
                [source], output_dir=self.build_temp,
                extra_postargs=common + flags, depends=ext.depends)
        self.compiler.link_shared_object(
            objects, self.get_ext_fullpath(ext.name), extra_postargs=link,
            target_lang="c++")


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

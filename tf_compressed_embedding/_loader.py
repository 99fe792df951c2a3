"""Loading of the op library, with a TensorFlow version guard.

The package loads the library as soon as TensorFlow is imported (see the
package docstring), so that a SavedModel using the ops loads after a plain
``import tf_compressed_embedding``. A failure there is not raised inside that
import (the numpy quantization and the rest of the package keep working); it
is kept, and raised with its reason by the first op call or by
:func:`load_ops`.

The library is bound to the TensorFlow it was compiled against: before
loading, the version recorded in the library is compared with the running
TensorFlow, and a mismatch is reported with the command that rebuilds it;
a TensorFlow older than the supported range is refused (see
supported_versions).

``TFCE_OPS_LIBRARY`` points the loader at another build of the library (the
Bazel one, a sanitizer build) instead of the ``_ops.so`` in this package.
"""
from __future__ import annotations

import ctypes
import os
import re
import threading

# TensorFlow is imported inside the functions, not here: the package loads
# the library from a hook that runs when TensorFlow's import completes, and
# that import may be this module's own (a module that imported TensorFlow at
# its top would still be half-initialized when the hook calls it).
from tf_compressed_embedding import supported_versions

LIBRARY_ENV = "TFCE_OPS_LIBRARY"
_REBUILD_HINT = ("rebuild it against the installed TensorFlow with "
                 "`pip install --no-build-isolation -e .` in the "
                 "tf_compressed_embedding source tree")
_BUILD_INFO = re.compile(rb"TFCE_BUILT_FOR_TF=([^;\x00]*);")

_lock = threading.Lock()
_ops_module = None


class OpLibraryError(ImportError):
    """The op library is missing, or was built for another TensorFlow."""


def library_path() -> str:
    """The path of the op library this process uses."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "_ops.so")


def built_for_tf_version(path: str) -> str | None:
    """The TensorFlow version recorded in the library at ``path``."""
    with open(path, "rb") as f:
        match = _BUILD_INFO.search(f.read())
    return match.group(1).decode() if match else None


def _major_minor(version):
    return tuple(version.split(".")[:2])


def _load():
    import tensorflow as tf

    refusal = supported_versions.tf_too_old(tf.__version__)
    if refusal:
        raise OpLibraryError(refusal)
    path = library_path()
    if not os.path.isfile(path):
        raise OpLibraryError(
            f"the tf_compressed_embedding op library is not built ({path} "
            f"does not exist); {_REBUILD_HINT}")
    built = built_for_tf_version(path)
    if built is None:
        raise OpLibraryError(f"{path} is not a tf_compressed_embedding op "
                             f"library (no build information found)")
    if _major_minor(built) != _major_minor(tf.__version__):
        raise OpLibraryError(
            f"{path} was built for TensorFlow {built}, but TensorFlow "
            f"{tf.__version__} is running; {_REBUILD_HINT}")
    try:
        return tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        raise OpLibraryError(
            f"TensorFlow {tf.__version__} could not load {path} ({e}); "
            f"{_REBUILD_HINT}") from None


def ops():
    """The loaded op module (``compressed_embedding_lookup``, ...).

    Raises:
      OpLibraryError: the library is missing or built for another
        TensorFlow (loading is tried again on every call until it works).
    """
    global _ops_module
    if _ops_module is None:
        # Import TensorFlow before taking the lock: that import may run the
        # package's hook, which loads the library through this function.
        import tensorflow  # noqa: F401
        with _lock:
            if _ops_module is None:
                module = _load()
                from tf_compressed_embedding import _batched_inputs, _gradients
                _gradients.register(module)
                _batched_inputs.register_table_reads()
                _ops_module = module
    return _ops_module


def load_ops() -> None:
    """Loads the op library and registers its ops with TensorFlow.

    Importing the package does this once TensorFlow is imported; call it to
    learn at once whether the library can be loaded.

    Raises:
      OpLibraryError: the library is missing or was built for another
        TensorFlow; the message says how to rebuild it.
    """
    ops()


def try_load() -> OpLibraryError | None:
    """Loads the library if possible; returns the failure (an
    OpLibraryError) or None. The next op call tries again and raises it."""
    try:
        ops()
    except OpLibraryError as e:
        return e
    return None


def _library_handle():
    ops()
    lib = ctypes.CDLL(library_path())  # already loaded: no second copy
    for fn in ("tfce_active_isa", "tfce_isa_error", "tfce_supported_isas"):
        getattr(lib, fn).restype = ctypes.c_char_p
    lib.tfce_huge_page_bytes.restype = ctypes.c_int64
    return lib


def supported_isas() -> list[str]:
    """Kernel rows this CPU can run, best first (valid ``TFCE_ISA`` values)."""
    return _library_handle().tfce_supported_isas().decode().split(",")


def active_isa() -> str:
    """The kernel row the ops run on: 'scalar', 'sse', 'avx2' or 'avx512'.

    Raises ValueError when ``TFCE_ISA`` asks for a row this CPU or library
    cannot run.
    """
    lib = _library_handle()
    isa = lib.tfce_active_isa().decode()
    if not isa:
        raise ValueError(lib.tfce_isa_error().decode())
    return isa


def huge_page_bytes() -> int:
    """Bytes of tables the ops have backed with 2 MiB pages in this process.

    0 when ``TFCE_HUGE_PAGES=0``, when every table was under 4 MiB, or where
    the OS cannot collapse pages (not Linux >= 6.1, or THP disabled).
    """
    return int(_library_handle().tfce_huge_page_bytes())

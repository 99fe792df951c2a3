"""Run a function once a module has been imported (a post-import hook).

``import tf_compressed_embedding`` must register the ops with TensorFlow (so
SavedModels that use them load) and the layer with Keras (so ``.keras``
files load), yet importing the package, or its numpy-only formats module,
must not import TensorFlow itself. So registration waits for TensorFlow (or
Keras) to be imported, by whoever imports it: a finder at the front of
``sys.meta_path`` sees the import of that one module name, lets the normal
finders locate it, and wraps its loader so the function runs right after the
module's code has run. If the module is already imported the function runs
at once. This is the post-import hook of PEP 369, as ``wrapt`` and tracing
libraries implement it.
"""
import importlib.abc
import importlib.util
import sys
import threading

_lock = threading.Lock()
_pending = {}  # module name -> [functions]


def when_imported(module_name, function):
    """Calls ``function()`` once ``module_name`` has been imported: at once
    if it has, else right after its code has run (also when it is being
    imported now, in an import this hook saw begin).

    ``function`` must not raise: it runs inside somebody else's ``import``
    statement.
    """
    with _lock:
        if module_name in _pending or module_name not in sys.modules:
            if module_name not in _pending:
                sys.meta_path.insert(0, _Finder(module_name))
            _pending.setdefault(module_name, []).append(function)
            return
    function()


def _run_pending(module_name):
    with _lock:
        functions = _pending.pop(module_name, [])
        sys.meta_path[:] = [f for f in sys.meta_path
                            if getattr(f, "module_name", None) != module_name]
    for function in functions:
        function()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``module_name``'s spec.

    It stays in ``sys.meta_path`` until the module has run: a spec found
    without an import (``importlib.util.find_spec``, as TensorFlow probes
    for Keras) is wrapped too, and the real import comes back here.
    """

    def __init__(self, module_name):
        self.module_name = module_name

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module_name or self not in sys.meta_path:
            return None
        # The real spec, from the finders after this one.
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader; runs the pending functions after it."""

    def __init__(self, loader, module_name):
        self._loader = loader
        self._module_name = module_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Modules (TensorFlow among them) may look at their __loader__ for
        # resources: give them the real one.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_pending(self._module_name)

    def __getattr__(self, name):
        return getattr(self._loader, name)

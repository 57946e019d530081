"""Post-import hooks: run a function right after a module's first import finishes, whichever thread imports
it, without importing it ourselves. A finder on `sys.meta_path` answers only for the watched names: it asks the
finders after it for the real spec and wraps the loader so that `exec_module` calls back when done. The
module's `__loader__` and `__spec__.loader` are the real loader again afterwards."""

import sys
import threading
from typing import Any, Callable, Dict, List

_watched: Dict[str, List[Callable[..., Any]]] = {}  # name -> [callbacks]
_lock = threading.Lock()


def _run(callbacks, module):
    for cb in callbacks:
        try:
            cb(module)
        except Exception as e:  # never into the program
            from . import debug

            debug("hook for %s failed: %r" % (getattr(module, "__name__", "?"), e))


def when_imported(name, callback):
    """Calls `callback(module)` once `name` is imported (at once if it already is)."""
    mod = sys.modules.get(name)
    if mod is not None:
        _run([callback], mod)
        return
    with _lock:
        _watched.setdefault(name, []).append(callback)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


class _Loader(object):
    """The real loader, with a callback after `exec_module`; everything else is the real loader's."""

    def __init__(self, real, name):
        self.__dict__["_vt_real"] = real
        self.__dict__["_vt_name"] = name

    def __getattr__(self, attr):
        return getattr(self.__dict__["_vt_real"], attr)

    def create_module(self, spec):
        real = self.__dict__["_vt_real"]
        create = getattr(real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        real = self.__dict__["_vt_real"]
        name = self.__dict__["_vt_name"]
        try:
            real.exec_module(module)
        finally:
            # The module's own view of its loader is the real one.
            try:
                module.__loader__ = real
                if getattr(module, "__spec__", None) is not None:
                    module.__spec__.loader = real
            except Exception:
                pass
        with _lock:
            callbacks = _watched.pop(name, [])
            if not _watched:
                _remove_finder()
        _run(callbacks, sys.modules.get(name, module))


def _remove_finder():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


class _Finder(object):
    def find_spec(self, name, path=None, target=None):
        if name not in _watched:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path, target)
            except Exception:
                return None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, name)
        return spec

    # Python's importlib asks this of every finder when caches are invalidated.
    def invalidate_caches(self):
        pass

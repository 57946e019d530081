"""JAX: XLA's allocator figures (`Device.memory_stats()`: bytes in use, reserved, largest free block) for the
process's GPUs, sampled like PyTorch's once the program's JAX has created its GPU backend, at exit, and at an
uncaught RESOURCE_EXHAUSTED error (through sys.excepthook, chained). JAX has no out-of-memory observer: an error
the program catches is seen only through the samples."""

import atexit
import os
import sys
import threading
import time
from typing import Any, Dict

from . import _shim, debug

_state: Dict[str, Any] = {"jax": None, "thread": None, "last": {}, "pid": None, "exit_done": False}


def on_import(jax):
    _state["jax"] = jax
    _state["pid"] = os.getpid()
    try:
        t = threading.Thread(target=_watch, name="vramtrace-bridge-jax", daemon=True)
        _state["thread"] = t
        t.start()
        prev = sys.excepthook

        def hook(tp, value, tb):
            try:
                if "RESOURCE_EXHAUSTED" in str(value):
                    _oom(value)
            except Exception:
                pass
            prev(tp, value, tb)

        sys.excepthook = hook
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork)
    except Exception as e:
        debug("jax hook failed: %r" % (e,))


def _after_fork():
    _state["thread"] = None
    _state["last"] = {}
    _state["pid"] = os.getpid()


def _gpus():
    """The process's GPU devices, only once JAX has made its backends (never makes them itself)."""
    jax = _state["jax"]
    try:
        from jax._src import xla_bridge

        if not getattr(xla_bridge, "_backends", None):
            return []
        return [d for d in jax.local_devices() if d.platform == "gpu"]
    except Exception:
        return []


def _values(stats):
    inuse = int(stats.get("bytes_in_use", 0))
    reserved = int(stats.get("bytes_reserved", 0) or stats.get("pool_bytes", 0) or stats.get("bytes_limit", 0))
    return (inuse, reserved, inuse, 0, 0, 0, 0)


def _sample(force=False):
    out = []
    for d in _gpus():
        try:
            ts = time.monotonic_ns()
            stats = d.memory_stats() or {}
        except Exception:
            continue
        vals = _values(stats)
        idx = getattr(d, "local_hardware_id", None)
        if idx is None:
            idx = d.id
        if force or _state["last"].get(idx) != vals:
            _state["last"][idx] = vals
            _shim.sample(_shim.JAX, idx, vals, ts)
        out.append((idx, stats))
    return out


def _watch():
    me = threading.current_thread()
    period = max(1, int(os.environ.get("VRAMTRACE_TORCH_SAMPLE_MS", "20") or 20)) / 1000.0
    while _state["thread"] is me:
        try:
            _sample()
        except Exception:
            pass
        time.sleep(period)


def _figures(stats):
    """The allocator's figures, as the `oom` and `exit` records name them (bridge/schema.json)."""
    keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_reserved", "bytes_limit", "num_allocs", "largest_alloc_size")
    out = {k: _shim.count(stats[k]) for k in keys if k in stats}
    # The largest free block under the name the PyTorch side sends, not JAX's own.
    if "largest_free_block_bytes" in stats:
        out["largest_free_block"] = _shim.count(stats["largest_free_block_bytes"])
    return out


def _oom(err):
    for idx, stats in _sample(force=True):
        _shim.record("oom", idx, dict(framework="jax", error=str(err)[:500], **_figures(stats)), ack=True)


def _at_exit():
    try:
        if _state["exit_done"] or _state["pid"] != os.getpid():
            return
        _state["exit_done"] = True
        _state["thread"] = None
        for idx, stats in _sample(force=True):
            _shim.record("exit", idx, dict(framework="jax", **_figures(stats)))
    except Exception:
        pass

"""PyTorch: attach to the caching allocator once the program's torch initialises CUDA.

- allocated / reserved (and active, inactive split, requested, retries, OOM count) per device, read by a daemon
  thread every VRAMTRACE_TORCH_SAMPLE_MS and sent when they changed;
- at every out-of-memory error, from PyTorch's own observer (called after the allocator's lock is released and
  before the exception is raised): the figures, the allocator's settings, the largest free block and the free
  bytes in segments that cannot be released, sent synchronously (the shim waits for the collector to hold it);
- with VRAMTRACE_TORCH_HISTORY, PyTorch's allocation history with Python stacks, dumped beside the trace at each
  out-of-memory error and at exit (pickle protocol 4, which memory_viz opens);
- at exit, a last sample and an `exit` record.
Everything here swallows its own errors: the program runs exactly as without vramtrace."""

import atexit
import os
import sys
import threading
import time

from . import _shim, debug

_state = {
    "torch": None,
    "attached": False,
    "pid": None,
    "thread": None,
    "last": {},  # device -> tuple of the last values sent
    "active": set(),  # devices seen holding memory
    "ooms": 0,
    "history": 0,
    "exit_done": False,
}
_lock = threading.RLock()

STAT_KEYS = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
# Devices are re-scanned for new activity this often; between scans only active ones are read.
DISCOVER_S = 1.0


def _env_int(name, default):
    try:
        v = os.environ.get(name, "").strip()
        return int(v) if v else default
    except ValueError:
        return default


def on_import(torch):
    """torch was imported: attach when (or now, if) it initialises CUDA."""
    _state["torch"] = torch
    try:
        cuda = torch.cuda
        lazy = getattr(cuda, "_lazy_call", None)
        if lazy is None:
            return _note(None, "torch %s has no torch.cuda._lazy_call: the bridge did not attach" % _version(torch))
        lazy(_attach)
    except Exception as e:
        debug("torch import hook failed: %r" % (e,))
    try:
        os.register_at_fork(after_in_child=_after_fork)
    except Exception:
        pass


def _version(torch):
    return getattr(torch, "__version__", "?")


def _after_fork():
    # Only the forking thread survives: the sampler is gone, and the allocator's figures in this copy of the
    # parent's memory are the parent's, not ours: say nothing of them (CUDA cannot be used again here). A child
    # of a parent that never initialised CUDA attaches afresh through torch's own queued call.
    _state["thread"] = None
    _state["last"] = {}
    _state["active"] = set()
    _state["attached"] = False
    _state["pid"] = None
    _state["exit_done"] = False


def _attach():
    """Runs inside torch.cuda's lazy initialisation (or at once if it was done): must never raise."""
    try:
        _attach_unsafe()
    except Exception as e:
        debug("attach failed: %r" % (e,))
        _note(None, "the PyTorch bridge could not attach: %r" % (e,))


def _attach_unsafe():
    torch = _state["torch"]
    with _lock:
        if _state["attached"] and _state["pid"] == os.getpid():
            return
        _state["attached"] = True
        _state["pid"] = os.getpid()
    if not _shim.available():
        debug("libvramtrace.so is not loaded: nothing to attach to")
        return
    # Runs under torch.cuda's (non-reentrant) initialisation lock, before torch calls itself initialised:
    # nothing here may call torch.cuda._lazy_call, and memory_stats() would still answer {}.
    problems = []
    backend = _backend(torch)
    observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if backend != "native":
        # PyTorch's cudaMallocAsync backend refuses observers and history: its figures come from the samples.
        problems.append("backend %s: no out-of-memory observer or allocation history in PyTorch" % backend)
    elif observer is not None:
        try:
            observer(_on_oom)
        except Exception as e:
            problems.append("out-of-memory observer: %r" % (e,))
    else:
        problems.append("no out-of-memory observer in this torch")
    entries = _env_int("VRAMTRACE_TORCH_HISTORY", 0)
    if entries > 0 and backend == "native":
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=entries
            )
            _state["history"] = entries
        except Exception as e:
            problems.append("allocation history: %r" % (e,))
    fields = [
        ("bridge", "1"),
        ("torch", _version(torch)),
        ("python", "%d.%d.%d" % sys.version_info[:3]),
        ("backend", backend),
        ("alloc_conf", _alloc_conf()),
        ("sample_ms", _interval_ms()),
        ("history_entries", _state["history"]),
        ("devices", _device_count(torch)),
    ]
    for i, p in enumerate(problems):
        fields.append(("problem.%d" % i, p))
    _shim.record("attach", None, fields)
    _start_sampler()
    atexit.register(_at_exit)
    # multiprocessing's forked children end in os._exit, which skips atexit; they run its finalizers first.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        try:
            mp_util.Finalize(None, _at_exit, exitpriority=-1000)
        except Exception:
            pass


def _interval_ms():
    return max(1, _env_int("VRAMTRACE_TORCH_SAMPLE_MS", 20))


def _backend(torch):
    try:
        return torch.cuda.get_allocator_backend()
    except Exception:
        return "native"


def _alloc_conf():
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""


def _conf_value(key):
    """A setting of PYTORCH_CUDA_ALLOC_CONF (`key:value,key:value`), or None."""
    for part in _alloc_conf().split(","):
        k, _, v = part.partition(":")
        if k.strip() == key:
            return v.strip()
    return None


def _device_count(torch):
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


# ---- sampling ----------------------------------------------------------------------------------------------


def _raw_stats(torch, device):
    """The allocator's nested stats dict for one device, built in C++ (cheaper than memory_stats()'s flat one)."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.memory.memory_stats_as_nested_dict(device)


def _values(stats):
    """allocated, reserved, active, inactive_split, requested, alloc_retries, ooms from a nested stats dict."""
    out = []
    for k in STAT_KEYS:
        try:
            out.append(int(stats[k]["all"]["current"]))
        except Exception:
            out.append(0)
    out.append(int(stats.get("num_alloc_retries", 0) or 0))
    out.append(int(stats.get("num_ooms", 0) or 0))
    return tuple(out)


def sample_device(device, force=False):
    """Reads one device's figures and sends them if they changed (or `force`). Returns them, or None."""
    torch = _state["torch"]
    try:
        ts = time.monotonic_ns()
        vals = _values(_raw_stats(torch, device))
    except Exception:
        return None
    if vals[1] > 0:
        _state["active"].add(device)
    if force or _state["last"].get(device) != vals:
        if vals[1] > 0 or device in _state["last"]:
            _state["last"][device] = vals
            _shim.sample(_shim.TORCH, device, vals, ts)
    return vals


def _sampler():
    torch = _state["torch"]
    me = threading.current_thread()
    period = _interval_ms() / 1000.0
    next_scan = 0.0
    while _state["thread"] is me:
        try:
            now = time.monotonic()
            if now >= next_scan:
                devices = range(_device_count(torch))
                next_scan = now + DISCOVER_S
            else:
                devices = sorted(_state["active"])
            for d in devices:
                sample_device(d)
        except Exception:
            pass
        time.sleep(period)


def _start_sampler():
    with _lock:
        if _state["thread"] is not None:
            return
        t = threading.Thread(target=_sampler, name="vramtrace-bridge", daemon=True)
        _state["thread"] = t
        try:
            t.start()
        except Exception:
            _state["thread"] = None


# ---- out of memory -----------------------------------------------------------------------------------------


def _on_oom(device, alloc, device_allocated, device_free):
    """PyTorch's observer: (device, bytes asked for, bytes allowed or the device's total, device free)."""
    try:
        _oom_unsafe(device, alloc, device_allocated, device_free)
    except Exception as e:
        debug("out-of-memory observer failed: %r" % (e,))


def segment_figures(snapshot, device):
    """From a `torch.cuda.memory._snapshot()`: segments, the largest free block, and the free bytes inside
    segments that hold a live block (PyTorch cannot give those back to the driver)."""
    segments = 0
    largest_free = 0
    stuck_free = 0
    expandable = False
    for seg in snapshot.get("segments", []):
        if seg.get("device") != device:
            continue
        segments += 1
        expandable = expandable or bool(seg.get("is_expandable"))
        blocks = seg.get("blocks", [])
        live = any(b.get("state") != "inactive" for b in blocks)
        for b in blocks:
            if b.get("state") == "inactive":
                size = int(b.get("size", 0))
                largest_free = max(largest_free, size)
                if live:
                    stuck_free += size
    return segments, largest_free, stuck_free, expandable


def _oom_unsafe(device, alloc, allowed, device_free):
    torch = _state["torch"]
    _state["ooms"] += 1
    n = _state["ooms"]
    vals = sample_device(device, force=True) or (0,) * 7
    try:
        stats = torch.cuda.memory_stats(device)
    except Exception:
        stats = {}
    fields = [
        ("requested", int(alloc)),
        ("allowed_or_total", int(allowed)),
        ("device_free", int(device_free)),
        ("allocated", vals[0]),
        ("reserved", vals[1]),
        ("active", vals[2]),
        ("inactive_split", vals[3]),
        ("requested_current", vals[4]),
        ("alloc_retries", vals[5]),
        ("ooms", vals[6]),
        ("backend", _backend(torch)),
        ("alloc_conf", _alloc_conf()),
        ("expandable_segments", _conf_value("expandable_segments")),
        ("garbage_collection_threshold", _conf_value("garbage_collection_threshold")),
        ("max_split_size", stats.get("max_split_size")),
        ("oversize_allocations", stats.get("oversize_allocations.current")),
        ("thread", _thread_name()),
    ]
    try:
        fields.append(("allocated_peak", int(stats.get("allocated_bytes.all.peak", 0))))
        fields.append(("reserved_peak", int(stats.get("reserved_bytes.all.peak", 0))))
    except Exception:
        pass
    snap = None
    if _backend(torch) == "native":
        try:
            snap = torch.cuda.memory._snapshot()
            segments, largest, stuck, expandable = segment_figures(snap, device)
            fields += [
                ("segments", segments),
                ("largest_free_block", largest),
                ("free_in_live_segments", stuck),
                ("segments_expandable", expandable),
            ]
        except Exception as e:
            fields.append(("segments_error", repr(e)))
    if _state["history"] and snap is not None:
        path = _dump(snap, "oom%d" % n)
        if path:
            fields.append(("snapshot", path))
    _shim.record("oom", device, fields, ack=True)


def _thread_name():
    """The OS name of the calling thread (autograd's device threads are `pt_autograd_N`; Python's own name for
    a thread it did not start says nothing)."""
    try:
        with open("/proc/self/task/%d/comm" % threading.get_native_id()) as f:
            return f.read().strip()
    except Exception:
        return threading.current_thread().name


def _dump(snap, tag):
    """Writes a snapshot beside the trace; its path, or None."""
    trace = os.environ.get("VRAMTRACE_TRACE")
    if not trace:
        return None
    path = "%s.torch-%d-%s.pickle" % (trace, os.getpid(), tag)
    try:
        import pickle

        tmp = path + ".part"
        with open(tmp, "wb") as f:
            # Protocol 4: memory_viz reads 2 to 4. Without the memo ("fast"): shared frames are written out
            # each time, which the collector's reader (serde-pickle 1.2 mis-resolves shared references) needs.
            p = pickle.Pickler(f, protocol=4)
            p.fast = True
            p.dump(snap)
        os.replace(tmp, path)
        return path
    except Exception as e:
        _note(None, "could not write the allocation history to %s: %r" % (path, e))
        try:
            os.unlink(path + ".part")
        except Exception:
            pass
        return None


# ---- exit --------------------------------------------------------------------------------------------------


def _at_exit():
    try:
        _exit_unsafe()
    except Exception:
        pass


def _exit_unsafe():
    if _state["exit_done"] or _state["pid"] != os.getpid():
        return
    _state["exit_done"] = True
    _state["thread"] = None  # the sampler stops
    torch = _state["torch"]
    # Every device: a short-lived process may end before the sampler first looked.
    for d in range(_device_count(torch)):
        vals = sample_device(d, force=d in _state["last"])
        if vals is None or d not in _state["last"]:
            continue
        # Acknowledged: everything the process queued before it reaches the trace too, even if the process
        # then ends in os._exit.
        _shim.record(
            "exit",
            d,
            [("allocated", vals[0]), ("reserved", vals[1]), ("alloc_retries", vals[5]), ("ooms", vals[6])],
            ack=True,
        )
    if _state["history"]:
        try:
            snap = torch.cuda.memory._snapshot()
            path = _dump(snap, "exit")
            if path:
                _shim.record("snapshot", None, [("at", "exit"), ("path", path)])
        except Exception as e:
            _note(None, "could not take the allocation history at exit: %r" % (e,))


def _note(device, text):
    try:
        _shim.record("note", device, [("text", text)])
    except Exception:
        pass

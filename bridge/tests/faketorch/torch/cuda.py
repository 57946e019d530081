import ctypes
import os
import threading

_initialized = False
_queued = []
_lock = threading.Lock()
_backend = "cudaMallocAsync" if "backend:cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "native"
_alloc = {}
# The allocation history: on or off, and every _record_memory_history call as (enabled, keywords).
_history = {"on": False, "calls": [], "trace": [], "max": 0}
_fraction = {}

MB = 1 << 20


class _Driver(object):
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuInit(0)
        dev = ctypes.c_int(0)
        self.lib.cuDeviceGet(ctypes.byref(dev), 0)
        self.ctx = ctypes.c_void_p()
        self.lib.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, dev)

    def malloc(self, n):
        p = ctypes.c_uint64()
        r = self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return p.value if r == 0 else None

    def free(self, p):
        self.lib.cuMemFree_v2(ctypes.c_uint64(p))

    def free_mem(self):
        # Any thread (the bridge's sampler asks too): PyTorch's mem_get_info sets the device on the caller.
        self.lib.cuCtxSetCurrent(self.ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


class _HostDriver(object):
    """No driver at all (FAKETORCH_TOTAL=bytes): addresses from a counter, for the bridge's own tests, which run
    without the shim or the simulated driver."""

    def __init__(self, total):
        self.total = total
        self.used = 0
        self.next = 1 << 40
        self.sizes = {}

    def malloc(self, n):
        if self.used + n > self.total:
            return None
        p = self.next
        self.next += n
        self.used += n
        self.sizes[p] = n
        return p

    def free(self, p):
        self.used -= self.sizes.pop(p, 0)

    def free_mem(self):
        return self.total - self.used, self.total


def _driver():
    total = os.environ.get("FAKETORCH_TOTAL")
    return _HostDriver(int(total)) if total else _Driver()


class _Allocator(object):
    """Segments from the driver, carved first-fit into blocks; a failed segment request frees every wholly free
    segment and retries once, as PyTorch's does. With PYTORCH_NO_CUDA_MEMORY_CACHING=1 (read once, as PyTorch
    does), every tensor is its own driver allocation and no figure is kept: the stats stay zeros."""

    def __init__(self, driver, device):
        self.d = driver
        self.device = device
        self.uncached = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
        self.segments = []  # [addr, size, [[offset, size, live]], small pool]
        self.allocated = 0
        self.reserved = 0
        # PyTorch's peak counters: the most since the start or the last reset_peak_memory_stats().
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.retries = 0
        self.ooms = 0

    def inactive_split(self):
        return sum(b[1] for s in self.segments for b in s[2] if not b[2] and any(x[2] for x in s[2]))

    def malloc(self, n):
        if self.uncached:
            p = self.d.malloc(n)
            if p is None:
                raise RuntimeError("CUDA error: out of memory")  # C10_CUDA_CHECK's, not PyTorch's own error
            return (p, n)
        small = n <= MB  # PyTorch's small pool: its own 2 MiB segments, never shared with large blocks
        for s in self.segments:
            if s[3] != small:
                continue
            for i, b in enumerate(s[2]):
                if not b[2] and b[1] >= n:
                    if b[1] > n:
                        s[2].insert(i + 1, [b[0] + n, b[1] - n, False])
                    b[1] = n
                    b[2] = True
                    b.append(_frames())
                    self.allocated += n
                    self.allocated_peak = max(self.allocated_peak, self.allocated)
                    _trace("alloc", s[0] + b[0], n, b[3])
                    return (s[0] + b[0], n)
        # PyTorch's segment sizes: 2 MiB for the small pool, 20 MiB under 10 MiB, else rounded up to 2 MiB.
        size = 2 * MB if small else 20 * MB if n < 10 * MB else -(-n // (2 * MB)) * 2 * MB
        p = self.d.malloc(size)
        if p is None:
            self.retries += 1
            for s in [s for s in self.segments if not any(b[2] for b in s[2])]:
                self.d.free(s[0])
                self.reserved -= s[1]
                self.segments.remove(s)
                _trace("segment_free", s[0], s[1])
            p = self.d.malloc(size)
        if p is None:
            self.ooms += 1
            free, total = self.d.free_mem()
            _trace("oom", free, size, _frames())
            from . import _C
            for obs in list(_C._observers):
                obs(self.device, size, total, free)
            import torch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate %d bytes" % size)
        self.segments.append([p, size, [[0, size, False]], small])
        _trace("segment_alloc", p, size)
        self.reserved += size
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        return self.malloc(n)

    def free(self, t):
        addr, n = t
        if self.uncached:
            self.d.free(addr)
            return
        for s in self.segments:
            for b in s[2]:
                if s[0] + b[0] == addr and b[2]:
                    b[2] = False
                    del b[3:]
                    self.allocated -= n
                    _trace("free_requested", addr, n)
                    _trace("free_completed", addr, n)
                    # Neighbouring free blocks merge, as PyTorch's do: a segment's free space is one block.
                    merged = []
                    for x in s[2]:
                        if merged and not merged[-1][2] and not x[2]:
                            merged[-1][1] += x[1]
                        else:
                            merged.append(x)
                    s[2][:] = merged
                    return

    def snapshot(self):
        return [
            {
                "device": self.device,
                "address": s[0],
                "total_size": s[1],
                "is_expandable": False,
                "blocks": [
                    {"address": s[0] + b[0], "size": b[1], "state": "active_allocated" if b[2] else "inactive",
                     "frames": b[3] if len(b) > 3 else []}
                    for b in s[2]
                ],
            }
            for s in self.segments
        ]


def _trace(action, addr, size, frames=None):
    """An entry of the history's ring, as PyTorch's `device_traces` hold them (while it is on)."""
    if not _history["on"]:
        return
    import time
    t = _history["trace"]
    t.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time.time_ns() // 1000,
              "frames": frames if frames is not None else []})
    if _history["max"] and len(t) > _history["max"]:
        del t[0]


def _frames():
    """The allocation's Python stack, innermost first, as PyTorch's history records it (when it is on)."""
    if not _history["on"]:
        return []
    import traceback
    return [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(traceback.extract_stack())]


def _lazy_call(fn, **kw):
    with _lock:
        if _initialized:
            fn()
        else:
            _queued.append(fn)


def init():
    """torch.cuda.init(): queued calls run under the lock, before is_initialized() says True."""
    global _initialized
    with _lock:
        if _initialized:
            return
        _alloc[0] = _Allocator(_driver(), 0)
        for fn in _queued:
            fn()
        del _queued[:]
        _initialized = True


def is_initialized():
    return _initialized


def current_device():
    if not _initialized:
        raise RuntimeError("current_device() before CUDA initialised: the bridge must never ask then")
    return 0


def device_count():
    return 1


def get_allocator_backend():
    return _backend


def mem_get_info(device=0):
    """(free, total) as the driver says: under vramtrace's cap the shim reports the cap as the total."""
    return _alloc[device].d.free_mem()


def set_per_process_memory_fraction(fraction, device=0):
    _fraction[device] = fraction


def get_per_process_memory_fraction(device=0):
    return _fraction.get(device, 1.0)


def _reset():
    """A fresh torch, as in a new process (the bridge's in-process tests)."""
    global _initialized
    from . import _C
    with _lock:
        _initialized = False
        del _queued[:]
        _alloc.clear()
        _fraction.clear()
        _history["on"] = False
        del _history["calls"][:]
        del _history["trace"][:]
        del _C._observers[:]


def empty(nbytes, device=0):
    init()
    return _alloc[device].malloc(nbytes)


def release(t, device=0):
    _alloc[device].free(t)


def reset_peak_memory_stats(device=None):
    """PyTorch's: the peaks start again from the current figures."""
    a = _alloc[device or 0]
    a.allocated_peak = a.allocated
    a.reserved_peak = a.reserved


def max_memory_allocated(device=None):
    return _alloc[device or 0].allocated_peak


def max_memory_reserved(device=None):
    return _alloc[device or 0].reserved_peak


class memory(object):
    # torch.cuda.memory's own, which torch.cuda re-exports: one function object under both names.
    reset_peak_memory_stats = staticmethod(reset_peak_memory_stats)

    @staticmethod
    def memory_stats_as_nested_dict(device):
        from . import _C
        return _C._cuda_memoryStats(device)

    @staticmethod
    def _snapshot():
        if _backend != "native":
            raise RuntimeError("cudaMallocAsync does not yet support snapshot")
        segs = []
        for a in _alloc.values():
            segs += a.snapshot()
        return {"segments": segs, "device_traces": [list(_history["trace"])]}

    @staticmethod
    def _record_memory_history(enabled="all", **kw):
        """PyTorch's: None turns it off; a live block keeps the frames it was allocated with either way."""
        if _backend != "native":
            raise RuntimeError("cudaMallocAsync does not yet support recordHistory")
        _history["calls"].append((enabled, kw))
        _history["on"] = enabled is not None
        if enabled is not None:
            _history["max"] = int(kw.get("max_entries", 0) or 0)


def memory_stats(device=0):
    from . import _C
    out = {}
    for k, v in _C._cuda_memoryStats(device).items():
        if isinstance(v, dict):
            for pool, d in v.items():
                for f, x in d.items():
                    out["%s.%s.%s" % (k, pool, f)] = x
        else:
            out[k] = v
    return out

"""The allocator's figures: allocated / reserved (and active, inactive split, requested, retries, OOM count) per
device, read by a daemon thread every VRAMTRACE_TORCH_SAMPLE_MS (within SAMPLER_SHARE of the time) and sent when
they changed; PyTorch's own peaks (`allocated_bytes.all.peak`, `reserved_bytes.all.peak`: what
max_memory_allocated() and max_memory_reserved() say), from the same reading, in a `peak` record whenever one
passes the most sent so far, read once more just before the program's reset_peak_memory_stats() (wrapped here),
so a peak between two samples is never lost to sampling or to a reset. Each round the thread also sends a `steps`
record when the program stepped (`send_steps`), feeds each sample to the history's arming (_history.py) and,
once a second, looks for a holders request (_walks.py).

It may touch: torch's allocator stats (`torch._C._cuda_memoryStats`), torch.cuda.device_count(),
torch.cuda.reset_peak_memory_stats (wrapped), _state.state's sampler keys (thread, last, active, peaks; it reads
torch, attached and pid), _steps.counters' `sent`, and the shim (`sample`, `peak` and `steps` records). The
stats readers (`raw_stats`, `values`, `peaks`) serve the boundary's reading in _torch.py too."""

import functools
import os
import threading
import time

from . import _history, _settings, _shim, _state, _steps, _walks

STAT_KEYS = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
# The sampler's own work is at most this share of the time: it waits longer than VRAMTRACE_TORCH_SAMPLE_MS when
# a round costs more than this share of it.
SAMPLER_SHARE = 0.003
SAMPLER_MAX_WAIT = 10  # periods
# Devices are re-scanned for new activity this often; between scans only active ones are read.
DISCOVER_S = 1.0
REQUEST_EVERY_S = 1.0  # how often the sampler looks for a holders request


def wrap_reset(torch):
    """torch.cuda.reset_peak_memory_stats (and reset_max_memory_allocated, which calls it) reads the peaks
    first: a peak the program takes back between two samples is still sent. Called only by programs that
    reset (benchmarks, per-epoch reports), at the cost of one reading of the stats."""
    cuda = getattr(torch, "cuda", None)
    mem = getattr(cuda, "memory", None)
    real = getattr(mem, "reset_peak_memory_stats", None) or getattr(cuda, "reset_peak_memory_stats", None)
    if real is None or getattr(real, "_vramtrace", False):
        return

    @functools.wraps(real)
    def reset_peak_memory_stats(*args, **kwargs):
        _before_reset()
        return real(*args, **kwargs)

    reset_peak_memory_stats._vramtrace = True
    for owner in (mem, cuda):
        if owner is not None and getattr(owner, "reset_peak_memory_stats", None) is real:
            owner.reset_peak_memory_stats = reset_peak_memory_stats


def _before_reset():
    """A sample of every device (the sampler may not have looked yet), with the peaks it is about to lose."""
    try:
        if not _state.state["attached"] or _state.state["pid"] != os.getpid():
            return
        for d in range(device_count(_state.state["torch"])):
            sample_device(d)
    except Exception:
        pass


def device_count(torch):
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def raw_stats(torch, device):
    """The allocator's nested stats dict for one device, built in C++ (cheaper than memory_stats()'s flat one)."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.memory.memory_stats_as_nested_dict(device)


def values(stats):
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


def peaks(stats):
    """PyTorch's own peaks from a nested stats dict, (allocated, reserved): what max_memory_allocated() and
    max_memory_reserved() say (cudaMallocAsync: its pool's used and reserved high-water marks). Since the start,
    or since the program's last reset_peak_memory_stats()."""
    out = []
    for k in ("allocated_bytes", "reserved_bytes"):
        try:
            out.append(max(0, int(stats[k]["all"]["peak"])))
        except Exception:
            out.append(0)
    return tuple(out)


def _offer_peaks(device, read):
    """A `peak` record when either peak passes the most sent for the device: a reset only lowers PyTorch's
    counters, and the collector keeps the most over the run."""
    peaks_sent = _state.state.setdefault("peaks", {})
    sent = peaks_sent.get(device, (0, 0))
    if read[0] > sent[0] or read[1] > sent[1]:
        best = (max(read[0], sent[0]), max(read[1], sent[1]))
        peaks_sent[device] = best
        _shim.record("peak", device, {"allocated_peak": best[0], "reserved_peak": best[1]})


def sample_device(device, force=False):
    """Reads one device's figures and sends them if they changed (or `force`), then PyTorch's peaks from the same
    reading if they passed the most sent. Returns the figures, or None."""
    torch = _state.state["torch"]
    try:
        ts = time.monotonic_ns()
        stats = raw_stats(torch, device)
        vals = values(stats)
    except Exception:
        return None
    if vals[1] > 0:
        _state.state["active"].add(device)
    if force or _state.state["last"].get(device) != vals:
        if vals[1] > 0 or device in _state.state["last"]:
            _state.state["last"][device] = vals
            _shim.sample(_shim.TORCH, device, vals, ts)
    if device in _state.state["last"]:
        _offer_peaks(device, peaks(stats))
    return vals


def send_steps():
    """A `steps` record when the program stepped since the last one."""
    s = _steps.counters
    now = (s.optimizer, s.batches, s.scopes)
    if now == s.sent:
        return
    s.sent = now
    _shim.record("steps", None, {"optimizer": now[0], "batches": now[1], "scopes": now[2], "t_ns": s.t_ns})


def _loop():
    torch = _state.state["torch"]
    me = threading.current_thread()
    period = _settings.interval_ms() / 1000.0
    next_scan = 0.0
    next_request = 0.0
    while _state.state["thread"] is me:
        t0 = time.thread_time()
        try:
            send_steps()
        except Exception:
            pass
        try:
            now = time.monotonic()
            if now >= next_request:
                next_request = now + REQUEST_EVERY_S
                w = time.thread_time()
                _walks.holders_on_request()
                t0 += time.thread_time() - w  # a walk on request is not the sampler's own pace
            if now >= next_scan:
                devices = range(device_count(torch))
                next_scan = now + DISCOVER_S
            else:
                devices = sorted(_state.state["active"])
            for d in devices:
                vals = sample_device(d)
                if vals is not None:
                    _history.watch(d, vals)
        except Exception:
            pass
        # Its own work (reading the allocator's stats holds the GIL the program needs) stays under SAMPLER_SHARE
        # of the time: a round that cost 130 us (a CPU-bound H200 host) waits 43 ms, not 20.
        # Its own CPU time (not time spent waiting for the GIL), and never more than SAMPLER_MAX_WAIT periods.
        time.sleep(min(max(period, (time.thread_time() - t0) / SAMPLER_SHARE), period * SAMPLER_MAX_WAIT))


def start():
    with _state.lock:
        if _state.state["thread"] is not None:
            return
        t = threading.Thread(target=_loop, name="vramtrace-bridge", daemon=True)
        _state.state["thread"] = t
        try:
            t.start()
        except Exception:
            _state.state["thread"] = None

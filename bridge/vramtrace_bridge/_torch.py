"""PyTorch: attach to the caching allocator once the program's torch initialises CUDA.

- allocated / reserved (and active, inactive split, requested, retries, OOM count) per device, read by a daemon
  thread every VRAMTRACE_TORCH_SAMPLE_MS and sent when they changed;
- PyTorch's own peaks (`allocated_bytes.all.peak`, `reserved_bytes.all.peak`: what max_memory_allocated() and
  max_memory_reserved() say), from the same reading, in a `peak` record whenever one passes the most sent so far,
  at steps' boundaries and at exit; read once more just before the program's reset_peak_memory_stats(), so a
  peak between two samples is never lost to sampling or to a reset;
- at every out-of-memory error, from PyTorch's own observer (called after the allocator's lock is released and
  before the exception is raised): the figures, the allocator's settings, the largest free block and the free
  bytes in segments that cannot be released, sent synchronously (the shim waits for the collector to hold it);
- PyTorch's allocation history with Python stacks (native backend only), kept while it pays: by default armed
  by the sampler when the allocator retries, when allocated bytes pass 90% of the device's limit or when their
  floor keeps rising, and disarmed once that has been gone for 10 s (Arming says exactly when), each move a
  `history` record; VRAMTRACE_TORCH_HISTORY=N keeps N entries from the start, `off` never. While armed, the
  snapshot is dumped beside the trace at each out-of-memory error, and at exit (pickle protocol 4, which
  memory_viz opens): a live block keeps its frames on itself, so the dump names the lines of live tensors;
- the program's steps (optimizer steps, DataLoader batches, no_grad scopes: counted in _steps.py), a `steps`
  record from the sampler when they moved, and the allocated bytes read at their boundaries within their share
  of the time (here); the floor of allocated bytes per step, so a leak arms the history within a few steps;
- what holds the CUDA tensors (a bounded walk of the program's objects, _holders.py), a `holders` record at
  each out-of-memory error, at the exit of a job whose memory grew, and when `<trace>.holders-<pid>.request`
  appears: nothing of it runs before then;
- at exit, a last sample and an `exit` record;
- with VRAMTRACE_STOP_STEPS=N (`run --stop-after-steps N`, which `fit` uses), the process ends itself at the
  boundary of its N-th step: the `exit` work above, a `stopped` record, then `os._exit(0)` (the program's own
  cleanup is skipped on purpose: a `finally:` that saves a checkpoint must not overwrite one with N steps).
Everything here swallows its own errors: the program runs exactly as without vramtrace."""

import atexit
import functools
import os
import sys
import threading
import time
from typing import Any, Dict

from . import _holders, _shim, _steps, debug
from ._arming import Arming, history_setting

_state: Dict[str, Any] = {
    "torch": None,
    "attached": False,
    "pid": None,
    "thread": None,
    "last": {},  # device -> tuple of the last values sent
    "active": set(),  # devices seen holding memory
    "ooms": 0,
    "history": 0,  # entries of the ring while PyTorch keeps the history (armed), else 0
    "arming": None,  # Arming: when to keep it
    "exit_done": False,
    "peaks": {},  # device -> the most (allocated peak, reserved peak) sent
    "stop_steps": 0,  # VRAMTRACE_STOP_STEPS: end the process at the boundary of this step (0: never)
    "stopping": False,
}
_lock = threading.RLock()
# Arming and disarming against the exit's last look at the history: one at a time.
_history_lock = threading.Lock()

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
MIB = 1 << 20

HOLDERS_DEADLINE_S = 1.0
REQUEST_EVERY_S = 1.0  # how often the sampler looks for a holders request
REQUEST_WALK_EVERY_S = 60.0  # and answers one at most this often
OOM_WALKS = 3  # out-of-memory errors of a process walked each; after them, one walk a minute at most
OOM_WALK_EVERY_S = 60.0
# At a step's boundary (after optimizer.step(), or as a batch is drawn) allocated bytes are read: the same moment
# of every step, so what a step kept is exact (a sampler's reading falls anywhere in a step). Each reading waits
# until the program has run for its cost over this share, so they never take more of its time, however short its
# steps (a reading of 80 us, as on an H200 host: at most one every 40 ms).
BOUNDARY_SHARE = 0.002
# ... except the first this many, read at every step: a leak that fills a cap in a few dozen steps (a CPU side
# running ahead of the GPU queues them in milliseconds) is read exactly, for a cost paid once.
BOUNDARY_FREE = 64


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
        _wrap_reset(torch)
    except Exception as e:
        debug("reset_peak_memory_stats wrapper failed: %r" % (e,))
    try:
        os.register_at_fork(after_in_child=_after_fork)
    except Exception:
        pass


def _wrap_reset(torch):
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
        if not _state["attached"] or _state["pid"] != os.getpid():
            return
        for d in range(_device_count(_state["torch"])):
            sample_device(d)
    except Exception:
        pass


def _version(torch):
    return getattr(torch, "__version__", "?")


def _stop(counter, n):
    """The N-th step is done and `run --stop-after-steps N` asked to stop there: what exit would send (figures,
    holders of a growing job, the history's snapshot), a `stopped` record, then the process ends at once. Only in
    the process that attached (a forked child counts its own steps from 0 and stops at its own N-th)."""
    if _state["stopping"] or _state["pid"] != os.getpid():
        return
    _state["stopping"] = True
    try:
        _exit_unsafe()
    except Exception as e:
        debug("exit at stop failed: %r" % (e,))
    try:
        _shim.record("stopped", None, {"counter": counter, "steps": n}, ack=True)
    except Exception:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(0)


def _on_boundary(counter, s):
    """A step's boundary (_steps.py): the reading, then the stop `run --stop-after-steps` asked for. Optimizer
    steps stop at the N-th; batches when batch N+1 is drawn (a loop over batches has no other boundary); scopes
    never (a training script's evaluation before its first optimizer step would end it there)."""
    _boundary(s)
    stop = _state["stop_steps"]
    if not stop:
        return
    if counter == "optimizer" and s.optimizer >= stop:
        _stop("optimizer", s.optimizer)
    elif counter == "batches" and s.batches > stop:
        _stop("batches", s.batches - 1)


def _boundary(s):
    """At a step's boundary: the current device's allocated bytes, sent with the counts (`steps` with `device`
    and `allocated`), within BOUNDARY_SHARE of the program's time. Only once the bridge attached (torch
    initialised CUDA): asking earlier would initialise it."""
    now = s.t_ns
    if (now < s.next_read_ns and s.reads >= BOUNDARY_FREE) or not _state["attached"] or _state["pid"] != os.getpid():
        return
    s.reads += 1
    t0 = time.perf_counter_ns()
    try:
        _read_boundary(s, now)
    finally:
        s.next_read_ns = now + int(max(time.perf_counter_ns() - t0, 1000) / BOUNDARY_SHARE)


def _read_boundary(s, now):
    torch = _state["torch"]
    dev = torch.cuda.current_device()
    if dev not in s.room_read:
        # Once per device, at its first step: the driver's free memory (the shim records it, with the device's
        # total), so a trace says how much room the job had beside the CUDA context and other processes.
        s.room_read.add(dev)
        try:
            torch.cuda.mem_get_info(dev)
        except Exception:
            pass
    stats = _raw_stats(torch, dev)
    allocated = _values(stats)[0]
    peaks = _peaks(stats)
    arming = _state["arming"]
    if arming is not None:
        arming.boundary(dev, allocated)
    counts = (s.optimizer, s.batches, s.scopes)
    s.sent = counts
    doc = {
        "optimizer": counts[0],
        "batches": counts[1],
        "scopes": counts[2],
        "t_ns": now,
        "device": dev,
        "allocated": allocated,
    }
    if any(peaks):
        doc.update(allocated_peak=peaks[0], reserved_peak=peaks[1])
    _shim.record("steps", None, doc)


def _send_steps():
    """A `steps` record when the program stepped since the last one."""
    s = _steps.counters
    now = (s.optimizer, s.batches, s.scopes)
    if now == s.sent:
        return
    s.sent = now
    _shim.record("steps", None, {"optimizer": now[0], "batches": now[1], "scopes": now[2], "t_ns": s.t_ns})


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
    # The allocator's history flag came with the copy, but CUDA is unusable here: a child that attaches afresh
    # decides again.
    _state["history"] = 0
    _state["arming"] = None
    _state["peaks"] = {}
    _steps.reset()
    _state["next_request_walk"] = 0.0
    _state["next_oom_walk"] = 0.0
    _state["walking"] = False
    _state["stopping"] = False


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
    arming, armed_ns = _history_at_attach(torch, backend, problems)
    _shim.record("attach", None, {
        "bridge": "1",
        "torch": _version(torch),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "backend": backend,
        "alloc_conf": _alloc_conf(),
        "sample_ms": _interval_ms(),
        "history_entries": _state["history"],
        "history_mode": arming.mode,
        "devices": _device_count(torch),
        "problems": problems,
    })
    off = caching_off()
    if off:
        _note(
            None,
            "PyTorch's caching allocator is off (%s=1): PyTorch keeps no figures of its own (memory_stats() is all "
            "zeros, max_memory_allocated() and max_memory_reserved() 0); its tensors are the driver's allocations"
            % off,
        )
    if armed_ns is not None:
        _history_record("armed", "requested", None, arming.entries, 0, 0, None, armed_ns)
    _state["arming"] = arming
    _state["stop_steps"] = max(0, _env_int("VRAMTRACE_STOP_STEPS", 0))
    try:
        _steps.install(torch, _on_boundary)
    except Exception as e:
        debug("step hooks failed: %r" % (e,))
    _start_sampler()
    atexit.register(_at_exit)
    # multiprocessing's forked children end in os._exit, which skips atexit; they run its finalizers first.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        try:
            mp_util.Finalize(None, _at_exit, exitpriority=-1000)
        except Exception:
            pass


def _history_at_attach(torch, backend, problems):
    """The history's mode for this process, armed at once if requested (a refusal goes into `problems`).
    Returns the Arming and the time it was armed at attach, or None."""
    mode, entries = history_setting()
    if mode != "off" and backend != "native":
        mode = "off"  # the backend's problem already says PyTorch keeps no history there
    elif mode != "off" and _history_fn(torch) is None:
        problems.append("no allocation history in this torch: it is never kept")
        mode = "off"
    arming = Arming(mode, entries)
    if mode != "requested":
        return arming, None
    t_ns = time.monotonic_ns()
    try:
        _arm(torch, entries)
    except Exception as e:
        problems.append("allocation history: %r" % (e,))
        return arming, None
    _state["history"] = entries
    arming.arm_requested()
    return arming, t_ns


def _interval_ms():
    return max(1, _env_int("VRAMTRACE_TORCH_SAMPLE_MS", 20))


def _backend(torch):
    try:
        return torch.cuda.get_allocator_backend()
    except Exception:
        return "native"


def caching_off():
    """The variable that turns PyTorch's caching off (every tensor its own cudaMalloc, and no stats kept), if it is
    set as PyTorch reads it (exactly "1"), else None."""
    for name in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NO_HIP_MEMORY_CACHING"):
        if os.environ.get(name) == "1":
            return name
    return None


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


def _peaks(stats):
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


def _offer_peaks(device, peaks):
    """A `peak` record when either peak passes the most sent for the device: a reset only lowers PyTorch's
    counters, and the collector keeps the most over the run."""
    peaks_sent = _state.setdefault("peaks", {})
    sent = peaks_sent.get(device, (0, 0))
    if peaks[0] > sent[0] or peaks[1] > sent[1]:
        best = (max(peaks[0], sent[0]), max(peaks[1], sent[1]))
        peaks_sent[device] = best
        _shim.record("peak", device, {"allocated_peak": best[0], "reserved_peak": best[1]})


def sample_device(device, force=False):
    """Reads one device's figures and sends them if they changed (or `force`), then PyTorch's peaks from the same
    reading if they passed the most sent. Returns the figures, or None."""
    torch = _state["torch"]
    try:
        ts = time.monotonic_ns()
        stats = _raw_stats(torch, device)
        vals = _values(stats)
    except Exception:
        return None
    if vals[1] > 0:
        _state["active"].add(device)
    if force or _state["last"].get(device) != vals:
        if vals[1] > 0 or device in _state["last"]:
            _state["last"][device] = vals
            _shim.sample(_shim.TORCH, device, vals, ts)
    if device in _state["last"]:
        _offer_peaks(device, _peaks(stats))
    return vals


def _sampler():
    torch = _state["torch"]
    me = threading.current_thread()
    period = _interval_ms() / 1000.0
    next_scan = 0.0
    next_request = 0.0
    while _state["thread"] is me:
        t0 = time.thread_time()
        try:
            _send_steps()
        except Exception:
            pass
        try:
            now = time.monotonic()
            if now >= next_request:
                next_request = now + REQUEST_EVERY_S
                w = time.thread_time()
                _holders_on_request()
                t0 += time.thread_time() - w  # a walk on request is not the sampler's own pace
            if now >= next_scan:
                devices = range(_device_count(torch))
                next_scan = now + DISCOVER_S
            else:
                devices = sorted(_state["active"])
            for d in devices:
                vals = sample_device(d)
                if vals is not None:
                    _watch(d, vals)
        except Exception:
            pass
        # Its own work (reading the allocator's stats holds the GIL the program needs) stays under SAMPLER_SHARE
        # of the time: a round that cost 130 us (a CPU-bound H200 host) waits 43 ms, not 20.
        # Its own CPU time (not time spent waiting for the GIL), and never more than SAMPLER_MAX_WAIT periods.
        time.sleep(min(max(period, (time.thread_time() - t0) / SAMPLER_SHARE), period * SAMPLER_MAX_WAIT))


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


# ---- allocation history ------------------------------------------------------------------------------------


def _history_fn(torch):
    return getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)


def _arm(torch, entries):
    # Thread-safe in PyTorch: the allocator swaps the recorder under its own lock, and gathers stacks outside it.
    _history_fn(torch)(enabled="all", context="alloc", stacks="python", max_entries=entries)


def _disarm(torch):
    # Clears the ring of events only: a live block keeps the frames it was allocated with.
    _history_fn(torch)(enabled=None)


def _watch(device, vals, t_ns=None):
    """One sample into the arming rule (sampler thread only: the rule is not shared); arms or disarms the
    history when it says so. O(1) a sample but for a rare read of the device's limit."""
    arming = _state["arming"]
    if arming is None:
        return
    try:
        if t_ns is None:
            t_ns = time.monotonic_ns()
        if vals[1] > 0 and arming.needs_limit(device):
            arming.set_limit(device, _device_limit(_state["torch"], device))
        decision = arming.sample(device, t_ns / 1e9, vals[0], vals[1], vals[5], _steps.counters.index())
        if decision is not None:
            _act(arming, decision, t_ns)
    except Exception as e:
        debug("history arming failed: %r" % (e,))


def _device_limit(torch, device):
    """What this process may hold on the device: its total as the driver reports it (under vramtrace's cap, the
    cap), times PyTorch's per-process fraction when one is set; None if unknown."""
    try:
        total = int(torch.cuda.mem_get_info(device)[1])
    except Exception:
        return None
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch only
    if fraction is not None:
        try:
            f = float(fraction(device))
            if 0 < f < 1:
                total = int(total * f)
        except Exception:
            pass
    return total if total > 0 else None


def _act(arming, decision, t_ns):
    state, reason, device = decision
    with _history_lock:
        if _state["exit_done"]:
            return  # the exit has taken its last look
        if _move(arming, state == "armed"):
            d = arming.devices[device]
            _history_record(state, reason, device, arming.entries, d.allocated, d.reserved, d.limit, t_ns)


def _move(arming, arm):
    """Arms or disarms the history; False, and no more automatic moves, where it cannot."""
    torch = _state["torch"]
    if arm and _program_history(torch):
        arming.failed()
        _note(None, "the program keeps PyTorch's allocation history itself: vramtrace leaves it be")
        return False
    try:
        if arm:
            _arm(torch, arming.entries)
        else:
            _disarm(torch)
    except Exception as e:
        arming.failed()
        _note(None, "could not %s the allocation history: %r" % ("arm" if arm else "disarm", e))
        return False
    _state["history"] = arming.entries if arm else 0
    return True


def _program_history(torch):
    """The program (or PyTorch itself, cudagraph trees) turned the history on: arming would change its settings
    and disarming would take it away."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    try:
        return bool(enabled is not None and enabled())
    except Exception:
        return False


def _history_record(state, reason, device, entries, allocated, reserved, limit, t_ns):
    _shim.record(
        "history",
        device,
        {
            "state": state,
            "reason": reason,
            "entries": entries,
            "allocated": allocated,
            "reserved": reserved,
            "limit": limit,  # omitted when unknown
            "t_ns": t_ns,
        },
    )


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
    try:
        _send_steps()
    except Exception:
        pass
    vals = sample_device(device, force=True) or (0,) * 7
    try:
        stats = torch.cuda.memory_stats(device)
    except Exception:
        stats = {}
    doc = {
        "requested": _shim.count(alloc),
        "allowed_or_total": _shim.count(allowed),
        "device_free": _shim.count(device_free),
        "allocated": vals[0],
        "reserved": vals[1],
        "active": vals[2],
        "inactive_split": vals[3],
        "requested_current": vals[4],
        "alloc_retries": vals[5],
        "ooms": vals[6],
        "backend": _backend(torch),
        "alloc_conf": _alloc_conf(),
        "expandable_segments": _conf_value("expandable_segments"),
        "garbage_collection_threshold": _conf_value("garbage_collection_threshold"),
        # PyTorch says "unlimited" as SIZE_MAX, or -1 (then no count: left out).
        "max_split_size": _shim.count(stats.get("max_split_size")),
        "oversize_allocations": _shim.count(stats.get("oversize_allocations.current")),
        "thread": _thread_name(),
        "allocated_peak": _shim.count(stats.get("allocated_bytes.all.peak", 0)),
        "reserved_peak": _shim.count(stats.get("reserved_bytes.all.peak", 0)),
    }
    snap = None
    if _backend(torch) == "native":
        try:
            snap = torch.cuda.memory._snapshot()
            segments, largest, stuck, expandable = segment_figures(snap, device)
            doc.update(segments=segments, largest_free_block=largest, free_in_live_segments=stuck,
                       segments_expandable=expandable)
        except Exception as e:
            doc["segments_error"] = repr(e)
    if _state["history"] and snap is not None:
        path = _dump(snap, "oom%d" % n)
        if path:
            doc["snapshot"] = path
    _shim.record("oom", device, doc, ack=True)
    # What the error saw live, and who holds it: after the oom record, which is in the trace whatever this costs.
    _send_holders("oom", device, max(0, vals[1] - vals[0]), oom=n)


# ---- what holds the tensors -------------------------------------------------------------------------------


def _send_holders(at, device, cache_bytes, oom=None):
    """Walks the holders (bounded by HOLDERS_DEADLINE_S) and sends the `holders` record, acknowledged. The
    cache's bytes come from figures already read: no CUDA call."""
    # Never inside itself (an error raised while walking), and a program that catches its errors (a serving
    # loop, a batch-size search) pays for a few walks, then at most one a minute.
    now = time.monotonic()
    if _state.get("walking") or (at == "oom" and (oom or 0) > OOM_WALKS and now < _state.get("next_oom_walk", 0.0)):
        return
    _state["walking"] = True
    try:
        if at == "oom" and (oom or 0) >= OOM_WALKS:
            _state["next_oom_walk"] = now + OOM_WALK_EVERY_S
        result = _holders.walk(_state["torch"], HOLDERS_DEADLINE_S, device, cache_bytes)
        _shim.record("holders", device, _holders.record(result, at, oom), ack=True)
    except Exception as e:
        debug("holders walk failed: %r" % (e,))
    finally:
        _state["walking"] = False


def _cached_bytes(vals_by_device):
    return sum(max(0, v[1] - v[0]) for v in vals_by_device)


def _request_path():
    trace = os.environ.get("VRAMTRACE_TRACE")
    return "%s.holders-%d.request" % (trace, os.getpid()) if trace else None


def _holders_on_request():
    """The sampler, once a second: `<trace>.holders-<pid>.request` asks for a walk now (all devices)."""
    path = _request_path()
    if path is None:
        return
    try:
        st = os.lstat(path)
    except OSError:
        return
    # Only the job's own user asks: a file another user left in a shared folder (or a link) is not a request,
    # and a walk costs the program up to a second, so at most one a minute.
    import stat

    own = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
    try:
        os.unlink(path)
    except OSError:
        return  # a request that cannot be taken back would be answered every second: never answered
    now = time.monotonic()
    if not own or now < _state.get("next_request_walk", 0.0):
        return
    _state["next_request_walk"] = now + REQUEST_WALK_EVERY_S
    _send_holders("request", None, _cached_bytes(list(_state["last"].values())))


def _thread_name():
    """The OS name of the calling thread (autograd's device threads are `pt_autograd_N`; Python's own name for
    a thread it did not start says nothing)."""
    try:
        with open("/proc/self/task/%d/comm" % threading.get_native_id()) as f:
            return f.read().strip()
    except Exception:
        return threading.current_thread().name


def _create_private(tmp):
    """A new file at `tmp`, ours alone (0600), never opened through a link: whatever another user left at that
    name (a link to a file of the job's user) is removed, not written through."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    return os.fdopen(fd, "wb")


def _dump(snap, tag):
    """Writes a snapshot beside the trace; its path, or None."""
    trace = os.environ.get("VRAMTRACE_TRACE")
    if not trace:
        return None
    path = "%s.torch-%d-%s.pickle" % (trace, os.getpid(), tag)
    try:
        import pickle

        tmp = path + ".part"
        with _create_private(tmp) as f:
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
    try:
        _send_steps()
    except Exception:
        pass
    final = []
    # Every device: a short-lived process may end before the sampler first looked.
    for d in range(_device_count(torch)):
        vals = sample_device(d, force=d in _state["last"])
        if vals is None or d not in _state["last"]:
            continue
        final.append(vals)
        peaks = _state.get("peaks", {}).get(d, (0, 0))
        # Acknowledged: everything the process queued before it reaches the trace too, even if the process
        # then ends in os._exit.
        _shim.record(
            "exit",
            d,
            {
                "allocated": vals[0],
                "reserved": vals[1],
                "alloc_retries": vals[5],
                "ooms": vals[6],
                "allocated_peak": peaks[0],
                "reserved_peak": peaks[1],
            },
            ack=True,
        )
    # A job whose memory grew: what holds it now is what the report's leak section needs.
    arming = _state["arming"]
    if arming is not None and (arming.growing() or arming.armed in ("growth", "growth_steps")):
        _send_holders("exit", None, _cached_bytes(final))
    # Armed now (requested, or automatically: then it was armed for what the report needs, a leak's growing
    # tensors or the pressure it ended in). Disarmed since: nothing worth a dump.
    with _history_lock:
        armed = _state["history"]
    if armed:
        try:
            snap = torch.cuda.memory._snapshot()
            path = _dump(snap, "exit")
            if path:
                _shim.record("snapshot", None, {"at": "exit", "path": path})
        except Exception as e:
            _note(None, "could not take the allocation history at exit: %r" % (e,))


def _note(device, text):
    try:
        _shim.record("note", device, {"text": text})
    except Exception:
        pass

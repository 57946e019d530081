"""PyTorch: attach to the caching allocator once the program's torch initialises CUDA. This module is the entry
(`on_import`, from the post-import hook) and wires the parts together: the attach (the out-of-memory observer, the
history's mode, the `attach` record, the step hooks, the sampler's thread, the exit's hooks), a forked child's
fresh start, and what a step's boundary does. The parts, each in its own module:

- allocated / reserved (and active, inactive split, requested, retries, OOM count) per device, read by a daemon
  thread every VRAMTRACE_TORCH_SAMPLE_MS and sent when they changed (_sampler.py);
- PyTorch's own peaks (`allocated_bytes.all.peak`, `reserved_bytes.all.peak`: what max_memory_allocated() and
  max_memory_reserved() say), from the same reading, in a `peak` record whenever one passes the most sent so far,
  at steps' boundaries and at exit; read once more just before the program's reset_peak_memory_stats(), so a
  peak between two samples is never lost to sampling or to a reset (_sampler.py);
- at every out-of-memory error, from PyTorch's own observer (called after the allocator's lock is released and
  before the exception is raised): the figures, the allocator's settings, the largest free block and the free
  bytes in segments that cannot be released, sent synchronously (the shim waits for the collector to hold it)
  (_oom.py; the settings as _settings.py reads them);
- PyTorch's allocation history with Python stacks (native backend only), kept while it pays: by default armed
  by the sampler when the allocator retries, when allocated bytes pass 90% of the device's limit or when their
  floor keeps rising, and disarmed once that has been gone for 10 s (Arming, _arming.py, says exactly when),
  each move a `history` record; VRAMTRACE_TORCH_HISTORY=N keeps N entries from the start, `off` never
  (_history.py). While armed, the snapshot is dumped beside the trace at each out-of-memory error, and at exit
  (pickle protocol 4, which memory_viz opens): a live block keeps its frames on itself, so the dump names the
  lines of live tensors (_snapshot.py);
- the program's steps (optimizer steps, DataLoader batches, no_grad scopes: counted in _steps.py), a `steps`
  record from the sampler when they moved, and the allocated bytes read at their boundaries within their share
  of the time (here); the floor of allocated bytes per step, so a leak arms the history within a few steps;
- what holds the CUDA tensors (a bounded walk of the program's objects, _holders.py), a `holders` record at
  each out-of-memory error, at the exit of a job whose memory grew, and when `<trace>.holders-<pid>.request`
  appears: nothing of it runs before then (_walks.py);
- at exit, a last sample and an `exit` record (_exit.py);
- with VRAMTRACE_STOP_STEPS=N (`run --stop-after-steps N`, which `fit` uses), the process ends itself at the
  boundary of its N-th step: the `exit` work above, a `stopped` record, then `os._exit(0)` (the program's own
  cleanup is skipped on purpose: a `finally:` that saves a checkpoint must not overwrite one with N steps) (here).
The state they share is _state.py's, one dict. Everything here swallows its own errors: the program runs exactly
as without vramtrace.

The modules import downwards only, so none imports another that imports it: _state and _settings at the bottom;
_snapshot, _walks, _history; _sampler (which calls _walks and _history); _oom and _exit; this one on top."""

import atexit
import os
import sys
import time

from . import _exit, _history, _oom, _sampler, _settings, _shim, _state, _steps, debug

# At a step's boundary (after optimizer.step(), or as a batch is drawn) allocated bytes are read: the same moment
# of every step, so what a step kept is exact (a sampler's reading falls anywhere in a step). Each reading waits
# until the program has run for its cost over this share, so they never take more of its time, however short its
# steps (a reading of 80 us, as on an H200 host: at most one every 40 ms).
BOUNDARY_SHARE = 0.002
# ... except the first this many, read at every step: a leak that fills a cap in a few dozen steps (a CPU side
# running ahead of the GPU queues them in milliseconds) is read exactly, for a cost paid once.
BOUNDARY_FREE = 64


def on_import(torch):
    """torch was imported: attach when (or now, if) it initialises CUDA."""
    _state.state["torch"] = torch
    try:
        cuda = torch.cuda
        lazy = getattr(cuda, "_lazy_call", None)
        if lazy is None:
            return _state.note(
                None, "torch %s has no torch.cuda._lazy_call: the bridge did not attach" % _version(torch)
            )
        lazy(_attach)
    except Exception as e:
        debug("torch import hook failed: %r" % (e,))
    try:
        _sampler.wrap_reset(torch)
    except Exception as e:
        debug("reset_peak_memory_stats wrapper failed: %r" % (e,))
    try:
        os.register_at_fork(after_in_child=_after_fork)
    except Exception:
        pass


def _version(torch):
    return getattr(torch, "__version__", "?")


def _stop(counter, n):
    """The N-th step is done and `run --stop-after-steps N` asked to stop there: what exit would send (figures,
    holders of a growing job, the history's snapshot), a `stopped` record, then the process ends at once. Only in
    the process that attached (a forked child counts its own steps from 0 and stops at its own N-th)."""
    if _state.state["stopping"] or _state.state["pid"] != os.getpid():
        return
    _state.state["stopping"] = True
    try:
        _exit.exit_unsafe()
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
    stop = _state.state["stop_steps"]
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
    if (
        (now < s.next_read_ns and s.reads >= BOUNDARY_FREE)
        or not _state.state["attached"]
        or _state.state["pid"] != os.getpid()
    ):
        return
    s.reads += 1
    t0 = time.perf_counter_ns()
    try:
        _read_boundary(s, now)
    finally:
        s.next_read_ns = now + int(max(time.perf_counter_ns() - t0, 1000) / BOUNDARY_SHARE)


def _read_boundary(s, now):
    torch = _state.state["torch"]
    dev = torch.cuda.current_device()
    if dev not in s.room_read:
        # Once per device, at its first step: the driver's free memory (the shim records it, with the device's
        # total), so a trace says how much room the job had beside the CUDA context and other processes.
        s.room_read.add(dev)
        try:
            torch.cuda.mem_get_info(dev)
        except Exception:
            pass
    stats = _sampler.raw_stats(torch, dev)
    allocated = _sampler.values(stats)[0]
    peaks = _sampler.peaks(stats)
    arming = _state.state["arming"]
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


def _after_fork():
    # Only the forking thread survives: the sampler is gone, and the allocator's figures in this copy of the
    # parent's memory are the parent's, not ours: say nothing of them (CUDA cannot be used again here). A child
    # of a parent that never initialised CUDA attaches afresh through torch's own queued call.
    _state.state["thread"] = None
    _state.state["last"] = {}
    _state.state["active"] = set()
    _state.state["attached"] = False
    _state.state["pid"] = None
    _state.state["exit_done"] = False
    # The allocator's history flag came with the copy, but CUDA is unusable here: a child that attaches afresh
    # decides again.
    _state.state["history"] = 0
    _state.state["arming"] = None
    _state.state["peaks"] = {}
    _steps.reset()
    _state.state["next_request_walk"] = 0.0
    _state.state["next_oom_walk"] = 0.0
    _state.state["walking"] = False
    _state.state["stopping"] = False


def _attach():
    """Runs inside torch.cuda's lazy initialisation (or at once if it was done): must never raise."""
    try:
        _attach_unsafe()
    except Exception as e:
        debug("attach failed: %r" % (e,))
        _state.note(None, "the PyTorch bridge could not attach: %r" % (e,))


def _attach_unsafe():
    torch = _state.state["torch"]
    with _state.lock:
        if _state.state["attached"] and _state.state["pid"] == os.getpid():
            return
        _state.state["attached"] = True
        _state.state["pid"] = os.getpid()
    if not _shim.available():
        debug("libvramtrace.so is not loaded: nothing to attach to")
        return
    # Runs under torch.cuda's (non-reentrant) initialisation lock, before torch calls itself initialised:
    # nothing here may call torch.cuda._lazy_call, and memory_stats() would still answer {}.
    problems = []
    backend = _settings.backend(torch)
    observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if backend != "native":
        # PyTorch's cudaMallocAsync backend refuses observers and history: its figures come from the samples.
        problems.append("backend %s: no out-of-memory observer or allocation history in PyTorch" % backend)
    elif observer is not None:
        try:
            observer(_oom.on_oom)
        except Exception as e:
            problems.append("out-of-memory observer: %r" % (e,))
    else:
        problems.append("no out-of-memory observer in this torch")
    arming, armed_ns = _history.at_attach(torch, backend, problems)
    _shim.record("attach", None, {
        "bridge": "1",
        "torch": _version(torch),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "backend": backend,
        "alloc_conf": _settings.alloc_conf(),
        "sample_ms": _settings.interval_ms(),
        "history_entries": _state.state["history"],
        "history_mode": arming.mode,
        "devices": _sampler.device_count(torch),
        "problems": problems,
    })
    off = _settings.caching_off()
    if off:
        _state.note(
            None,
            "PyTorch's caching allocator is off (%s=1): PyTorch keeps no figures of its own (memory_stats() is all "
            "zeros, max_memory_allocated() and max_memory_reserved() 0); its tensors are the driver's allocations"
            % off,
        )
    if armed_ns is not None:
        _history.record("armed", "requested", None, arming.entries, 0, 0, None, armed_ns)
    _state.state["arming"] = arming
    _state.state["stop_steps"] = max(0, _settings.env_int("VRAMTRACE_STOP_STEPS", 0))
    try:
        _steps.install(torch, _on_boundary)
    except Exception as e:
        debug("step hooks failed: %r" % (e,))
    _sampler.start()
    atexit.register(_exit.at_exit)
    # multiprocessing's forked children end in os._exit, which skips atexit; they run its finalizers first.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        try:
            mp_util.Finalize(None, _exit.at_exit, exitpriority=-1000)
        except Exception:
            pass

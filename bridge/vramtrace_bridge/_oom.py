"""An out-of-memory error, seen through PyTorch's own observer (`on_oom`, attached by _torch.py; called after the
allocator's lock is released and before the exception is raised): the program's steps so far, a forced sample,
the figures, the allocator's settings, the largest free block and the free bytes in segments that cannot be
released, the snapshot's path while the history is armed (_snapshot.py), in an `oom` record sent synchronously
(the shim waits for the collector to hold it); then the walk of what holds the tensors (_walks.py).

It may touch: torch.cuda.memory_stats and torch.cuda.memory._snapshot (native backend only), the calling
thread's name (/proc/self/task/<tid>/comm), _state.state's `ooms` and `history`, and the shim (`oom`, and the
`steps`, `sample`, `peak` and `holders` records of the modules it calls). `on_oom` never raises."""

import threading

from . import _sampler, _settings, _shim, _snapshot, _state, _walks, debug


def on_oom(device, alloc, device_allocated, device_free):
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
    torch = _state.state["torch"]
    _state.state["ooms"] += 1
    n = _state.state["ooms"]
    try:
        _sampler.send_steps()
    except Exception:
        pass
    vals = _sampler.sample_device(device, force=True) or (0,) * 7
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
        "backend": _settings.backend(torch),
        "alloc_conf": _settings.alloc_conf(),
        "expandable_segments": _settings.conf_value("expandable_segments"),
        "garbage_collection_threshold": _settings.conf_value("garbage_collection_threshold"),
        # PyTorch says "unlimited" as SIZE_MAX, or -1 (then no count: left out).
        "max_split_size": _shim.count(stats.get("max_split_size")),
        "oversize_allocations": _shim.count(stats.get("oversize_allocations.current")),
        "thread": _thread_name(),
        "allocated_peak": _shim.count(stats.get("allocated_bytes.all.peak", 0)),
        "reserved_peak": _shim.count(stats.get("reserved_bytes.all.peak", 0)),
    }
    snap = None
    if _settings.backend(torch) == "native":
        try:
            snap = torch.cuda.memory._snapshot()
            segments, largest, stuck, expandable = segment_figures(snap, device)
            doc.update(segments=segments, largest_free_block=largest, free_in_live_segments=stuck,
                       segments_expandable=expandable)
        except Exception as e:
            doc["segments_error"] = repr(e)
    if _state.state["history"] and snap is not None:
        path = _snapshot.dump(snap, "oom%d" % n)
        if path:
            doc["snapshot"] = path
    _shim.record("oom", device, doc, ack=True)
    # What the error saw live, and who holds it: after the oom record, which is in the trace whatever this costs.
    _walks.send_holders("oom", device, max(0, vals[1] - vals[0]), oom=n)


def _thread_name():
    """The OS name of the calling thread (autograd's device threads are `pt_autograd_N`; Python's own name for
    a thread it did not start says nothing)."""
    try:
        with open("/proc/self/task/%d/comm" % threading.get_native_id()) as f:
            return f.read().strip()
    except Exception:
        return threading.current_thread().name

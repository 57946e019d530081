"""The process's exit (atexit, and multiprocessing's finalizers for forked children; _torch.py registers
`at_exit`), and the same work when `run --stop-after-steps` ends the process (_torch.py's `_stop`): the sampler
stops, the program's steps so far, a last sample of every device and an `exit` record each (acknowledged), the
holders of a job whose memory grew (_walks.py), and the history's snapshot if it is armed then (_snapshot.py, a
`snapshot` record). Once a process, and only in the process that attached.

It may touch: torch.cuda.memory._snapshot, _state.state (exit_done, thread, and what the sampler, the arming and
the history left there), and the shim (`exit`, `snapshot`, `note`, and the records of the modules it calls).
`at_exit` never raises; `exit_unsafe` may, for a caller that catches."""

import os

from . import _history, _sampler, _shim, _snapshot, _state, _walks


def at_exit():
    try:
        exit_unsafe()
    except Exception:
        pass


def exit_unsafe():
    if _state.state["exit_done"] or _state.state["pid"] != os.getpid():
        return
    _state.state["exit_done"] = True
    _state.state["thread"] = None  # the sampler stops
    torch = _state.state["torch"]
    try:
        _sampler.send_steps()
    except Exception:
        pass
    final = []
    # Every device: a short-lived process may end before the sampler first looked.
    for d in range(_sampler.device_count(torch)):
        vals = _sampler.sample_device(d, force=d in _state.state["last"])
        if vals is None or d not in _state.state["last"]:
            continue
        final.append(vals)
        peaks = _state.state.get("peaks", {}).get(d, (0, 0))
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
    arming = _state.state["arming"]
    if arming is not None and (arming.growing() or arming.armed in ("growth", "growth_steps")):
        _walks.send_holders("exit", None, _walks.cached_bytes(final))
    # Armed now (requested, or automatically: then it was armed for what the report needs, a leak's growing
    # tensors or the pressure it ended in). Disarmed since: nothing worth a dump.
    with _history.lock:
        armed = _state.state["history"]
    if armed:
        try:
            snap = torch.cuda.memory._snapshot()
            path = _snapshot.dump(snap, "exit")
            if path:
                _shim.record("snapshot", None, {"at": "exit", "path": path})
        except Exception as e:
            _state.note(None, "could not take the allocation history at exit: %r" % (e,))

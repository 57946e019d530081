"""PyTorch's allocation history with Python stacks (native backend only), kept while it pays: the mode is chosen at
attach (`at_attach`: VRAMTRACE_TORCH_HISTORY=N keeps N entries from the start, `off` never, else automatic), and
the sampler feeds each sample to the arming rule (`watch`; Arming, in _arming.py, says exactly when), which in
automatic mode arms it when the allocator retries, when allocated bytes pass 90% of the device's limit or when
their floor keeps rising, and disarms it once that has been gone for 10 s; each move a `history` record. While
armed, _oom.py and _exit.py dump its snapshot (_snapshot.py).

It may touch: torch.cuda.memory._record_memory_history (arm, disarm), torch._C._cuda_isHistoryEnabled,
torch.cuda.mem_get_info and get_per_process_memory_fraction (the device's limit, read once a device),
_state.state's history and arming, and the shim (`history` and `note` records). `lock` keeps a move and the
exit's last look at the history one at a time."""

import threading
import time

from . import _shim, _state, _steps, debug
from ._arming import Arming, history_setting

# Arming and disarming against the exit's last look at the history: one at a time.
lock = threading.Lock()


def at_attach(torch, backend, problems):
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
    _state.state["history"] = entries
    arming.arm_requested()
    return arming, t_ns


def _history_fn(torch):
    return getattr(getattr(torch.cuda, "memory", None), "_record_memory_history", None)


def _arm(torch, entries):
    # Thread-safe in PyTorch: the allocator swaps the recorder under its own lock, and gathers stacks outside it.
    _history_fn(torch)(enabled="all", context="alloc", stacks="python", max_entries=entries)


def _disarm(torch):
    # Clears the ring of events only: a live block keeps the frames it was allocated with.
    _history_fn(torch)(enabled=None)


def watch(device, vals, t_ns=None):
    """One sample into the arming rule (sampler thread only: the rule is not shared); arms or disarms the
    history when it says so. O(1) a sample but for a rare read of the device's limit."""
    arming = _state.state["arming"]
    if arming is None:
        return
    try:
        if t_ns is None:
            t_ns = time.monotonic_ns()
        if vals[1] > 0 and arming.needs_limit(device):
            arming.set_limit(device, _device_limit(_state.state["torch"], device))
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
    with lock:
        if _state.state["exit_done"]:
            return  # the exit has taken its last look
        if _move(arming, state == "armed"):
            d = arming.devices[device]
            record(state, reason, device, arming.entries, d.allocated, d.reserved, d.limit, t_ns)


def _move(arming, arm):
    """Arms or disarms the history; False, and no more automatic moves, where it cannot."""
    torch = _state.state["torch"]
    if arm and _program_history(torch):
        arming.failed()
        _state.note(None, "the program keeps PyTorch's allocation history itself: vramtrace leaves it be")
        return False
    try:
        if arm:
            _arm(torch, arming.entries)
        else:
            _disarm(torch)
    except Exception as e:
        arming.failed()
        _state.note(None, "could not %s the allocation history: %r" % ("arm" if arm else "disarm", e))
        return False
    _state.state["history"] = arming.entries if arm else 0
    return True


def _program_history(torch):
    """The program (or PyTorch itself, cudagraph trees) turned the history on: arming would change its settings
    and disarming would take it away."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    try:
        return bool(enabled is not None and enabled())
    except Exception:
        return False


def record(state, reason, device, entries, allocated, reserved, limit, t_ns):
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

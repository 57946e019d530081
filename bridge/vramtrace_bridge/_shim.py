"""The door into libvramtrace.so (shim/src/bridge.rs): its records travel with the driver's events, in order.

The shim is preloaded, so its functions are in the process's global scope. Without it (PYTHONPATH inherited but
LD_PRELOAD dropped) every call here is a no-op."""

import ctypes
import json
import threading

# The C interface version this bridge speaks (bridge.rs VERSION): 2, a record's body is one JSON object.
INTERFACE = 2

TORCH = 1
JAX = 2
NO_DEVICE = 0xFFFFFFFF

QUEUED = 0
NOT_RECORDING = 1
DROPPED = 2
NOT_ACKNOWLEDGED = 3
TOO_LARGE = 4

_lock = threading.Lock()
_fns = None  # (sample, record) or False when the shim is absent


def _load():
    global _fns
    if _fns is not None:
        return _fns
    with _lock:
        if _fns is not None:
            return _fns
        try:
            lib = ctypes.CDLL(None)
            version = lib.vramtrace_bridge_version
            version.restype = ctypes.c_int
            version.argtypes = []
            if version() != INTERFACE:
                _fns = False
                return _fns
            sample = lib.vramtrace_framework_sample
            sample.restype = ctypes.c_int
            sample.argtypes = [
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.POINTER(ctypes.c_uint64),
                ctypes.c_uint,
                ctypes.c_uint64,
            ]
            record = lib.vramtrace_bridge_record
            record.restype = ctypes.c_int
            record.argtypes = [
                ctypes.c_char_p,
                ctypes.c_uint,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_int,
            ]
            _fns = (sample, record)
        except (OSError, AttributeError):
            _fns = False
    return _fns


def available():
    return bool(_load())


_Values = ctypes.c_uint64 * 7


def sample(framework, device, values, ts_ns=0):
    """values: allocated, reserved, active, inactive_split, requested, alloc_retries, ooms (ints >= 0)."""
    fns = _load()
    if not fns:
        return NOT_RECORDING
    arr = _Values(*[_u64(v) for v in values[:7]])
    return fns[0](framework, device, arr, len(values[:7]), ts_ns)


def record(what, device, doc, ack=False):
    """doc: the record's keys (bridge/schema.json: its kind's keys, counts as ints, flags as bools, text as str,
    lists as lists); a key whose value is None is left out. It travels as one JSON object."""
    fns = _load()
    if not fns:
        return NOT_RECORDING
    body = {k: v for k, v in doc.items() if v is not None}
    # A value of no JSON type (an object the program lent us) is sent as its text, never raised in the program.
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8", "replace")
    dev = NO_DEVICE if device is None else int(device)
    return fns[1](what.encode("ascii"), dev, text, len(text), 1 if ack else 0)


def count(v):
    """v as a schema `count` (an int from 0 to 2**64-1), or None (left out of the record) when it is none."""
    try:
        v = int(v)
    except Exception:
        return None
    return v if 0 <= v <= 0xFFFFFFFFFFFFFFFF else None


def _u64(v):
    try:
        v = int(v)
    except Exception:
        return 0
    if v < 0:
        return 0
    return min(v, 0xFFFFFFFFFFFFFFFF)

"""When the walk of what holds the CUDA tensors (_holders.py, bounded by HOLDERS_DEADLINE_S) runs, and its
`holders` record: at each out-of-memory error (_oom.py: the first OOM_WALKS of a process, then one a minute at
most), at the exit of a job whose memory grew (_exit.py), and when `<trace>.holders-<pid>.request` appears (the
sampler looks once a second: `holders_on_request`; answered at most once a minute, and only a regular file of
the job's own user). Never inside itself. Nothing of it runs before one of those.

It may touch: the request file (lstat, unlink: never followed, never read), the program's objects (through
_holders.walk), _state.state's walk keys (walking, next_oom_walk, next_request_walk) and the figures the sampler
last read (`last`: the cache's bytes come from them, no CUDA call), and the shim (`holders` records)."""

import os
import time

from . import _holders, _shim, _state, debug

HOLDERS_DEADLINE_S = 1.0
REQUEST_WALK_EVERY_S = 60.0  # a request is answered at most this often
OOM_WALKS = 3  # out-of-memory errors of a process walked each; after them, one walk a minute at most
OOM_WALK_EVERY_S = 60.0


def send_holders(at, device, cache_bytes, oom=None):
    """Walks the holders (bounded by HOLDERS_DEADLINE_S) and sends the `holders` record, acknowledged. The
    cache's bytes come from figures already read: no CUDA call."""
    # Never inside itself (an error raised while walking), and a program that catches its errors (a serving
    # loop, a batch-size search) pays for a few walks, then at most one a minute.
    now = time.monotonic()
    if _state.state.get("walking") or (
        at == "oom" and (oom or 0) > OOM_WALKS and now < _state.state.get("next_oom_walk", 0.0)
    ):
        return
    _state.state["walking"] = True
    try:
        if at == "oom" and (oom or 0) >= OOM_WALKS:
            _state.state["next_oom_walk"] = now + OOM_WALK_EVERY_S
        result = _holders.walk(_state.state["torch"], HOLDERS_DEADLINE_S, device, cache_bytes)
        _shim.record("holders", device, _holders.record(result, at, oom), ack=True)
    except Exception as e:
        debug("holders walk failed: %r" % (e,))
    finally:
        _state.state["walking"] = False


def cached_bytes(vals_by_device):
    return sum(max(0, v[1] - v[0]) for v in vals_by_device)


def _request_path():
    trace = os.environ.get("VRAMTRACE_TRACE")
    return "%s.holders-%d.request" % (trace, os.getpid()) if trace else None


def holders_on_request():
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
    if not own or now < _state.state.get("next_request_walk", 0.0):
        return
    _state.state["next_request_walk"] = now + REQUEST_WALK_EVERY_S
    send_holders("request", None, cached_bytes(list(_state.state["last"].values())))

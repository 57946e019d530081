"""vramtrace's Python bridge: sees inside PyTorch's caching allocator (and XLA's, under JAX) from outside the
program, and puts what it sees into the same stream as the shim's driver events.

Rules it keeps, because it runs inside someone's training job:
- it never imports torch or jax itself: it waits until the program imports them (a post-import hook), and for
  PyTorch until the program initialises CUDA (`torch.cuda._lazy_call`);
- it never raises into the program and prints nothing unless VRAMTRACE_DEBUG is set;
- it costs nothing in a process that never initialises CUDA: no thread, no connection;
- it survives fork (the child starts afresh), spawn and threads.

Settings (environment, set by `vramtrace run`): VRAMTRACE_PYTHON_AGENT (off disables), VRAMTRACE_TORCH_SAMPLE_MS
(how often allocated/reserved are read; default 20), VRAMTRACE_TORCH_HISTORY (PyTorch's allocation history:
unset, empty or `auto` arms it only while memory is tight or growing, with VRAMTRACE_TORCH_HISTORY_AUTO_ENTRIES
entries, default 20000; N > 0 keeps N entries from the start; `off` or 0 never), VRAMTRACE_TRACE (the trace's
path: snapshots are written beside it).
"""

import os
import sys

from . import _hook

VERSION = "1"

_installed = False


def install():
    """Arms the post-import hooks. Idempotent; safe to call from any thread."""
    global _installed
    if _installed:
        return
    _installed = True
    # Tells the shim (read when it connects) that the bridge runs in this process; through putenv only, so
    # the program's os.environ stays as it was. A child Python process puts its own pid there.
    try:
        os.putenv("VRAMTRACE_BRIDGE_PID", str(os.getpid()))
        os.register_at_fork(after_in_child=_mark_child)
    except Exception:
        pass
    _hook.when_imported("torch", _on_torch)
    _hook.when_imported("jax", _on_jax)


def _mark_child():
    try:
        os.putenv("VRAMTRACE_BRIDGE_PID", str(os.getpid()))
    except Exception:
        pass


def _on_torch(torch):
    from . import _torch

    _torch.on_import(torch)


def _on_jax(jax):
    from . import _jax

    _jax.on_import(jax)


def debug(msg):
    if os.environ.get("VRAMTRACE_DEBUG"):
        try:
            sys.stderr.write("vramtrace bridge [%d]: %s\n" % (os.getpid(), msg))
        except Exception:
            pass

"""vramtrace's Python bridge: sees inside PyTorch's caching allocator (and XLA's, under JAX) from outside the
program, and puts what it sees into the same stream as the shim's driver events.

Rules it keeps, because it runs inside someone's training job:
- it never imports torch or jax itself: it waits until the program imports them (a post-import hook), and for
  PyTorch until the program initialises CUDA (`torch.cuda._lazy_call`);
- it never raises into the program and prints nothing unless VRAMTRACE_DEBUG is set;
- it costs nothing in a process that never initialises CUDA: no thread, no connection;
- it survives fork (the child starts afresh), spawn and threads.

Settings (environment, set by `vramtrace run`): VRAMTRACE_PYTHON_AGENT (off disables), VRAMTRACE_TORCH_SAMPLE_MS
(how often allocated/reserved are read; default 20), VRAMTRACE_TORCH_HISTORY (entries of PyTorch's allocation
history to keep, 0 = off), VRAMTRACE_TRACE (the trace's path: snapshots are written beside it).
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
    _hook.when_imported("torch", _on_torch)
    _hook.when_imported("jax", _on_jax)


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

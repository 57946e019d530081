"""PyTorch's snapshot (`torch.cuda.memory._snapshot()`, taken by the caller while the history is armed) written
beside the trace as `<trace>.torch-<pid>-<tag>.pickle`: at an out-of-memory error (_oom.py) and at exit
(_exit.py). Pickle protocol 4, which memory_viz opens: a live block keeps its frames on itself, so the dump names
the lines of live tensors. Never written through a link: the `.part` file is created exclusive, no-follow and
0600, then renamed.

It may touch: the files beside the trace (VRAMTRACE_TRACE) of those two names, and the shim (a `note` when a
dump fails). It never raises."""

import os

from . import _state


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


def dump(snap, tag):
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
        _state.note(None, "could not write the allocation history to %s: %r" % (path, e))
        try:
            os.unlink(path + ".part")
        except Exception:
            pass
        return None

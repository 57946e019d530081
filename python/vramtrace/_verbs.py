"""The `vramtrace` binary's verbs from Python: their `--json` as dicts, their text as strings. The figures are the
command line's own: the binary computes them, this only runs it."""

import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]


class VramtraceError(RuntimeError):
    """The binary could not answer: not found, or it refused (its one line, and its exit code: 2 for bad input,
    docs in the README)."""

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        RuntimeError.__init__(self, message)
        self.code = code


def trace_path() -> Optional[Path]:
    """This process's trace while it runs under `vramtrace run` (a traced Jupyter kernel included), else None."""
    p = os.environ.get("VRAMTRACE_TRACE")
    return Path(p) if p else None


def binary() -> str:
    """The `vramtrace` to run: the one that runs this process (VRAMTRACE_BIN, set by a traced kernel), else the
    one installed beside this package (the same wheel), else the first on PATH."""
    for p in (os.environ.get("VRAMTRACE_BIN"), os.path.join(sysconfig.get_path("scripts"), "vramtrace")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    found = shutil.which("vramtrace")
    if found:
        return found
    raise VramtraceError("no vramtrace binary: not beside this package nor on PATH (pip install vramtrace)")


def _trace(path: Optional[PathLike]) -> str:
    if path is not None:
        return os.fspath(path)
    p = trace_path()
    if p is None:
        raise VramtraceError("this process is not traced (not under `vramtrace run`): pass the trace's path")
    return str(p)


def text(verb: str, path: Optional[PathLike] = None, args: Sequence[str] = ()) -> str:
    """`vramtrace VERB TRACE ARGS...` as it prints it (report, oom, whatif)."""
    return _run([verb, _trace(path)] + list(args))


def _json(verb: str, path: Optional[PathLike], args: Sequence[str]) -> Dict[str, Any]:
    out = _run([verb, _trace(path), "--json"] + list(args))
    try:
        got = json.loads(out)
    except ValueError as e:
        raise VramtraceError("vramtrace %s --json printed no JSON: %s" % (verb, e)) from e
    if not isinstance(got, dict):
        raise VramtraceError("vramtrace %s --json printed no JSON object" % verb)
    return got


def report(path: Optional[PathLike] = None) -> Dict[str, Any]:
    """`vramtrace report --json` (docs/JSON-SCHEMA.md) of `path`, or of this process's trace so far."""
    return _json("report", path, ())


def oom(path: Optional[PathLike] = None, full: bool = False) -> Dict[str, Any]:
    """`vramtrace oom --json`: the out-of-memory post-mortem (cause, figures, holders, advice) of `path`, or of
    this process's trace so far."""
    return _json("oom", path, ["--full"] if full else [])


def whatif(path: Optional[PathLike] = None, cap: Optional[str] = None, device_memory: Optional[str] = None,
           alloc_conf: Sequence[str] = ()) -> Dict[str, Any]:
    """`vramtrace whatif --json`: PyTorch's allocator replayed under other settings (docs/WHATIF.md)."""
    args: List[str] = []
    if cap is not None:
        args += ["--cap", cap]
    if device_memory is not None:
        args += ["--device-memory", device_memory]
    for c in alloc_conf:
        args += ["--alloc-conf", c]
    return _json("whatif", path, args)


def _run(args: List[str]) -> str:
    exe = binary()
    try:
        r = subprocess.run([exe] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=_env())
    except OSError as e:
        raise VramtraceError("cannot run %s: %s" % (exe, e)) from e
    if r.returncode != 0:
        why = r.stderr.decode("utf-8", "replace").strip() or "exit code %d" % r.returncode
        raise VramtraceError(why, r.returncode)
    return r.stdout.decode("utf-8", "replace")


def _env() -> Dict[str, str]:
    """The verb reads a trace; it is no part of the job: not preloaded, not traced itself."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "VRAMTRACE_SOCKET", "VRAMTRACE_JOB_TOKEN"):
        env.pop(k, None)
    return env

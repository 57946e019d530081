"""vramtrace from Python: what holds the GPU memory now, the trace of the running process, and the verbs'
figures as dicts; and the `%vramtrace` magics of Jupyter and IPython (`%load_ext vramtrace`).

    import vramtrace
    vramtrace.holders()        # the objects keeping CUDA tensors alive, largest first (any process with PyTorch)
    vramtrace.trace_path()     # this process's trace under `vramtrace run`, else None
    vramtrace.oom()            # `vramtrace oom --json` of that trace (or of a path), as a dict

Nothing here runs until called: importing it starts no thread and sets no hook. docs/NOTEBOOKS.md.
"""

from ._holders import Holder, Holders, holders
from ._verbs import VramtraceError, binary, oom, report, text, trace_path, whatif

# The binary's version (collector/Cargo.toml), held equal by a test: the package and `vramtrace` ship together.
__version__ = "0.1.0"

__all__ = [
    "Holder",
    "Holders",
    "VramtraceError",
    "binary",
    "holders",
    "oom",
    "report",
    "text",
    "trace_path",
    "whatif",
    "load_ipython_extension",
    "__version__",
]


def load_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """`%load_ext vramtrace`: registers the `%vramtrace` line magic (and nothing else)."""
    from ._magic import register

    register(ipython)

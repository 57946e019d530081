"""vramtrace's entry into every Python process of a traced job.

`vramtrace run` puts the directory holding this file first on PYTHONPATH, so Python imports it at start-up in
place of the `sitecustomize` it would otherwise import. It does two things and nothing else:

1. installs the bridge (vramtrace_bridge), which stays dormant until the program's own torch initialises CUDA
   and never raises into the program;
2. finds and runs the `sitecustomize` that Python would have imported without vramtrace (the system's, a
   virtual environment's, the user's own), which then stands in `sys.modules` as the real one.

Afterwards `sys.path` is exactly what it would have been without vramtrace. PYTHONPATH in the environment keeps
the entry, so the job's child Python processes (subprocess, multiprocessing's spawn, torchrun's workers) get
the bridge too; `--python-agent off` leaves it out altogether.
"""


def _vramtrace_bootstrap():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))

    def ours(entry):
        try:
            return os.path.abspath(entry or os.curdir) == here
        except Exception:
            return False

    if os.environ.get("VRAMTRACE_PYTHON_AGENT", "on").strip().lower() not in ("0", "off", "no", "false"):
        try:
            if here not in sys.path:
                sys.path.insert(0, here)
            import vramtrace_bridge

            vramtrace_bridge.install()
        except Exception as e:  # never into the program
            if os.environ.get("VRAMTRACE_DEBUG"):
                sys.stderr.write("vramtrace: the Python bridge did not start: %r\n" % (e,))

    # sys.path as it would have been: our entry came from PYTHONPATH and goes.
    sys.path[:] = [p for p in sys.path if not ours(p)]

    # The sitecustomize Python would have imported without us.
    this = sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            raise  # theirs exists and failed: Python would have said so too
        if this is not None:
            sys.modules.setdefault("sitecustomize", this)


_vramtrace_bootstrap()
del _vramtrace_bootstrap

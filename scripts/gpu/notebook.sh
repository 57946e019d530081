#!/usr/bin/env bash
# Issue 52 on a real GPU: a notebook executed through the traced kernel (`vramtrace kernel install`) with real
# PyTorch. The GPU machine has no ipykernel, jupyter_client, nbclient or IPython and no network: their wheels are
# carried in DIR/wheels (made here with `pip download --python-version 3.12 --platform manylinux2014_x86_64
# --platform manylinux_2_17_x86_64 --only-binary=:all: -d DIR/wheels ipykernel 'jupyter_client>=8,<9' nbclient
# nbformat`). The vramtrace Python package is the checkout's python/ on PYTHONPATH (as tests/e2e/tests/kernel.rs
# has it; `pip install .` needs maturin and cargo, which that machine lacks).
#   Usage: bash scripts/gpu/notebook.sh DIR    (DIR: the carried build, vramtrace and libvramtrace.so, and wheels/)
#   CAP (default 8GiB): the kernel's cap. NAME (default vramtrace-gpu): the kernel's name. NBV=PATH: a virtual
#   environment that already has ipykernel, jupyter_client, nbclient and nbformat (nothing is installed).
# $OUT/notebook.ipynb: the executed notebook; $OUT/notebook.log: every step's output, `kernel list`, the trace's
# `oom` and `report` read after the kernel is gone; $OUT/notebook.oom.json: `oom --json` of that trace. Prints
# the checks last (scripts/gpu/notebook_case.py).
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/vramtrace-notebook-out}
CAP=${CAP:-8GiB}
NAME=${NAME:-vramtrace-gpu}
mkdir -p "$OUT"
LOG=$OUT/notebook.log
: >"$LOG"
say() { printf '[%3ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG"; }
export PATH="$DIR:$PATH"
export HOME=/tmp/nbhome XDG_DATA_HOME=/tmp/nbhome/data JUPYTER_RUNTIME_DIR=/tmp/nbhome/runtime
unset JUPYTER_DATA_DIR JUPYTER_PATH PYTORCH_CUDA_ALLOC_CONF
mkdir -p "$HOME"
export PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1)"
say "$(command -v python3) $(python3 --version 2>&1); $(vramtrace --version 2>&1)"

# The kernel's Python: a virtual environment over the one that has torch. That python3 is itself a virtual
# environment's (/opt/torch/.venv), whose packages --system-site-packages does not reach: a .pth names them.
V=${NBV:-/tmp/nbv}
if [ -z "${NBV:-}" ]; then
    python3 -m venv --system-site-packages "$V" >>"$LOG" 2>&1 ||
        python3 -m venv --without-pip --system-site-packages "$V" >>"$LOG" 2>&1
    VSP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ! "$V/bin/python" -c 'import torch' 2>/dev/null; then
        python3 -c 'import site; print("\n".join(site.getsitepackages()))' >"$VSP/_torch_env.pth"
        say "torch reached through $VSP/_torch_env.pth: $(tr '\n' ' ' <"$VSP/_torch_env.pth")"
    fi
    PKGS="ipykernel jupyter_client nbclient nbformat"
    W=(--no-index --find-links "$DIR/wheels")
    if [ -x "$V/bin/pip" ]; then
        "$V/bin/pip" install -q "${W[@]}" $PKGS >>"$LOG" 2>&1
    else
        python3 -m pip --python "$V/bin/python" install -q "${W[@]}" $PKGS >>"$LOG" 2>&1 ||
            python3 -m pip install -q "${W[@]}" --target "$VSP" $PKGS >>"$LOG" 2>&1
    fi
fi
say "kernel python: $("$V/bin/python" -c 'import ipykernel, jupyter_client, nbclient, IPython, torch, vramtrace
print("ipykernel", ipykernel.__version__, "jupyter_client", jupyter_client.__version__, "nbclient",
      nbclient.__version__, "IPython", IPython.__version__, "torch", torch.__version__, "vramtrace package",
      vramtrace.__version__, vramtrace.__file__)' 2>&1 | tail -3)"

say "vramtrace kernel install --name $NAME --cap $CAP --python $V/bin/python"
vramtrace kernel install --name "$NAME" --cap "$CAP" --python "$V/bin/python" 2>&1 | tee -a "$LOG"
cat "$XDG_DATA_HOME/jupyter/kernels/$NAME/kernel.json" >>"$LOG" 2>&1

say "executing the notebook (nbclient)"
"$V/bin/python" "$HERE/notebook_case.py" "$NAME" "$OUT/notebook.ipynb" >"$OUT/notebook_case.out" 2>>"$LOG"
rc=$?
say "notebook_case.py exit $rc"
vramtrace kernel list 2>&1 | tee -a "$LOG"
T=$(ls -t "$XDG_DATA_HOME/vramtrace/kernels/$NAME/"*.vtrace 2>/dev/null | head -1)
if [ -n "$T" ]; then
    {
        echo "=== the trace once the kernel is gone: $T"
        ls -la "$(dirname "$T")"
        vramtrace oom "$T"
        vramtrace report "$T"
    } >>"$LOG" 2>&1
    vramtrace oom --json "$T" >"$OUT/notebook.oom.json" 2>>"$LOG"
fi
vramtrace kernel remove "$NAME" 2>&1 | tee -a "$LOG"
cat "$OUT/notebook_case.out" >>"$LOG"
# The executed cells as text, then the checks (notebook_case.py's CHECK lines) last.
"$V/bin/python" - "$OUT/notebook.ipynb" <<'PY' 2>&1 | tee -a "$LOG"
import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
for i, c in enumerate(nb.cells):
    if c.cell_type != "code":
        continue
    print("--- cell %d: %s" % (i, c.source.splitlines()[0]))
    for o in c.outputs:
        if o.output_type == "stream":
            print(o.text, end="")
        elif o.output_type in ("execute_result", "display_data"):
            print(o.data.get("text/plain", ""))
        elif o.output_type == "error":
            print("%s: %s" % (o.ename, o.evalue[:300]))
PY
grep '^CHECK' "$OUT/notebook_case.out"
rm -f "$OUT/notebook_case.out"  # in notebook.log; at most 8 files come back from $OUT
exit $rc

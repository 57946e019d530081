#!/usr/bin/env bash
# Issue 11 on a real GPU: a PyTorch training run's trace (bridge_case.py step, under --torch-history) exported to
# memory-viz, perfetto and html; then PyTorch's own viewer code reads the memory-viz pickle
# (torch.cuda._memory_viz: trace_plot, segment_plot, and the text summaries), and the exports' sizes are listed.
# Files back in $OUT: the html page and the memory_viz plots.
#   Usage: bash scripts/gpu/views.sh DIR
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-views-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-views.XXXX)
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
cd "$W" || exit 0
STEPS=40 timeout 200 "$VT" run -q -o train.vtrace --force --torch-history=20000 -- python3 "$HERE/bridge_case.py" step
echo "run rc=$?"
"$VT" report train.vtrace | head -12
TABLE=()
for f in memory-viz perfetto html; do
    ext=${f/memory-viz/pickle}; ext=${ext/perfetto/pftrace}
    /usr/bin/time -f "%e s %M KB" "$VT" export train.vtrace --format "$f" --out "train.$ext" --force 2>"export-$f.err"
    rc=$?
    TABLE+=("| export $f | rc $rc | $(ls -l "train.$ext" 2>/dev/null | awk '{print $5}') bytes | $(tail -1 "export-$f.err") |")
done
python3 - <<'PY'
import pickle, sys, traceback
from torch.cuda import _memory_viz as mv
rows = []
snap = pickle.load(open("train.pickle", "rb"))
rows.append(("pickle.load", "ok", f"devices {len(snap['device_traces'])}, segments {len(snap['segments'])}, "
             f"events per device {[len(t) for t in snap['device_traces']]}, "
             f"PyTorch's history on devices {snap.get('vramtrace', {}).get('torch_devices')}"))
def only(dev):
    # The snapshot with one device's trace and segments (memory_viz's text functions read every device).
    return {**snap, "device_traces": [t if i == dev else [] for i, t in enumerate(snap["device_traces"])],
            "segments": [s for s in snap["segments"] if s["device"] == dev]}
for dev in snap.get("vramtrace", {}).get("torch_devices", []):
    for name, fn in [("trace_plot", mv.trace_plot), ("segment_plot", mv.segment_plot), ("segsum", mv.segsum)]:
        try:
            out = fn(only(dev))
            rows.append((f"{name} of device {dev} (PyTorch's own history)", "ok", f"{len(out)} chars"))
        except Exception as e:
            rows.append((f"{name} of device {dev}", "FAILED", f"{type(e).__name__}: {e}"[:160]))
            traceback.print_exc()
for name, fn in [("trace_plot", lambda: mv.trace_plot(snap)), ("segment_plot", lambda: mv.segment_plot(snap)),
                 ("segsum", lambda: mv.segsum(snap)), ("trace", lambda: mv.trace(snap)),
                 ("memory", lambda: mv.memory(snap)), ("segments", lambda: mv.segments(snap))]:
    try:
        out = fn()
        if name in ("trace_plot", "segment_plot"):
            open(f"mv_{name}.html", "w").write(out)
        rows.append((name, "ok", f"{len(out)} chars"))
    except Exception as e:
        rows.append((name, "FAILED", f"{type(e).__name__}: {e}"[:160]))
        traceback.print_exc()
print("| torch.cuda._memory_viz | result | detail |")
print("|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
PY
cp train.html mv_trace_plot.html "$OUT/" 2>/dev/null
python3 -c "import torch; print('torch', torch.__version__)"
printf '%s\n' "${TABLE[@]}"

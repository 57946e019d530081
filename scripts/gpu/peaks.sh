#!/usr/bin/env bash
# Issue 53: the report's PyTorch peaks against PyTorch's own max_memory_allocated()/max_memory_reserved(), on
# GPT-2 small training (scripts/gpu/peaks_case.py) under the four allocator settings (native,
# expandable_segments, cudaMallocAsync, caching off), each once finished and once failing under --cap, plus
# one native run that resets its peak counters every step. The bridge travels inside the vramtrace binary.
# Full logs, reports and traces go to $OUT (peaks.tar.gz); a table is printed LAST.
#   Usage: bash scripts/gpu/peaks.sh DIR [CAP] [STEPS]   (DIR: vramtrace and libvramtrace.so, scripts/gpu/prepare.sh)
set -u
DIR=$(cd "$1" && pwd)
CAP=${2:-5GiB}
STEPS=${3:-6}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-peaks.XXXX)
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
export PYTHONUNBUFFERED=1
DEADLINE=${DEADLINE:-520}
cd "$W" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee gpu.txt
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' |
    tee -a gpu.txt

# name, settings (env assignments, or -), finished|failed, extra case arguments
one() {
    local name=$1 settings=$2 outcome=$3
    shift 3
    if ((SECONDS > DEADLINE)); then
        echo "[$SECONDS s] $name: skipped (deadline)"
        return
    fi
    local cap=()
    [ "$outcome" = failed ] && cap=(--cap "$CAP")
    local envs=()
    [ "$settings" != - ] && read -r -a envs <<<"$settings"
    local t0=$SECONDS
    env "${envs[@]}" timeout 170 "$VT" run -o "$name.vtrace" --force "${cap[@]}" -- \
        python3 "$HERE/peaks_case.py" "$STEPS" "$@" >"$name.out" 2>&1
    echo "$?" >"$name.rc"
    "$VT" report --json "$name.vtrace" >"$name.report.json" 2>"$name.report.err"
    "$VT" report "$name.vtrace" >"$name.report.txt" 2>>"$name.report.err"
    echo "[$SECONDS s] $name: rc $(cat "$name.rc"), $((SECONDS - t0)) s; $(grep -m1 "allocator (" "$name.report.txt" | sed 's/^ *//')"
}

for outcome in finished failed; do
    one "native-$outcome" - "$outcome" $([ $outcome = finished ] && echo --cost)
    one "expandable-$outcome" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$outcome"
    one "async-$outcome" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "$outcome"
    one "nocache-$outcome" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$outcome"
done
one native-reset-finished - finished --reset

if [ -n "${OUT:-}" ]; then
    tar -czf "$OUT/peaks.tar.gz" --exclude='*.pickle' . 2>/dev/null
fi
python3 - "$W" <<'PY'
import json, os, sys

W = sys.argv[1]
GIB = float(1 << 30)


def gib(v):
    return "-" if v is None else "%.3f" % (v / GIB)


def diff(a, b):
    if a is None or b is None:
        return "-"
    if a == 0:
        return "0" if b == 0 else "n/a"
    return "%+.2f%%" % (100.0 * (b - a) / a)


rows = []
names = sorted(f[:-4] for f in os.listdir(W) if f.endswith(".out"))
order = ["native", "native-reset", "expandable", "async", "nocache"]
names.sort(key=lambda n: (order.index(n.rsplit("-", 1)[0]) if n.rsplit("-", 1)[0] in order else 9, n))
costs = None
print()
print("| run | outcome (steps) | PyTorch max allocated GiB | report allocated peak GiB | diff | PyTorch max reserved GiB | report reserved peak GiB | diff | driver peak GiB | report says |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    torch = None
    for line in open(os.path.join(W, n + ".out"), errors="replace"):
        if line.startswith("TORCH "):
            torch = json.loads(line[6:])
    try:
        rep = json.load(open(os.path.join(W, n + ".report.json")))
    except Exception:
        rep = {}
    dev = (rep.get("devices") or [{}])[0]
    fw = dev.get("framework")
    notes = [m.get("text", "") for m in (rep.get("bridge") or {}).get("messages", [])]
    says = "; ".join(t[:70] for t in notes if "caching allocator is off" in t) or ("-" if fw else "no allocator figures")
    if torch is None:
        print("| %s | no TORCH line (rc %s) | | | | | | | %s | %s |" % (n, open(os.path.join(W, n + ".rc")).read().strip(), gib(dev.get("peak_bytes")), says))
        continue
    costs = costs or torch.get("cost_us")
    ra = fw.get("peak_allocated_bytes") if fw else None
    rr = fw.get("peak_reserved_bytes") if fw else None
    print("| %s | %s (%d) | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        n, torch["outcome"], torch["steps"], gib(torch["max_allocated"]), gib(ra), diff(torch["max_allocated"], ra),
        gib(torch["max_reserved"]), gib(rr), diff(torch["max_reserved"], rr), gib(dev.get("peak_bytes")), says))
if costs:
    print()
    print("stats read, median of 400 (us): %s" % json.dumps(costs))
PY

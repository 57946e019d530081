#!/usr/bin/env bash
# The 1 MiB cudaMalloc/cudaFree loop, bare against traced, in many short alternating runs (the driver's own
# spread between runs, about 3 to 4% on an H100, hides the shim's cost in three long runs): N pairs of runs,
# each --tiny-loop ITERS of cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB (vramtrace-workload), order alternated within
# each pair. Prints per-run figures, the medians, and the median of the paired differences.
#   Usage: bash scripts/gpu/overhead.sh DIR [PAIRS] [ITERS]
set -u
DIR=$(cd "$1" && pwd)
PAIRS=${2:-12}
ITERS=${3:-30000}
WL="$DIR/vramtrace-workload"
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
W=$(mktemp -d /tmp/vt-over.XXXX)
ns() { sed -n 's/^loop: .*ns_per_pair=\([0-9.]*\).*/\1/p' | tail -n1; }
plain=() traced=()
for i in $(seq "$PAIRS"); do
    if ((i % 2)); then
        p=$("$WL" --tiny-loop "$ITERS" --bytes 1048576 2>&1 | ns)
        t=$("$VT" run -q --force -o "$W/t.vtrace" -- "$WL" --tiny-loop "$ITERS" --bytes 1048576 2>&1 | ns)
    else
        t=$("$VT" run -q --force -o "$W/t.vtrace" -- "$WL" --tiny-loop "$ITERS" --bytes 1048576 2>&1 | ns)
        p=$("$WL" --tiny-loop "$ITERS" --bytes 1048576 2>&1 | ns)
    fi
    plain+=("$p") traced+=("$t")
    echo "pair $i: plain $p traced $t"
done
python3 - "${plain[*]}" "${traced[*]}" <<'PY'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
t = [float(x) for x in sys.argv[2].split()]
d = [(b / a - 1) * 100 for a, b in zip(p, t)]
print(f"plain median {statistics.median(p):.1f} ns/pair, traced median {statistics.median(t):.1f} ns/pair")
print(f"traced vs plain: medians {(statistics.median(t) / statistics.median(p) - 1) * 100:+.2f}%, "
      f"median of paired differences {statistics.median(d):+.2f}% (pairs: {' '.join(f'{x:+.1f}' for x in d)})")
PY
"$VT" report --json "$W/t.vtrace" | python3 -c "import json,sys; d=json.load(sys.stdin); print('last trace: events', d['events'], 'dropped', d['dropped_events'])"

#!/usr/bin/env bash
# Issue 9 on a real GPU: nothing lost when a process ends on the instruction after its allocations.
#   (1) a driver-API program, 5 x 64 MiB then `_exit(3)`, 8 runs; then SIGKILL on itself, 8 runs
#   (2) PyTorch: 256 MiB through torch, then os._exit(0) (bridge_case.py osexit)
#   (3) PyTorch: multiprocessing children started with fork, 256 MiB each, ending in os._exit (bridge_case.py forked)
#   (4) 40 driver-API processes alive at once while the collector has 24 descriptors: all traced whole
# Prints a table LAST; traces to $OUT/lost-traces.tgz, the log to $OUT/lost-log.txt.
#   Usage: bash scripts/gpu/lost.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-lost-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-lost.XXXX)
LOG=$OUT/lost-log.txt
: >"$LOG"
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
TABLE=()
row() { TABLE+=("| $1 | $2 | $3 | $4 |"); }
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o "$W/exits" "$HERE/exits.c" -I"$CUDA_INC" -lcuda >>"$LOG" 2>&1 || echo "build failed" >>"$LOG"
cd "$W" || exit 0
# The trace's successful cuMemAlloc events of the program's process, and how it ended.
count() {
    "$VT" report --json "$1" | python3 -c "
import json, sys
d = json.load(sys.stdin)
ps = [p for p in d['processes'] if 'exits' in ' '.join(p.get('cmdline') or [])]
print(sum(p['allocations'] for p in ps), ','.join(str(p.get('exit')) for p in ps))" 2>>"$LOG"
}
for how in exit kill; do
    ok=0
    for i in 1 2 3 4 5 6 7 8; do
        timeout 60 "$VT" run -o "$how-$i.vtrace" --force --python-agent off -- ./exits "$how" >"$how-$i.out" 2>&1
        echo "rc=$?" >>"$how-$i.out"
        got=$(count "$how-$i.vtrace")
        echo "$how $i: $got" >>"$LOG"
        cat "$how-$i.out" >>"$LOG"
        [ "${got%% *}" = 5 ] && ok=$((ok + 1))
    done
    row "driver API, 5 x 64 MiB then $how at once: runs with all 5 in the trace" "8 of 8" "$ok of 8" "$([ $ok = 8 ] && echo yes || echo NO)"
done
# (4) 40 processes alive at once, the collector held to 24 descriptors (prlimit, once it runs: the job keeps its
# own limit, which the driver needs): each is traced whole.
"$VT" run -o many.vtrace --force --python-agent off -- bash -c 'sleep 1; for i in $(seq 40); do ./exits hold & done; wait' >many.out 2>&1 &
vt=$!
sleep 0.5
prlimit --pid "$vt" --nofile=24:24 >>"$LOG" 2>&1 || echo "prlimit failed" >>"$LOG"
wait "$vt"
cat many.out >>"$LOG"
got=$("$VT" report --json many.vtrace | python3 -c "
import json, sys
d = json.load(sys.stdin)
ps = [p for p in d['processes'] if 'exits' in ' '.join(p.get('cmdline') or [])]
print(sum(1 for p in ps if p['allocations'] == 5), sum(1 for p in ps if p.get('untraced')), len(ps))" 2>>"$LOG")
read -r whole named seen <<<"${got:-0 0 0}"
row "driver API, 40 processes alive at once, the collector held to 24 descriptors: whole, named, seen" "40, 0, 40" "$whole, $named, $seen" "$([ "$whole" = 40 ] && echo yes || echo NO)"
CASE="$HERE/bridge_case.py"
res() { grep -o "$2=[^ ]*" "$1" | head -1 | cut -d= -f2; }
timeout 120 "$VT" run -o osexit.vtrace --force -- python3 "$CASE" osexit >osexit.out 2>&1
cat osexit.out >>"$LOG"
got=$("$VT" report --json osexit.vtrace | python3 -c "
import json,sys; d=json.load(sys.stdin); print(max((p['peak_bytes'] for p in d['processes'] if p['pid']==int('$(res osexit.out pid)')), default=0))" 2>>"$LOG")
row "PyTorch: 256 MiB then os._exit(0): the process's peak in the trace" ">= 268435456" "$got" "$(python3 -c "print('yes' if int('${got:-0}') >= 268435456 else 'NO')" 2>/dev/null)"
timeout 240 "$VT" run -o forked.vtrace --force -- python3 "$CASE" forked >forked.out 2>&1
cat forked.out >>"$LOG"
kids=$(res forked.out pids)
n=0
for k in ${kids//,/ }; do
    "$VT" report --json forked.vtrace | python3 -c "
import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(p['pid']==$k and p['peak_bytes'] >= 268435456 for p in d['processes']) else 1)" 2>>"$LOG" && n=$((n + 1))
done
row "PyTorch: fork-started multiprocessing children (os._exit): children whose 256 MiB is in the trace" "3 of 3" "$n of 3" "$([ "$n" = 3 ] && echo yes || echo NO)"
"$VT" report forked.vtrace >>"$LOG" 2>&1
tar czf "$OUT/lost-traces.tgz" ./*.vtrace ./*.out 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo
echo "| case | expected | vramtrace | match |"
echo "|---|---|---|---|"
printf '%s\n' "${TABLE[@]}"

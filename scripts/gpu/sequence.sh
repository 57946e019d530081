#!/usr/bin/env bash
# A process's end, in time, on a real GPU: `a; b` in one shell, where a holds 45,000 MiB when it ends (by exit,
# _exit or SIGKILL) and b then allocates 45,000 MiB. Both cannot fit on an 80 GB device at once, so b's success
# is the driver's word that they never overlapped: the report's peak must be 45,000 MiB, not their sum.
# Prints a table LAST; the log to $OUT/sequence-log.txt.
#   Usage: bash scripts/gpu/sequence.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-sequence-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-seq.XXXX)
LOG=$OUT/sequence-log.txt
: >"$LOG"
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o "$W/sequence" "$HERE/sequence.c" -I"$CUDA_INC" -lcuda >>"$LOG" 2>&1 || echo "build failed" >>"$LOG"
cd "$W" || exit 0
TABLE=("| first ends by | runs | second's alloc succeeded | report's peak = 45,000 MiB | first's end before second's alloc |" "|---|---|---|---|---|")
for how in exit _exit kill; do
    ok_alloc=0 ok_peak=0 ok_order=0
    for i in 1 2 3 4 5; do
        timeout 60 "$VT" run -o "$how-$i.vtrace" --force --python-agent off -- \
            bash -c "./sequence 45000 $how; ./sequence 45000 exit" >"$how-$i.out" 2>&1
        echo "rc=$?" >>"$how-$i.out"
        cat "$how-$i.out" >>"$LOG"
        grep -c "= 0$" "$how-$i.out" | grep -qx 2 && ok_alloc=$((ok_alloc + 1))
        got=$("$VT" report --json "$how-$i.vtrace" | python3 -c "
import json, sys
d = json.load(sys.stdin)
peak = d['devices'][0]['peak_bytes']
ps = sorted(d['processes'], key=lambda p: p['start_ns'])
order = len(ps) == 2 and ps[0]['end_ns'] is not None and ps[0]['end_ns'] < ps[1]['peak_time_ns']
print(peak, int(order), ps[0]['ended'] if ps else '-')" 2>>"$LOG")
        echo "$how $i: peak order ended = $got" >>"$LOG"
        set -- $got
        [ "${1:-0}" = $((45000 << 20)) ] && ok_peak=$((ok_peak + 1))
        [ "${2:-0}" = 1 ] && ok_order=$((ok_order + 1))
    done
    TABLE+=("| $how | 5 | $ok_alloc/5 | $ok_peak/5 | $ok_order/5 |")
done
echo "LAST"
printf '%s\n' "${TABLE[@]}"

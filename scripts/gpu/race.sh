#!/usr/bin/env bash
# Issue 9 on a real GPU: threads of one process allocating and freeing as fast as they can (hammer), and 4 x 4
# under --lossless with a 68 KiB ring. The report must replay exactly (no entry out of order) with no free taken
# for lost or unmatched, and every event recorded.
#   Usage: bash scripts/gpu/race.sh DIR     (DIR: the carried build: vramtrace, libvramtrace.so, hammer)
set -u
DIR=$(cd "$1" && pwd)
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
W=$(mktemp -d /tmp/vt-race.XXXX)
check() {
    "$DIR/vramtrace" report --json "$1" | python3 -c "
import json, sys
d = json.load(sys.stdin)
ok = d['merge_inexact_events'] == 0 and d['lost_frees'] == 0 and d['unmatched_frees'] == 0 and d['dropped_events'] == 0 and d['events'] == $2
print(f\"$3: events {d['events']} (expect $2), out of order {d['merge_inexact_events']}, lost frees {d['lost_frees']}, unmatched {d['unmatched_frees']}, dropped {d['dropped_events']}, peak {d['devices'][0]['peak_bytes']}: {'yes' if ok else 'NO'}\")"
}
for i in 1 2 3; do
    "$DIR/vramtrace" run -q --force --stacks none -o "$W/t$i.vtrace" -- "$DIR/hammer" --threads 8 --iters 20000 --size 65536 >/dev/null 2>&1
    check "$W/t$i.vtrace" 320000 "8 threads, run $i"
    "$DIR/vramtrace" run -q --force --stacks none --lossless --ring-size 69632 -o "$W/l$i.vtrace" -- \
        "$DIR/hammer" --procs 4 --threads 4 --iters 20000 --size 4096 >/dev/null 2>&1
    check "$W/l$i.vtrace" 640000 "4 x 4 lossless, 68 KiB ring, run $i"
done
rm -rf "$W"

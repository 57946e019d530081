#!/usr/bin/env bash
# The shim's cost per cuMemAlloc_v2 + cuMemFree_v2 pair on the simulated driver (bench_pairs, 1 MiB), measured
# on the GPU machine's host CPU pinned to two cores (taskset: the whole job, program and collector), and on all
# of its cores: bare, traced with call sites off, traced with the default settings, traced with a cap. RUNS
# rounds, each running every configuration once in turn (alternating, so a slow spell of the host touches all).
# Binaries from DIR (scripts/gpu/prepare.sh --bench). Prints each run's median ns a pair, then a table: the
# median and the fastest run of each configuration and what the shim adds to bare, by both.
#   Usage: bash scripts/gpu/shim_cost.sh DIR [RUNS] [PAIRS] [CPUS]     (defaults 11, 1000000, 0,1)
set -u
DIR=$(cd "$1" && pwd)
RUNS=${2:-11}
PAIRS=${3:-1000000}
CPUS=${4:-0,1}
W=$(mktemp -d /tmp/vt-cost.XXXX)
ln -s "$DIR/libfakecuda.so" "$W/libcuda.so.1"
export LD_LIBRARY_PATH="$W" VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset FAKECUDA_LOG FAKECUDA_STATE VRAMTRACE_CAP VRAMTRACE_STACK_MIN_BYTES VRAMTRACE_STACKS
echo "## host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), pinned to: $CPUS"
ns() { sed -n 's/.*median_ns=\([0-9.]*\).*/\1/p'; }
BP="$DIR/bench_pairs --pairs $PAIRS"
run_one() {
    local pin=$1 cfg=$2
    case $cfg in
    bare) $pin $BP ;;
    none) VRAMTRACE_STACKS=none $pin "$DIR/vramtrace" run -q --force -o "$W/t.vtrace" -- $BP ;;
    default) $pin "$DIR/vramtrace" run -q --force -o "$W/t.vtrace" -- $BP ;;
    cap) VRAMTRACE_STACKS=none $pin "$DIR/vramtrace" run -q --force --cap 15GiB -o "$W/t.vtrace" -- $BP ;;
    esac
}
CFGS="bare none default cap"
for where in pinned all; do
    pin=""
    [ "$where" = pinned ] && pin="taskset -c $CPUS"
    declare -A got=()
    for i in $(seq "$RUNS"); do
        line="run $i ($where):"
        for c in $CFGS; do
            v=$(run_one "$pin" "$c" 2>/dev/null | ns)
            got[$c]="${got[$c]:-} $v"
            line="$line $c $v"
        done
        echo "$line"
    done
    # Every traced run recorded every event: the last traced trace's counts.
    "$DIR/vramtrace" report --json "$W/t.vtrace" 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print("last trace: events", d["events"], "dropped", d["dropped_events"])'
    python3 - "$where" "${got[bare]}" "${got[none]}" "${got[default]}" "${got[cap]}" <<'PY'
import statistics, sys
where = sys.argv[1]
names = ["bare", "traced, call sites off", "traced, default settings", "traced + cap, call sites off"]
runs = [[float(x) for x in a.split()] for a in sys.argv[2:]]
bm, bf = statistics.median(runs[0]), min(runs[0])
print(f"\n| {where} | runs | median ns/pair | fastest | added (median) | added (fastest) |")
print("|---|---|---|---|---|---|")
for n, r in zip(names, runs):
    m, f = statistics.median(r), min(r)
    add = "" if n == "bare" else f"{m - bm:.1f}"
    addf = "" if n == "bare" else f"{f - bf:.1f}"
    print(f"| {n} | {len(r)} | {m:.1f} | {f:.1f} | {add} | {addf} |")
PY
    unset got
done
echo "## the floor under one event (pinned)"
taskset -c "$CPUS" "$DIR/bench-floor" --bench 2>&1 | tail -8
rm -rf "$W"

#!/usr/bin/env bash
# The committed benchmarks (figures go to docs/BENCHMARKS.md). Runs on the simulated driver, no GPU needed:
#   1. shim cost per cuMemAlloc_v2+cuMemFree_v2 pair: bare, traced with call sites off (VRAMTRACE_STACKS=none: the
#      recording alone), traced with the default settings, traced+capped (medians of 11 alternating runs), against
#      issue 9's and issue 3's targets
#   1a. sustained rate: 10 M events from one process as fast as it can (about 5 to 6 M events/s on the 2-core
#      machine), every event recorded or counted, and how many were dropped
#   1b. what capturing the call site adds (VRAMTRACE_STACKS none / native / all), by stack depth, for a repeated
#      call chain and for chains the thread has not seen lately (bench_pairs --sites 16)
#   2. 256 processes starting under one cap: wall time with and without the cap
#   3. collector ingest: cargo bench -p vramtrace --bench ingest (10M events)
#   4. export: cargo bench -p vramtrace --bench export (10M events to Perfetto and memory_viz)
#   5. live metrics: cargo bench -p vramtrace --bench metrics; 1c. the floor under one event (the clock and the
#      ring alone): cargo bench -p vramtrace-shim --bench floor
# Usage: scripts/bench.sh            (builds release first; VRAMTRACE_BENCH_ONLY=pairs: section 1 alone)
#        VRAMTRACE_BENCH_BIN=DIR scripts/bench.sh
#                                    (binaries built elsewhere, as scripts/gpu/prepare.sh --bench leaves them in
#                                    .gpu/: a machine without a toolchain, e.g. the GPU machine's host CPU)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ -n "${VRAMTRACE_BENCH_BIN:-}" ]; then
    R="$(cd "$VRAMTRACE_BENCH_BIN" && pwd)"
else
    cargo build --release --workspace --quiet
    R="$root/target/release"
fi
# A collector benchmark: the prebuilt executable if there is one, else cargo's.
bench() {
    if [ -x "$R/bench-$1" ]; then
        "$R/bench-$1" --bench
    else
        cargo bench -p vramtrace --bench "$1" --quiet 2>/dev/null
    fi
}
lib="$(mktemp -d)"
trap 'rm -rf "$lib"' EXIT
ln -s "$R/libfakecuda.so" "$lib/libcuda.so.1"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset FAKECUDA_LOG FAKECUDA_STATE VRAMTRACE_CAP VRAMTRACE_STACK_MIN_BYTES
export VRAMTRACE_STACKS=none
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ns() { sed -n 's/.*median_ns=\([0-9.]*\).*/\1/p'; }

echo "## Shim cost per alloc+free pair (simulated driver, 1 MiB, 1M pairs a run, 11 runs each, alternating)"
# Issue 9's targets: call sites off at most 50 ns added, default settings (call sites of a chain seen before) at
# most 100; issue 3's: the cap at most 50 over the uncapped shim. Medians; the runs are printed because a busy
# machine makes them fall in two groups.
# The floor under one pair, in the same run (issue 27: targets as ratios, whatever the machine): the clock read
# and one event published in a ring, twice (`cargo bench -p vramtrace-shim --bench floor`, its "together" line).
floor_both() {
    if [ -x "$R/bench-floor" ]; then
        "$R/bench-floor" --bench
    else
        cargo bench -p vramtrace-shim --bench floor --quiet 2>/dev/null
    fi | sed -n 's/^| the clock and the ring together | \([0-9.]*\) |$/\1/p'
}
floors=()
bare=() traced=() default=() capped=()
for i in $(seq 11); do
    # Three floors, spread over the runs (first, middle, last), so the machine's state is the pairs'.
    case $i in 1 | 6 | 11) floors+=("$(floor_both)") ;; esac
    bare+=("$("$R/bench_pairs" --pairs 1000000 | ns)")
    traced+=("$("$R/vramtrace" run -q --force --out "$lib/t.vtrace" -- "$R/bench_pairs" --pairs 1000000 | ns)")
    default+=("$(env -u VRAMTRACE_STACKS "$R/vramtrace" run -q --force --out "$lib/d.vtrace" -- "$R/bench_pairs" --pairs 1000000 | ns)")
    capped+=("$("$R/vramtrace" run -q --force --cap 15GiB --out "$lib/c.vtrace" -- "$R/bench_pairs" --pairs 1000000 | ns)")
done
b=$(printf '%s\n' "${bare[@]}" | median)
t=$(printf '%s\n' "${traced[@]}" | median)
d=$(printf '%s\n' "${default[@]}" | median)
c=$(printf '%s\n' "${capped[@]}" | median)
events=$("$R/vramtrace" report --json "$lib/t.vtrace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["events"], d["dropped_events"])')
echo "| configuration | median ns/pair | runs |"
echo "|---|---|---|"
echo "| bare driver | $b | ${bare[*]} |"
echo "| traced, call sites off | $t | ${traced[*]} |"
echo "| traced, default settings | $d | ${default[*]} |"
echo "| traced + cap, call sites off | $c | ${capped[*]} |"
awk -v b="$b" -v t="$t" -v d="$d" -v c="$c" 'BEGIN {
    printf "\nadded by the shim, call sites off: %.1f ns/pair (target <= 50: %s)\n", t-b, (t-b <= 50 ? "met" : "NOT met")
    printf "added by the shim, default settings: %.1f ns/pair (target <= 100: %s)\n", d-b, (d-b <= 100 ? "met" : "NOT met")
    printf "added by the cap: %.1f ns/pair (target <= 50: %s)\n", c-t, (c-t <= 50 ? "met" : "NOT met") }'
echo "last traced run: events recorded, dropped = $events (expected 2000000, 0)"
f=$(printf '%s\n' "${floors[@]}" | median)
awk -v b="$b" -v t="$t" -v d="$d" -v f="$f" -v runs="${floors[*]}" 'BEGIN {
    p = 2 * f
    printf "\nthe floor under a pair (clock + one slot published, twice; same run): %.1f ns (one event: %s)\n", p, runs
    printf "added by the shim, call sites off: %.2fx the floor (target <= 1.5x: %s)\n", (t-b)/p, ((t-b)/p <= 1.5 ? "met" : "NOT met")
    printf "added by the shim, default settings: %.2fx the floor (target <= 2x: %s)\n", (d-b)/p, ((d-b)/p <= 2 ? "met" : "NOT met") }'
# VRAMTRACE_BENCH_ONLY=pairs: this first table and its ratios alone (a few minutes).
[ "${VRAMTRACE_BENCH_ONLY:-}" = pairs ] && exit 0
echo
echo "## Sustained rate (one process, 5M pairs = 10M events, call sites off, default ring; 3 runs)"
echo "| run | ns/pair | events/s | recorded | dropped |"
echo "|---|---|---|---|---|"
for i in 1 2 3; do
    out=$("$R/vramtrace" run -q --force --out "$lib/r.vtrace" -- "$R/bench_pairs" --pairs 5000000)
    n=$(echo "$out" | ns)
    got=$("$R/vramtrace" report --json "$lib/r.vtrace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["events"], d["dropped_events"])')
    awk -v i="$i" -v n="$n" -v g="$got" 'BEGIN { split(g, a, " "); printf "| %d | %s | %.2f M | %s | %s |\n", i, n, 2000/n, a[1], a[2] }'
done
rm -f "$lib/r.vtrace"

echo
echo "## Call-site capture per alloc+free pair (simulated driver, 1 MiB, 300k pairs a run, 5 runs each, alternating)"
# depth: the return addresses above the driver call (bench_pairs' own, plus --depth nested frames). Repeated: the
# same call chain every time (the shim recognises it); unseen: 16 call chains in turn, more than the 8 a thread
# remembers, so every capture runs libgcc's unwinder.
declare -A runs frames
configs=("none 0 0" "native 0 0" "all 0 0" "none 0 16" "native 0 16"
    "none 40 0" "native 40 0" "all 40 0" "none 40 16" "native 40 16")
for i in 1 2 3 4 5; do
    for cfg in "${configs[@]}"; do
        set -- $cfg
        out=$(VRAMTRACE_STACKS=$1 VRAMTRACE_STACK_MIN_BYTES=0 "$R/vramtrace" run -q --force --out "$lib/s.vtrace" -- \
            "$R/bench_pairs" --pairs 300000 --depth "$2" --sites "$3")
        runs[$cfg]+="$(echo "$out" | ns) "
        frames[$cfg]=$(echo "$out" | sed -n 's/.*depth=\([0-9]*\).*/\1/p')
    done
done
echo "| VRAMTRACE_STACKS | frames | call chain | median ns/pair | added by the capture | runs |"
echo "|---|---|---|---|---|---|"
worst=0
for cfg in "${configs[@]}"; do
    set -- $cfg
    m=$(printf '%s\n' ${runs[$cfg]} | median)
    base=$(printf '%s\n' ${runs["none $2 $3"]} | median)
    chain=repeated
    [ "$3" != 0 ] && chain="unseen (16 in turn)"
    added=$(awk -v m="$m" -v b="$base" 'BEGIN { printf "%.0f", m - b }')
    [ "$3" = 0 ] && [ "$added" -gt "$worst" ] && worst=$added
    echo "| $1 | ${frames[$cfg]} | $chain | $m | $added | ${runs[$cfg]}|"
done
echo
echo "the capture adds at most $worst ns/pair for a repeated call chain (target <= 2000 at the median); an unseen"
echo "chain pays libgcc's unwinder (about 100 ns a frame), which VRAMTRACE_STACK_MIN_BYTES keeps off small allocations"

echo
if [ -x "$R/bench-floor" ]; then
    "$R/bench-floor" --bench
elif [ -z "${VRAMTRACE_BENCH_BIN:-}" ]; then
    cargo bench -p vramtrace-shim --bench floor --quiet 2>/dev/null
fi

echo
echo "## 256 processes starting under one run (each: init, one alloc/free pair, exit)"
many() {
    local s e
    s=$(date +%s%N)
    "$R/vramtrace" run -q --force --out "$lib/m.vtrace" "$@" -- bash -c \
        "for i in \$(seq 256); do \"$R/bench_pairs\" --pairs 1 --batch 1 >/dev/null & done; wait"
    e=$(date +%s%N)
    echo $(((e - s) / 1000000))
}
u=() k=()
for i in 1 2 3; do u+=("$(many)"); k+=("$(many --cap 15GiB)"); done
um=$(printf '%s\n' "${u[@]}" | median)
km=$(printf '%s\n' "${k[@]}" | median)
echo "| configuration | median wall ms | runs |"
echo "|---|---|---|"
echo "| traced, no cap | $um | ${u[*]} |"
echo "| traced, --cap 15GiB | $km | ${k[*]} |"
echo
echo "the cap added $((km - um)) ms for 256 processes (target < 1000 ms)"
procs=$("$R/vramtrace" report --json "$lib/m.vtrace" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["processes"]))')
echo "processes in the last trace: $procs (expected 256)"

echo
echo "## Collector ingest (cargo bench -p vramtrace --bench ingest)"
bench ingest | tail -n 20
echo
echo "## Export (cargo bench -p vramtrace --bench export: 10M events, 8 ranks)"
bench export | tail -n 8
echo
echo "## Live metrics (cargo bench -p vramtrace --bench metrics: ingest with and without --metrics, a scrape)"
bench metrics | tail -n 12

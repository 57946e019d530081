#!/usr/bin/env bash
# The committed benchmarks (figures go to docs/BENCHMARKS.md). Runs on the simulated driver, no GPU needed:
#   1. shim cost per cuMemAlloc_v2+cuMemFree_v2 pair: bare, traced, traced+capped (medians of 5 alternating runs)
#   2. 256 processes starting under one cap: wall time with and without the cap
#   3. collector ingest: cargo bench -p vramtrace --bench ingest (10M events)
# Usage: scripts/bench.sh            (builds release first)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo build --release --workspace --quiet
R="$root/target/release"
lib="$(mktemp -d)"
trap 'rm -rf "$lib"' EXIT
ln -s "$R/libfakecuda.so" "$lib/libcuda.so.1"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset FAKECUDA_LOG FAKECUDA_STATE VRAMTRACE_CAP
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ns() { sed -n 's/.*median_ns=\([0-9.]*\).*/\1/p'; }

echo "## Shim cost per alloc+free pair (simulated driver, 1 MiB, 1M pairs a run, 5 runs each, alternating)"
bare=() traced=() capped=()
for i in 1 2 3 4 5; do
    bare+=("$("$R/bench_pairs" --pairs 1000000 | ns)")
    traced+=("$("$R/vramtrace" run -q --force --out "$lib/t.vtrace" -- "$R/bench_pairs" --pairs 1000000 | ns)")
    capped+=("$("$R/vramtrace" run -q --force --cap 15GiB --out "$lib/c.vtrace" -- "$R/bench_pairs" --pairs 1000000 | ns)")
done
b=$(printf '%s\n' "${bare[@]}" | median)
t=$(printf '%s\n' "${traced[@]}" | median)
c=$(printf '%s\n' "${capped[@]}" | median)
events=$("$R/vramtrace" report --json "$lib/t.vtrace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["events"], d["dropped_events"])')
echo "| configuration | median ns/pair | runs |"
echo "|---|---|---|"
echo "| bare driver | $b | ${bare[*]} |"
echo "| traced (vramtrace run) | $t | ${traced[*]} |"
echo "| traced + cap | $c | ${capped[*]} |"
awk -v b="$b" -v t="$t" -v c="$c" 'BEGIN { printf "\nadded by the shim: %.1f ns/pair (target <= 200); added by the cap: %.1f ns/pair (target <= 50)\n", t-b, c-t }'
echo "last traced run: events recorded, dropped = $events (expected 2000000, 0)"

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
cargo bench -p vramtrace --bench ingest --quiet 2>/dev/null | tail -n 20

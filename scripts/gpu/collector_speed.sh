#!/usr/bin/env bash
# The collector's speed figures on the GPU machine's host CPU (16 cores), from binaries carried in DIR
# (scripts/gpu/prepare.sh --bench): what --metrics costs the receivers (the bench, and end to end with many
# processes), the 10 M-event report on all cores and on two (taskset), and the 1 MiB GPU loop bare vs traced.
#   Usage: bash scripts/gpu/collector_speed.sh DIR [OUTDIR]     (SKIP_GPU=1: not the GPU loop)
set -u
DIR=$(cd "$1" && pwd)
O=${2:-/tmp}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
echo "## host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "## metrics bench"
"$DIR/bench-metrics" --bench 2>&1 | tee "$O/metrics-bench.txt" | grep -E "events/s|median|scrape"
echo "## metrics end to end"
VRAMTRACE_BENCH_BIN="$DIR" bash scripts/metrics_ingest.sh 8 2000000 7 2>&1 | tee "$O/metrics-e2e.txt" | tail -9
echo "## report of 10 M events, all cores, then two"
for i in 1 2 3; do VRAMTRACE_BENCH_ONLY="8 ranks" "$DIR/bench-ingest" --bench 2>&1 | grep "^8 ranks "; done | tee "$O/ingest-all.txt"
for i in 1 2 3; do VRAMTRACE_BENCH_ONLY="8 ranks" taskset -c 2,3 "$DIR/bench-ingest" --bench 2>&1 | grep "^8 ranks "; done | tee "$O/ingest-2.txt"
echo "## the floor under one event"
"$DIR/bench-floor" --bench 2>&1 | tee "$O/floor.txt" | tail -8
[ "${SKIP_GPU:-}" = 1 ] && exit 0
echo "## GPU loop"
bash scripts/gpu/overhead.sh "$DIR" 16 30000 2>&1 | tee "$O/overhead.txt" | tail -4

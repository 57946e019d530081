#!/usr/bin/env bash
# What --metrics costs the collector end to end (issue 12): K processes of bench_pairs, each as fast as it goes,
# under `vramtrace run --lossless` (a full ring makes the program wait, so the job's rate is the collector's
# ingest rate once the programs outrun it), with and without `--metrics` (the live reader decoding the trace
# behind the receivers, a scrape every 100 ms). Runs alternate; events/s of each run from its wall time and
# the trace's own event count; medians, and the median of paired differences. The simulated driver, no GPU: meant
# for a machine with cores to spare (the programs need K of them, the collector its own).
#   Usage: scripts/metrics_ingest.sh [PROCS] [PAIRS_PER_PROC] [RUNS]
#          VRAMTRACE_BENCH_BIN=DIR scripts/metrics_ingest.sh ...   (binaries built elsewhere, e.g. .gpu/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
K=${1:-8}
PAIRS=${2:-2000000}
RUNS=${3:-7}
if [ -n "${VRAMTRACE_BENCH_BIN:-}" ]; then
    R="$(cd "$VRAMTRACE_BENCH_BIN" && pwd)"
else
    cargo build --release --workspace --quiet
    R="$root/target/release"
fi
lib="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$lib"' EXIT
ln -s "$R/libfakecuda.so" "$lib/libcuda.so.1"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VRAMTRACE_SHIM="$R/libvramtrace.so"
unset FAKECUDA_LOG FAKECUDA_STATE VRAMTRACE_CAP VRAMTRACE_STACK_MIN_BYTES
export VRAMTRACE_STACKS=none
port=$((20000 + RANDOM % 20000))
# The job times itself, from before its processes start to after the last one ended: the trace's fsync and the
# summary's replay, which `vramtrace run` does after the job, are not ingest. A small ring (lossless) leaves
# little undrained when a process ends.
export VRAMTRACE_RING_BYTES=$((1 << 20))
job="date +%s.%N > \"$lib/t0\"; for i in \$(seq $K); do \"$R/bench_pairs\" --pairs $PAIRS >/dev/null & done; wait; date +%s.%N > \"$lib/t1\""

# One run: events/s (the trace's count over the wall time).
one() {
    local extra=() scraper=""
    if [ "$1" = on ]; then
        extra=(--metrics "127.0.0.1:$port")
        # A scrape every 100 ms while it runs, as a busy Prometheus would not even do.
        if command -v curl >/dev/null; then
            get=(curl -s -o /dev/null)
        else
            get=(python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1]).read()')
        fi
        (while sleep 0.1; do "${get[@]}" "http://127.0.0.1:$port/metrics" 2>/dev/null || true; done) &
        scraper=$!
    fi
    local t0 t1
    "$R/vramtrace" run -q --force --lossless "${extra[@]}" --out "$lib/m.vtrace" -- bash -c "$job"
    t0=$(cat "$lib/t0") t1=$(cat "$lib/t1")
    [ -n "$scraper" ] && kill "$scraper" 2>/dev/null && wait "$scraper" 2>/dev/null || true
    local ev
    ev=$("$R/vramtrace" report --json "$lib/m.vtrace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["events"], d["dropped_events"])')
    set -- $ev
    [ "$2" = 0 ] || echo "  (dropped $2: not lossless?)" >&2
    python3 -c "print(f'{$1 / ($t1 - $t0) / 1e6:.2f}')"
}

echo "## The collector's ingest with and without --metrics ($K processes x $PAIRS pairs, --lossless, $RUNS runs each, alternating; $(nproc) cores)"
off=() on=()
one off >/dev/null # warm
for i in $(seq "$RUNS"); do
    if ((i % 2)); then a=$(one off); b=$(one on); else b=$(one on); a=$(one off); fi
    off+=("$a") on+=("$b")
    echo "run $i: without $a, with $b M events/s"
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
d = [(y / x - 1) * 100 for x, y in zip(a, b)]
print(f"median: {statistics.median(a):.2f} without, {statistics.median(b):.2f} with metrics (M events/s): "
      f"{(1 - statistics.median(b) / statistics.median(a)) * 100:+.2f}% cost; median of paired differences "
      f"{-statistics.median(d):+.2f}% cost (target <= 1%)")
PY

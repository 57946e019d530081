#!/usr/bin/env bash
# The collector's ingest benchmark (collector/benches/ingest.rs, `--bench`), BASE and HEAD alternately, pinned to
# cores 0 and 1 (a final call's GPU work runs on cores 2 and up), a pair at a time while a pair still fits.
# Run in the background by s58_final.sh and s59_final.sh.
#   Usage: bash scripts/gpu/ingest_ab.sh ROOT OUT BUDGET   (ROOT/{base,head}/bench-ingest; each run's output to
#          OUT/<build>-<n>.txt and "<build>-<n>:<seconds>:<exit>" lines to OUT/seconds.txt; BUDGET: seconds left)
#   env: EVENTS (VRAMTRACE_BENCH_EVENTS for each run)
set -u
ROOT=$1 OUT=$2 END=$3
mkdir -p "$OUT"
[ -n "${EVENTS:-}" ] && export VRAMTRACE_BENCH_EVENTS=$EVENTS
n=0
last=0
for pair in 1 2 3; do
    if ((pair > 1 && SECONDS + 2 * last + 10 > END)); then
        echo "[$SECONDS s] ingest: pair $pair not started (a run takes $last s)"
        break
    fi
    for b in base head; do
        n=$((n + 1))
        t0=$SECONDS
        (cd "$OUT" && taskset -c 0,1 timeout $((END - SECONDS + 5)) "$ROOT/$b/bench-ingest" --bench) \
            >"$OUT/$b-$n.txt" 2>&1
        rc=$?
        d=$((SECONDS - t0))
        ((d > last)) && last=$d
        echo "$b-$n:$d:$rc" >>"$OUT/seconds.txt"
        echo "[$SECONDS s] ingest $b-$n: exit $rc, $d s"
    done
done

#!/usr/bin/env bash
# Session 59 on a real GPU, in one call (about 550 s at most): the bridge after _torch.py's split by concern
# (5e92c73, ce270f7) and the live metrics reading the replay's observers (5a2d7d4, 64fde90), HEAD against BASE
# (c6bf344, session 58's last GPU proof). The GPU work is pinned to cores 2 and up:
#   1. the bridge's step cost inside one process (scripts/gpu/bridge_inproc.sh: the step hooks switched off and on
#      between ABBA blocks), HEAD then BASE, each under its own `vramtrace run` (each binary writes out its own
#      bridge); a second round of both at the end if the time allows;
#   2. PyTorch under set_per_process_memory_fraction (fraction_case.py 0.03 512) under each build's `run`; HEAD's
#      `oom` and `oom --json` read both traces: the bridge's oom record (PyTorch's figures) and its holders ("held
#      by") must read the same from HEAD's bridge as from BASE's;
#   3. HEAD's `run --stop-after-steps 5 -- python3 whatif_case.py train --batch 8 --steps 100000` (exit 0 at the
#      5th optimizer step, each step recorded);
#   4. scripts/gpu/s59_live.sh with HEAD (live_errors.sh, and /metrics at the job's end against `report --json`:
#      device peak, allocations, cap, total);
#   5. scripts/gpu/bridge.sh with HEAD (9 of 9);
#   6. beside all of it, pinned to cores 0 and 1: the collector's ingest benchmark (collector/benches/ingest.rs,
#      `--bench`), BASE and HEAD alternately, three pairs while they fit.
#   Usage: bash scripts/gpu/s59_final.sh DIR   (DIR holds base/ and head/, each with vramtrace, libvramtrace.so,
#   bench-ingest). END=S: everything ends by S seconds (default 550).
# Back under $OUT: run.log, tables.md, s59f.tgz (all files), inproc-*.out, s59-live.tgz, bridge-traces.tgz.
set -u
ROOT=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-s59f-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
END=${END:-550}
W=$(mktemp -d /tmp/s59f.XXXX)
export PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF
exec > >(tee -a "$OUT/run.log") 2>&1
NCPU=$(nproc)
GPU_CPUS=2-$((NCPU - 1))
((NCPU < 4)) && GPU_CPUS=0-$((NCPU - 1))  # (a dry run on a small machine)
echo "[$SECONDS s] start; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader); $NCPU cores"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
for b in base head; do echo "$b: $(ls -la "$ROOT/$b" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"; "$ROOT/$b/vramtrace" --version; done

# ---- 6. the ingest benchmark, in the background on cores 0 and 1 ----
bash "$HERE/ingest_ab.sh" "$ROOT" "$W/ingest" $((END - SECONDS)) &
ipid=$!

# ---- 1. the bridge's cost inside one process, round 1 ----
echo "[$SECONDS s] inproc round 1"
OUT="$W/inproc" ROUNDS=1 STOP=170 taskset -c "$GPU_CPUS" bash "$HERE/bridge_inproc.sh" "$ROOT/head" "$ROOT/base" \
    >"$W/inproc1.log" 2>&1
cat "$W/inproc1.log"

# ---- 2. PyTorch's fraction: the oom record and holders, HEAD's bridge against BASE's ----
F=$W/fraction
mkdir -p "$F/head" "$F/base"
for b in head base; do
    t0=$SECONDS
    (cd "$F/$b" && VRAMTRACE_SHIM="$ROOT/$b/libvramtrace.so" taskset -c "$GPU_CPUS" timeout 120 \
        "$ROOT/$b/vramtrace" run --force -o fraction.vtrace -- python3 "$HERE/fraction_case.py" 0.03 512) \
        >"$F/$b.out" 2>&1
    echo $? >"$F/$b.rc"
    echo "[$SECONDS s] fraction under $b's run: exit $(cat "$F/$b.rc"), $((SECONDS - t0)) s; $(grep '^RESULT' "$F/$b.out")"
done
for t in head base; do
    for r in head base; do
        "$ROOT/$r/vramtrace" oom --json "$F/$t/fraction.vtrace" >"$F/$t.by-$r.oom.json" 2>&1
        "$ROOT/$r/vramtrace" oom "$F/$t/fraction.vtrace" >"$F/$t.by-$r.oom.txt" 2>&1
    done
    "$ROOT/head/vramtrace" report "$F/$t/fraction.vtrace" >"$F/$t.report.txt" 2>&1
done
echo "=== HEAD's oom of HEAD's trace"
cat "$F/head.by-head.oom.txt"
echo "=== diff: HEAD's oom of BASE's trace (<) against of HEAD's trace (>), digits as they are"
diff "$F/base.by-head.oom.txt" "$F/head.by-head.oom.txt" | tee "$F/oom.diff"
echo "=== HEAD's report of HEAD's trace: lines with held / PyTorch"
grep -n -i -E "held by|pytorch|framework" "$F/head.report.txt" | head -20

# ---- 3. --stop-after-steps 5 ----
S=$W/stop
mkdir -p "$S"
t0=$(date +%s.%N)
(cd "$S" && VRAMTRACE_SHIM="$ROOT/head/libvramtrace.so" taskset -c "$GPU_CPUS" timeout 150 "$ROOT/head/vramtrace" run --force --stop-after-steps 5 -o stop.vtrace -- \
    python3 "$HERE/whatif_case.py" train --batch 8 --steps 100000) >"$S/stop.out" 2>"$S/stop.err"
echo $? >"$S/stop.rc"
python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$t0" >"$S/stop.seconds"
"$ROOT/head/vramtrace" report "$S/stop.vtrace" >"$S/stop.report.txt" 2>&1
"$ROOT/head/vramtrace" report --json "$S/stop.vtrace" >"$S/stop.report.json" 2>&1
echo "[$SECONDS s] stop-after-steps: exit $(cat "$S/stop.rc"), $(cat "$S/stop.seconds") s"
tail -5 "$S/stop.err"
grep -n -i "stopped" "$S/stop.report.txt" | head -5

# ---- 4. live metrics ----
echo "[$SECONDS s] s59_live"
OUT="$W/live" taskset -c "$GPU_CPUS" timeout 120 bash "$HERE/s59_live.sh" "$ROOT/head" >"$W/live.log" 2>&1
echo "[$SECONDS s] s59_live: exit $?"
cat "$W/live.log"

# ---- 5. bridge.sh ----
echo "[$SECONDS s] bridge.sh (time left: $((END - SECONDS)) s)"
OUT="$W/bridge" taskset -c "$GPU_CPUS" timeout $((END - SECONDS - 10)) bash "$HERE/bridge.sh" "$ROOT/head" >"$W/bridge.log" 2>&1
echo "[$SECONDS s] bridge.sh: exit $?"
grep '^|' "$W/bridge.log"

# ---- 1 again: a second round, if it fits ----
if ((END - SECONDS > 150)); then
    echo "[$SECONDS s] inproc round 2 (time left: $((END - SECONDS)) s)"
    mkdir -p "$W/inproc2"
    OUT="$W/inproc2" ROUNDS=1 STOP=$((END - SECONDS - 15)) taskset -c "$GPU_CPUS" bash "$HERE/bridge_inproc.sh" "$ROOT/head" "$ROOT/base" \
        >"$W/inproc2.log" 2>&1
    for f in "$W"/inproc2/inproc-*-1.out; do
        [ -f "$f" ] && cp "$f" "$W/inproc/$(basename "$f" -1.out)-2.out"
    done
    grep -E '^\[|^\| [a-z]' "$W/inproc2.log"
else
    echo "[$SECONDS s] inproc round 2 skipped: $((END - SECONDS)) s left"
fi

wait "$ipid"
echo "[$SECONDS s] ingest done: $(cat "$W/ingest/seconds.txt" | tr '\n' ' ')"
for f in "$W"/ingest/*-*.txt; do
    echo "=== $(basename "$f")"
    grep -v '^  \[' "$f" | grep -v '^$' | grep -v '^targets'
done
echo "[$SECONDS s] end; $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
{
    echo "=== TABLES"
    python3 "$HERE/s59_final.py" inproc "$W" 2>&1
    python3 "$HERE/s58_final.py" fraction "$W" 2>&1
    python3 "$HERE/s59_final.py" oomcmp "$W" 2>&1
    python3 "$HERE/s59_final.py" records "$W" 2>&1
    python3 "$HERE/s58_final.py" stop "$W" 2>&1
    grep -E '^(yes|NO|live_errors|s59_live)' "$W/live.log"
    grep '^|' "$W/bridge.log"
    python3 "$HERE/s59_final.py" ingest "$W" 2>&1
} >"$OUT/tables.md"
cp "$W"/inproc/inproc-*.out "$OUT/" 2>/dev/null
tar czf "$OUT/s59f.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
cat "$OUT/tables.md"

#!/usr/bin/env bash
# Session 58's final build on a real GPU, against the session's start, in one call (about 560 s at most):
#   1. the Python bridge's cost per iteration (issue 51: the wire now JSON, the step counting moved into
#      bridge/vramtrace_bridge/_steps.py): scripts/gpu/bridge_cost.sh with BASE's build, then HEAD's, one round each
#      (bare on off off on bare), then a second round of each if the time allows. Each `vramtrace` writes out the
#      bridge it was built with (collector/src/files/bridge_files.rs), so BASE's binary runs BASE's bridge.
#   2. PyTorch under torch.cuda.set_per_process_memory_fraction (scripts/gpu/fraction_case.py, 0.03 of the GPU,
#      512 MiB tensors until OutOfMemoryError) under each build's `vramtrace run`; `vramtrace oom` and `oom --json`
#      of each build on each trace: HEAD's framework_limit rule against what BASE said, PyTorch's figures beside.
#   3. HEAD's `vramtrace run --stop-after-steps 5 -- python3 whatif_case.py train --batch 8 --steps 100000`: the
#      program must end after its 5th optimizer step (exit 0); the trace's `steps` and `stopped` records, `report`.
#   4. Beside all of it, pinned to cores 0 and 1 (the GPU work to cores 2 and up): the collector's ingest benchmark
#      (collector/benches/ingest.rs, `--bench`), BASE and HEAD alternately, a pair at a time while a pair fits.
# Optional, if time is left: `fit` of train under a 16 GiB cap (scripts/gpu/fit.sh).
#   Usage: bash scripts/gpu/s58_final.sh DIR   (from the repository root; DIR holds base/ and head/, each with
#   vramtrace, libvramtrace.so, bench-ingest). END=S: everything ends by S seconds (default 560);
#   EVENTS=N: VRAMTRACE_BENCH_EVENTS (default the benchmark's 10 M).
# Back under $OUT: run.log, tables.md, s58f.tgz (every file: the traces of 2 and 3, the oom and report outputs, the
# bridge_cost folders, the benchmark's outputs). Tables last (scripts/gpu/s58_final.py).
set -u
ROOT=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-s58f-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
END=${END:-560}
W=$(mktemp -d /tmp/s58f.XXXX)
export PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF
exec > >(tee -a "$OUT/run.log") 2>&1
NCPU=$(nproc)
GPU_CPUS=2-$((NCPU - 1))
((NCPU < 4)) && GPU_CPUS=0-$((NCPU - 1))  # (a dry run on a small machine)
echo "[$SECONDS s] start; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader); $NCPU cores"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
for b in base head; do echo "$b: $(ls -la "$ROOT/$b" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"; done

# ---- 4. the ingest benchmark, in the background on cores 0 and 1 ----
bash "$HERE/ingest_ab.sh" "$ROOT" "$W/ingest" $((END - SECONDS)) &
ipid=$!

# ---- 2. PyTorch's fraction ----
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
done
"$ROOT/head/vramtrace" report "$F/head/fraction.vtrace" >"$F/head.report.txt" 2>&1
echo "=== HEAD's oom of HEAD's trace"
cat "$F/head.by-head.oom.txt"
echo "=== BASE's oom of BASE's trace (what it said before)"
cat "$F/base.by-base.oom.txt"

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
head -30 "$S/stop.report.txt"

# ---- 1. the bridge's cost: base, head, then again if a pair fits ----
unset VRAMTRACE_SHIM
pairlen=0
for half in 1 2; do
    if ((half > 1 && SECONDS + pairlen + 25 > END)); then
        echo "[$SECONDS s] bridge cost: second round not started (a pair took $pairlen s)"
        break
    fi
    p0=$SECONDS
    for b in base head; do
        t0=$SECONDS
        echo "[$SECONDS s] bridge cost: $b, round $half"
        OUT="$W/bc-$b-$half" ROUNDS=1 STOP=60 taskset -c "$GPU_CPUS" timeout $((END - SECONDS - 10)) \
            bash "$HERE/bridge_cost.sh" "$ROOT/$b" >"$W/bc-$b-$half.log" 2>&1
        echo "[$SECONDS s] bridge cost: $b, round $half: exit $?, $((SECONDS - t0)) s"
        grep '^| ' "$W/bc-$b-$half.log" | tail -8
    done
    pairlen=$((SECONDS - p0))
done

# ---- optional: a quick fit ----
if ((END - SECONDS > 150)); then
    echo "[$SECONDS s] fit train:16GiB (time left: $((END - SECONDS)) s)"
    CASES=train:16GiB YARD=0 BUDGET=$((END - SECONDS - 60)) OUT=$W taskset -c "$GPU_CPUS" \
        timeout $((END - SECONDS - 15)) bash "$HERE/fit.sh" "$ROOT/head" >"$W/fit.log" 2>&1
    echo "[$SECONDS s] fit: exit $?"
    grep '^|' "$W/fit.log"
else
    echo "[$SECONDS s] fit skipped: $((END - SECONDS)) s left"
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
    python3 "$HERE/s58_final.py" bridge "$W" 2>&1 | grep -v '^[bh][ae][sa][ed] '
    python3 "$HERE/s58_final.py" fraction "$W" 2>&1
    python3 "$HERE/s58_final.py" stop "$W" 2>&1
    python3 "$HERE/s58_final.py" ingest "$W" 2>&1
} >"$OUT/tables.md"
python3 "$HERE/s58_final.py" bridge "$W" >"$W/bridge-runs.txt" 2>&1
tar czf "$OUT/s58f.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
cat "$OUT/tables.md"

#!/usr/bin/env bash
# Session 57's final-build check in one call (about 590 s): first, alone on the whole device, issue 48's
# `vramtrace fit --verify` of whatif_case.py train (fit.sh, CASES=train:device YARD=0); then side by side issue 49's
# loops (loops.sh, capped cases and `steady`) and the step_need false-positive check (step_need_fp.sh, padded 11
# under 6 GiB and train 137 under 16 GiB). The fit runs alone because its limit is the whole device: anything
# beside it would take memory from its runs and move its answer.
#   Usage: bash scripts/gpu/s57_final.sh DIR   (DIR: the carried build: vramtrace, libvramtrace.so)
#   END=S: the whole script ends by S seconds (default 570); FIT_BUDGET=S: fit.sh's BUDGET (default 190: its
#   fit is cut off at S+40 s).
# Back under $OUT (8 files): run.log, fit/table.md, fit/results.json, fit.tgz, loops/table.md, loops.tgz,
# stepfp/table.md, stepfp.tgz.
set -u
DIR=$1
OUT=${OUT:-/tmp/vramtrace-s57-out}
export OUT
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
END=${END:-570}
FIT_BUDGET=${FIT_BUDGET:-190}
mkdir -p "$OUT"
RUNLOG=$OUT/run.log
exec > >(tee -a "$RUNLOG") 2>&1
echo "[$SECONDS s] start; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader)"

# C: issue 48 on the whole device, alone.
echo "[$SECONDS s] C: fit.sh CASES=train:device YARD=0 BUDGET=$FIT_BUDGET"
CASES=train:device YARD=0 BUDGET=$FIT_BUDGET KEEP="table.md results.json" \
    timeout $((FIT_BUDGET + 70)) bash "$HERE/fit.sh" "$DIR" >"$OUT/c.out" 2>&1
echo "[$SECONDS s] C: fit.sh exit $?"
grep -v '^\(total\|[-d]r\)' "$OUT/c.out" | tail -8
rm -f "$OUT/c.out"

# A and B side by side.
T1=$SECONDS
DA=$((END - T1 - 35))
echo "[$SECONDS s] A: loops.sh DEADLINE=$DA; B: step_need_fp.sh (train137, padded11)"
RUNS="train137:train:137:30:16GiB padded11:padded:11:60:6GiB" TMO=$((END - T1 - 30 < 150 ? END - T1 - 30 : 150)) \
    bash "$HERE/step_need_fp.sh" "$DIR" >"$OUT/b.out" 2>&1 &
bpid=$!
ONLY="gen_long:2GiB gen_step_long:2GiB longer longer_opt serve:4GiB eval_gpu:4GiB steady:none" WHATIF=serve \
    DEADLINE=$DA timeout $((END - T1)) bash "$HERE/loops.sh" "$DIR" >"$OUT/a.out" 2>&1
echo "[$SECONDS s] A: loops.sh exit $?"
wait "$bpid"
echo "[$SECONDS s] B: step_need_fp.sh exit $?"
echo "=== B (step_need_fp.sh)"
cat "$OUT/b.out"
echo "=== A (loops.sh)"
grep -v '^|' "$OUT/a.out" | tail -40
rm -f "$OUT/a.out" "$OUT/b.out"
echo "[$SECONDS s] end; $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
echo "=== TABLES"
cat "$OUT/fit/table.md" "$OUT/stepfp/table.md" "$OUT/loops/table.md" 2>&1

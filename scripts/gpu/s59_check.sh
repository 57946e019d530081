#!/usr/bin/env bash
# Session 59's final check on a real GPU, in one call (END seconds at most, default 445): HEAD against the last
# GPU-proven build (64fde90). Since then the collector's code only moved between files (af38b6a, 5873e79,
# 3503dee, 7ec327e; the receive/ intake's acceptor, reaps and connections among them), and one model change
# (0dfabc4: a framework's own out-of-memory error takes the device's total from the driver's last report, so
# `vramtrace oom` says "device total" and "outside the job" instead of "unknown"). Steps, each with a time budget:
#   1. scripts/gpu/bridge.sh (9 of 9 expected; its sampler row uses bridge_parts.py);
#   2. PyTorch under set_per_process_memory_fraction (fraction_case.py 0.03 512) under `vramtrace run`, then
#      `oom --full` and `oom --json`: cause framework_limit, device total = PyTorch's mem_get_info total (the
#      driver's), "outside the job" a figure; nvidia-smi's memory.total beside it;
#   3. `run --stop-after-steps 5 -- python3 whatif_case.py train` (exit 0, "STOPPED after 5 steps");
#   4. scripts/gpu/s59_live.sh (live_errors.sh, then /metrics at a job's end against `report --json`);
#   5. the cap through the moved intake: cap_oom.sh's cases cap-torch (a capped PyTorch job refused at the cap, its
#      post-mortem), cap-two-procs (two child processes of the job under one cap) and oom-cap (a training loop
#      refused at the cap, its post-mortem), run from a copy of cap_oom.sh cut to those three.
#   Usage: bash scripts/gpu/s59_check.sh DIR   (DIR: vramtrace, libvramtrace.so). END=S: everything ends by S s.
# Back under $OUT: run.log, tables.md, s59c.tgz (all files).
set -u
ROOT=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-s59c-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
END=${END:-445}
W=$(mktemp -d /tmp/s59c.XXXX)
export PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF
exec > >(tee -a "$OUT/run.log") 2>&1
left() { echo $((END - SECONDS)); }
budget() { # WANT: at most WANT seconds, never past END - 5
    local l=$((END - SECONDS - 5))
    ((l < $1)) && echo "$l" || echo "$1"
}
echo "[$SECONDS s] start; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader); $(nproc) cores"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
echo "build: $(ls -la "$ROOT" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"
"$ROOT/vramtrace" --version
SMI_TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -n1 | tr -d ' ')

# ---- 1. bridge.sh ----
t=$(budget 330)
echo "[$SECONDS s] bridge.sh (budget $t s)"
(cd "$HERE/../.." && OUT="$W/bridge" timeout "$t" bash "$HERE/bridge.sh" "$ROOT") >"$W/bridge.log" 2>&1
echo "[$SECONDS s] bridge.sh: exit $?"
grep '^|' "$W/bridge.log"

# ---- 2. PyTorch's fraction: oom --full ----
F=$W/fraction
mkdir -p "$F"
t=$(budget 60)
t0=$SECONDS
(cd "$F" && VRAMTRACE_SHIM="$ROOT/libvramtrace.so" timeout "$t" "$ROOT/vramtrace" run --force -o fraction.vtrace -- \
    python3 "$HERE/fraction_case.py" 0.03 512) >"$F/run.out" 2>&1
echo $? >"$F/rc"
echo "[$SECONDS s] fraction: exit $(cat "$F/rc"), $((SECONDS - t0)) s; $(grep '^RESULT' "$F/run.out")"
"$ROOT/vramtrace" oom --full "$F/fraction.vtrace" >"$F/oom-full.txt" 2>&1
"$ROOT/vramtrace" oom --json "$F/fraction.vtrace" >"$F/oom.json" 2>&1
"$ROOT/vramtrace" report --json "$F/fraction.vtrace" >"$F/report.json" 2>&1
echo "=== oom --full"
cat "$F/oom-full.txt"

# ---- 3. --stop-after-steps 5 ----
S=$W/stop
mkdir -p "$S"
t=$(budget 90)
t0=$(date +%s.%N)
(cd "$S" && VRAMTRACE_SHIM="$ROOT/libvramtrace.so" timeout "$t" "$ROOT/vramtrace" run --force --stop-after-steps 5 -o stop.vtrace -- \
    python3 "$HERE/whatif_case.py" train --batch 8 --steps 100000) >"$S/stop.out" 2>"$S/stop.err"
echo $? >"$S/stop.rc"
python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$t0" >"$S/stop.seconds"
"$ROOT/vramtrace" report "$S/stop.vtrace" >"$S/stop.report.txt" 2>&1
"$ROOT/vramtrace" report --json "$S/stop.vtrace" >"$S/stop.report.json" 2>&1
echo "[$SECONDS s] stop-after-steps: exit $(cat "$S/stop.rc"), $(cat "$S/stop.seconds") s"
tail -5 "$S/stop.err"
grep -n -i "stopped" "$S/stop.report.txt" | head -5

# ---- 4. live metrics ----
t=$(budget 120)
echo "[$SECONDS s] s59_live (budget $t s)"
OUT="$W/live" timeout "$t" bash "$HERE/s59_live.sh" "$ROOT" >"$W/live.log" 2>&1
echo "[$SECONDS s] s59_live: exit $?"
cat "$W/live.log"

# ---- 5. the cap: cap_oom.sh cut to cap-torch, cap-two-procs, oom-cap ----
C=$W/cap
mkdir -p "$C"
{
    sed -e "s|^HERE=.*|HERE=\"$HERE\"|" -e '/^if have torch; then$/,$d' "$HERE/cap_oom.sh"
    printf '%s\n' 'if have torch; then' '    case_cap_torch' '    case_two_procs' '    case_oom_cap' 'fi' 'finish' 'exit 0'
} >"$C/cap_subset.sh"
t=$(budget 150)
echo "[$SECONDS s] cap subset (budget $t s)"
OUT="$C" CAP_OOM_DEADLINE_S=$((t - 10)) timeout "$t" bash "$C/cap_subset.sh" "$ROOT" >"$W/cap.log" 2>&1
echo "[$SECONDS s] cap subset: exit $?"
sed -n '/=== vramtrace cap/,$p' "$W/cap.log"

echo "[$SECONDS s] end; $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
{
    echo "=== TABLES"
    echo "--- bridge.sh"
    grep '^|' "$W/bridge.log"
    echo "--- fraction: oom --full"
    SMI_TOTAL_MIB=$SMI_TOTAL_MIB python3 - "$F" <<'PY'
import json, os, re, sys
d = sys.argv[1]
rd = lambda p: open(os.path.join(d, p), errors="replace").read() if os.path.exists(os.path.join(d, p)) else ""
out = rd("run.out")
res = next((l for l in out.splitlines() if l.startswith("RESULT ")), "")
pt = dict(kv.split("=", 1) for kv in res.split()[1:] if "=" in kv)
print("exit", rd("rc").strip(), "; PyTorch:", res)
try:
    o = json.loads(rd("oom.json"))["ooms"][0]
except Exception as e:  # noqa: BLE001
    print("NO: oom --json unreadable:", type(e).__name__, e)
    o = {}
txt = rd("oom-full.txt")
line = lambda k: next((l.strip() for l in txt.splitlines() if l.strip().startswith(k)), "(no line)")
smi = int(os.environ.get("SMI_TOTAL_MIB") or 0)
tot = o.get("device_total_bytes")
pt_total = int(pt.get("total", "0") or 0)
checks = [
    ("cause framework_limit", f"{o.get('cause')} (rule {o.get('cause_rule')})", o.get("cause") == "framework_limit"),
    ("device_total_bytes = PyTorch's mem_get_info total", f"{tot} vs {pt_total}", tot is not None and tot == pt_total),
    ("device_total_bytes = 150,109,880,320", f"{tot}", tot == 150109880320),
    ("outside_job_bytes a figure", f"{o.get('outside_job_bytes')} (= total - free - job live: "
     f"{(tot or 0) - (o.get('device_free_bytes') or 0) - (o.get('job_live_bytes') or 0)})",
     isinstance(o.get("outside_job_bytes"), int)
     and o.get("outside_job_bytes") == (tot or 0) - (o.get("device_free_bytes") or 0) - (o.get("job_live_bytes") or 0)),
    ("text: device total", line("device total"), "unknown" not in line("device total") and "139.80 GiB" in line("device total")),
    ("text: outside the job", line("outside the job"), line("outside the job") != "(no line)" and "unknown" not in line("outside the job")),
    ("no 'unknown' in FIGURES", "", "unknown" not in txt.split("FIGURES", 1)[-1].split("\n\n", 1)[0]),
]
for name, got, ok in checks:
    print(f"{'yes' if ok else 'NO'} fraction: {name}: {got}")
print(f"nvidia-smi memory.total {smi} MiB = {smi * 1048576} B; driver's (cuMemGetInfo) {tot} B = {(tot or 0) / 1048576:.0f} MiB;"
      f" difference {smi * 1048576 - (tot or 0)} B = {(smi * 1048576 - (tot or 0)) / 1048576:.0f} MiB")
print("framework:", json.dumps(o.get("framework"))[:400])
print("device_free", o.get("device_free_bytes"), "job_live", o.get("job_live_bytes"), "context_estimate",
      o.get("context_estimate_bytes"), "outside_excess", o.get("outside_excess_bytes"))
PY
    echo "--- stop"
    python3 "$HERE/s58_final.py" stop "$W" 2>&1
    echo "--- live"
    grep -E '^(yes|NO|live_errors|s59_live)' "$W/live.log"
    echo "--- cap subset"
    sed -n '/^| case/,$p' "$C/cap-oom-table.md" 2>/dev/null
} >"$OUT/tables.md"
tar czf "$OUT/s59c.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
cat "$OUT/tables.md"

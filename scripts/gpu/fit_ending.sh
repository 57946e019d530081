#!/usr/bin/env bash
# Issue 48: what a fit run that "ran out of memory" after its steps really did. Runs a workload of whatif_case.py
# exactly as `vramtrace fit` runs it (collector/src/fit/runs.rs: `run --quiet --force --torch-history 4000000
# --stop-after-steps 5 --cap CAP`) at each value, then says per run: run's exit code, how the process ended (the
# bridge's stop is os._exit(0): "vanished" with exit code 0 and no last line from the program), the out-of-memory
# records in the trace, and the post-mortem's first lines (which allocation, from where).
#   Usage: bash scripts/gpu/fit_ending.sh DIR CASE CAP VALUE...      (DIR: the carried build)
# Writes $OUT/fit_ending/table.md and $OUT/fit_ending.tgz (post-mortems and reports; no traces).
set -u
DIR=$(cd "$1" && pwd)
c=$2
cap=$3
shift 3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-fit-ending-out}
mkdir -p "$OUT/fit_ending"
W=$(mktemp -d /tmp/vt-fitend.XXXX)
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
for v in "$@"; do
    t0=$SECONDS
    timeout 200 "$DIR/vramtrace" run --quiet --force --torch-history 4000000 --stop-after-steps 5 --cap "$cap" \
        --out "$W/$c.$v.vtrace" -- python3 "$HERE/whatif_case.py" "$c" --batch "$v" --steps 100000 \
        >"$W/$c.$v.log" 2>&1
    echo "rc=$? secs=$((SECONDS - t0))" >"$W/$c.$v.rc"
    "$DIR/vramtrace" oom --full "$W/$c.$v.vtrace" >"$W/$c.$v.oom.txt" 2>&1
    "$DIR/vramtrace" oom --json "$W/$c.$v.vtrace" >"$W/$c.$v.oom.json" 2>&1
    "$DIR/vramtrace" report "$W/$c.$v.vtrace" >"$W/$c.$v.report.txt" 2>&1
done
python3 - "$W" "$c" "$cap" "$@" <<'PY' | tee "$OUT/fit_ending/table.md"
import json, os, re, sys
w, c, cap, vals = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"| {c} under --cap {cap} | run rc | s | process ended (exit) | oom records | refusals recovered | the error (oom text) | PyTorch raised to the program? |")
print("|---|---|---|---|---|---|---|---|")
for v in vals:
    rc = open(os.path.join(w, f"{c}.{v}.rc")).read().split()
    txt = open(os.path.join(w, f"{c}.{v}.oom.txt"), errors="replace").read()
    rep = open(os.path.join(w, f"{c}.{v}.report.txt"), errors="replace").read()
    try:
        j = json.load(open(os.path.join(w, f"{c}.{v}.oom.json")))
    except ValueError:
        j = {}
    # The bridge's stop ends the process with os._exit(0): no goodbye ("vanished"), exit code 0, and the
    # program's own last line (its JSON, printed when it finishes or catches an out-of-memory error) missing.
    stopped = ["%s (%s)" % (p.get("ended"), p.get("exit")) for p in j.get("processes") or []]
    first = next((l.strip() for l in txt.splitlines() if "refused" in l or "raised" in l or "OUT OF MEMORY" in l), "-")
    raised = [l.strip() for l in txt.splitlines() if "PyTorch raised" in l or "caught" in l or "went on" in l][:2]
    log = open(os.path.join(w, f"{c}.{v}.log"), errors="replace").read()
    print(f"| {v} | {rc[0]} | {rc[1]} | {' '.join(stopped)[:120] or '-'} | {j.get('oom_records')} | {j.get('refusals_recovered')} | {first[:150]} | {' / '.join(raised)[:200] or '-'}{' (log: ' + log.strip().splitlines()[-1][:120] + ')' if log.strip() else ''} |")
PY
tar czf "$OUT/fit_ending.tgz" -C "$W" --exclude='*.vtrace*' . 2>/dev/null
rm -rf "$W"

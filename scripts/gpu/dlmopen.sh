#!/usr/bin/env bash
# Issue 50, item 3, on a real GPU: a program that dlmopen()s the driver into a link-map namespace of its own is not
# crashed by the shim (it died of SIGSEGV under `vramtrace run` on an H200 after its first allocation, before
# 5754c1d), the trace holds none of that copy's calls, and under a cap the GPU's own count (NVML) catches what it
# holds. Two programs: tests/programs/c/dlmopen_alloc.c (one cuMemAlloc, sleep, exit) and
# scripts/gpu/dlmopen_many.c (memset, synchronize, cuMemGetInfo, allocations freed, the context released; with
# `base`, 256 MiB through the first namespace's driver too, which the trace must hold). Each: bare, under
# LD_PRELOAD of the shim alone (no collector), under `vramtrace run`, `run --cap 1GiB` (enforce) and, for
# dlmopen_many, `run --cap 1GiB --cap-mode warn`. 3 GiB through the copy; nvidia-smi read while it holds.
# Prints a table last ($OUT/dlmopen/table.md); every output, report and trace in $OUT/dlmopen.tgz.
#   Usage: bash scripts/gpu/dlmopen.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/vramtrace-dlmopen-out}
mkdir -p "$OUT/dlmopen"
W=$(mktemp -d /tmp/vt-dlm.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
VT="$DIR/vramtrace"
BYTES=$((3072 << 20))
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader >gpu.txt
cc -O1 -Wall -o dlm "$REPO/tests/programs/c/dlmopen_alloc.c" -ldl 2>cc.err
cc -O1 -Wall -o dlmm "$REPO/scripts/gpu/dlmopen_many.c" -ldl 2>>cc.err
# one NAME PREFIX... -- PROGRAM ARGS: runs it (timeout 60), records rc, seconds, output, and nvidia-smi's view of
# its processes 2 s after it printed "held".
one() {
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$name.out" 2>"$name.err" &
    local pid=$!
    for _ in $(seq 1 100); do grep -q '^held' "$name.out" 2>/dev/null && break; sleep 0.1; done
    sleep 2
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >"$name.smi" 2>&1
    wait "$pid"
    local rc=$?
    echo "rc=$rc secs=$((SECONDS - t0))" >"$name.rc"
}
for prog in ${PROGS:-dlm dlmm}; do
    extra=()
    [ "$prog" = dlmm ] && extra=(${DLMM_EXTRA-base})
    one "$prog.bare" timeout 60 "./$prog" "$BYTES" 3000 "${extra[@]}"
    one "$prog.preload" env LD_PRELOAD="$DIR/libvramtrace.so" timeout 60 "./$prog" "$BYTES" 3000 "${extra[@]}"
    one "$prog.run" timeout 60 "$VT" run --force --out "$prog.run.vtrace" -- "./$prog" "$BYTES" 3000 "${extra[@]}"
    one "$prog.cap" timeout 60 "$VT" run --force --cap 1GiB --out "$prog.cap.vtrace" -- "./$prog" "$BYTES" 20000 "${extra[@]}"
    if [ "$prog" = dlmm ]; then
        one "$prog.warn" timeout 60 "$VT" run --force --cap 1GiB --cap-mode warn --out "$prog.warn.vtrace" -- \
            "./$prog" "$BYTES" 8000 "${extra[@]}"
    fi
    for t in run cap warn; do
        [ -f "$prog.$t.vtrace" ] || continue
        "$VT" report "$prog.$t.vtrace" >"$prog.$t.report.txt" 2>&1
        "$VT" report --json "$prog.$t.vtrace" >"$prog.$t.report.json" 2>&1
        "$VT" oom "$prog.$t.vtrace" >"$prog.$t.oom.txt" 2>&1
    done
done
python3 - "$BYTES" <<'PY' | tee "$OUT/dlmopen/table.md"
import json, os, re, sys
big = int(sys.argv[1])
print("GPU:", open("gpu.txt").read().strip())
print("| case | rc | s | program's last line | signal/crash | trace: allocations seen (bytes) | cap check said |")
print("|---|---|---|---|---|---|---|")
for prog in ("dlm", "dlmm"):
    for t in ("bare", "preload", "run", "cap", "warn"):
        n = f"{prog}.{t}"
        if not os.path.exists(n + ".rc"):
            continue
        rc = open(n + ".rc").read().split()
        out = open(n + ".out", errors="replace").read().strip().splitlines()
        err = open(n + ".err", errors="replace").read()
        sig = "SIGSEGV" if ("Segmentation" in err or "SIGSEGV" in err or "signal 11" in err) else "-"
        seen = "-"
        if os.path.exists(n + ".report.json"):
            try:
                j = json.load(open(n + ".report.json"))
                procs = j.get("processes") or []
                seen = "; ".join(f"pid {p.get('pid')} peak {p.get('peak_bytes')} ended {p.get('ended')} exit {p.get('exit')}" for p in procs)
            except ValueError as e:
                seen = f"report --json: {e}"
        said = " / ".join(l.removeprefix("vramtrace: ")[:200] for l in err.splitlines() if "past its cap" in l or "shim" in l and "cap" in l)[:400] or "-"
        print(f"| {n} | {rc[0]} | {rc[1]} | {(out[-1] if out else '')[:70]} | {sig} | {seen[:300]} | {said} |")
PY
tar czf "$OUT/dlmopen.tgz" ./* 2>/dev/null
rm -rf "$W"

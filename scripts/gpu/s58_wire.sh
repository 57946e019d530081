#!/usr/bin/env bash
# Session 58: the bridge's typed wire (issue 51, commit 408a406: each record one JSON object, frame kind 21) on a
# real GPU, in one call (about 545 s at most): bridge.sh whole (issue 8's cases, JAX included) in the background;
# once its first case is over (frag takes 68% of the free memory: nothing beside it), loops.sh's gen_long, serve,
# longer and steady beside it (issue 49's holders and step readings), then `wire_case.py jax_oom` (JAX's oom and
# exit records, which no other script makes). Prints last bridge.sh's and loops.sh's tables, then
# `wire_case.py summary`: the frames each trace holds (kind 21, no kind 13) and the programs' own figures beside
# the reports' (PyTorch's peaks and its figures at the error, the holders, JAX's).
#   Usage: bash scripts/gpu/s58_wire.sh DIR   (from the repository root; DIR: the carried build: vramtrace,
#   libvramtrace.so). END=S: everything ends by S seconds (default 545).
# Back under $OUT (6 files): run.log, bridge-log.txt, bridge-traces.tgz, loops/table.md, loops.tgz, wire.tgz.
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-s58-out}
export OUT
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
END=${END:-545}
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "[$SECONDS s] start; $(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader); $("$VT" --version 2>&1)"

echo "[$SECONDS s] bridge.sh (background)"
timeout $((END - 25)) bash "$HERE/bridge.sh" "$DIR" >"$OUT/bridge.out" 2>&1 &
bpid=$!
until grep -q '^=== keep' "$OUT/bridge-log.txt" 2>/dev/null || ! kill -0 "$bpid" 2>/dev/null || ((SECONDS > 150)); do
    sleep 1
done
T=$SECONDS
echo "[$SECONDS s] frag over; loops.sh DEADLINE=$((END - T - 90))"
ONLY="gen_long:2GiB serve:4GiB longer steady:none" DEADLINE=$((END - T - 90)) timeout $((END - T - 45)) \
    bash "$HERE/loops.sh" "$DIR" >"$OUT/loops.out" 2>&1
echo "[$SECONDS s] loops.sh exit $?"

WD=$(mktemp -d /tmp/vt-wire.XXXX)
if ((END - SECONDS > 60)); then
    echo "[$SECONDS s] jax_oom: XLA_PYTHON_CLIENT_MEM_FRACTION=0.04 vramtrace run -- python3 wire_case.py jax_oom"
    (
        cd "$WD" || exit 1
        XLA_PYTHON_CLIENT_MEM_FRACTION=0.04 JAX_PLATFORMS=cuda timeout $((END - SECONDS - 30)) \
            "$VT" run -o jax_oom.vtrace --force -- python3 "$HERE/wire_case.py" jax_oom >jax_oom.out 2>&1
        echo "rc=$?" >>jax_oom.out
        "$VT" oom --json jax_oom.vtrace >jax_oom.oom.json 2>&1
        "$VT" oom jax_oom.vtrace >jax_oom.oom.txt 2>&1
        "$VT" report --json jax_oom.vtrace >jax_oom.report.json 2>&1
        "$VT" report jax_oom.vtrace >jax_oom.report.txt 2>&1
        grep -v '^STATS' jax_oom.out | tail -12
    )
else
    echo "[$SECONDS s] jax_oom skipped: past the time"
fi

wait "$bpid"
echo "[$SECONDS s] bridge.sh exit $?"
if [ ! -s "$OUT/bridge-traces.tgz" ]; then
    echo "bridge.sh left no tarball: packing its work folder as it is"
    bw=$(ls -dt /tmp/vt-bridge.* | head -1)
    tar czf "$OUT/bridge-traces.tgz" -C "$bw" . 2>/dev/null
fi
if [ "$(stat -c %s "$OUT/bridge-traces.tgz")" -gt $((15 << 20)) ]; then
    bw=$(ls -dt /tmp/vt-bridge.* | head -1)
    echo "bridge-traces.tgz over 15 MiB: again without the pickles and the step traces"
    tar czf "$OUT/bridge-traces.tgz" -C "$bw" --exclude='*.pickle' --exclude='step-*.vtrace' --exclude='sampler.vtrace' . 2>/dev/null
fi
tar czf "$OUT/wire.tgz" -C "$WD" . 2>/dev/null
X=$(mktemp -d /tmp/vt-s58x.XXXX)
mkdir -p "$X/b" "$X/l"
tar xzf "$OUT/bridge-traces.tgz" -C "$X/b" 2>/dev/null
tar xzf "$OUT/loops.tgz" -C "$X/l" 2>/dev/null
echo "=== the bridge's records, one body of each kind"
python3 "$HERE/wire_case.py" kinds "$X"/b/*.vtrace "$X"/l/*.vtrace "$WD"/*.vtrace 2>&1 | cut -c1-420
echo "=== loops.sh (log)"
grep -v '^|' "$OUT/loops.out" | tail -20
echo "=== bridge.sh (log tail)"
grep -v '^|' "$OUT/bridge.out" | tail -10
rm -f "$OUT/loops.out"
echo "[$SECONDS s] end; $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
echo "=== TABLES"
grep '^|' "$OUT/bridge.out"
rm -f "$OUT/bridge.out"
cat "$OUT/loops/table.md" 2>&1
timeout 60 python3 "$HERE/wire_case.py" summary "$X/b" "$X/l" "$WD"

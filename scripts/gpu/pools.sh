#!/usr/bin/env bash
# Issue 10's stream-ordered pool case on a real GPU (scripts/gpu/pool_case.py under `DIR/vramtrace run --cap
# 4GiB`): the second process must be refused while the first one's pool holds 3 GiB, and the third served
# after the first trims. Prints the case's RESULT line and a verdict last.
#   Usage: bash scripts/gpu/pools.sh DIR
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-pools-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-pools.XXXX)
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
case_py=$(pwd)/scripts/gpu/pool_case.py
cd "$W" || exit 0
timeout 300 "$DIR/vramtrace" run -o pools.vtrace --cap 4GiB -- python3 "$case_py" >"$OUT/pools-out.txt" 2>&1
echo "rc=$?" >>"$OUT/pools-out.txt"
"$DIR/vramtrace" report pools.vtrace >"$OUT/pools-report.txt" 2>&1
cp pools.vtrace "$OUT/" 2>/dev/null
line=$(grep "^RESULT" "$OUT/pools-out.txt")
echo "$line"
ok=yes
echo "$line" | grep -q "second=\[child oom" || ok=NO
echo "$line" | grep -q "third=\[child ok" || ok=NO
echo "verdict: second refused and third served: $ok"

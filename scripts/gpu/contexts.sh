#!/usr/bin/env bash
# Contexts torn down on a real GPU (issue 10, item 6): scripts/gpu/contexts.c under `vramtrace run --cap 8GiB`,
# then the report's figures. Prints the program's lines and a table LAST.
#   Usage: bash scripts/gpu/contexts.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-ctx.XXXX)
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o "$W/contexts" "$HERE/contexts.c" -I"$CUDA_INC" -lcuda || exit 0
cd "$W" || exit 0
echo "--- bare (no vramtrace): what the driver does"
./contexts
echo "--- under vramtrace run --cap 8GiB"
timeout 120 "$VT" run -o ctx.vtrace --force --python-agent off --cap 8GiB -- ./contexts 2>&1 | tee ctx.out
echo "rc=${PIPESTATUS[0]}"
"$VT" report --json ctx.vtrace | python3 -c "
import json, sys
d = json.load(sys.stdin)
p = d['processes'][0]
print('| figure | value |')
print('|---|---|')
print('| device 0 peak (trace) |', d['devices'][0]['peak_bytes'], '|')
print('| bytes freed by context teardown (trace) |', p['context_freed_bytes'], '|')
print('| cap refusals |', p['cap_refusals'], '|')
print('| live at end |', p['live_bytes_at_end'], '|')
print('| lines where the shim said it could not wrap a function (want 0) |', sys.argv[1], '|')
" "$(grep -c 'does not know' ctx.out)"
"$VT" report ctx.vtrace | tail -20

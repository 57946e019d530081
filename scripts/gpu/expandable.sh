#!/usr/bin/env bash
# PyTorch's expandable segments under the cap on a real GPU (issue 10): scripts/gpu/expandable_case.py under
# `vramtrace run --cap 4GiB`, then the trace's figures. Prints a table LAST.
#   Usage: bash scripts/gpu/expandable.sh DIR
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-exp.XXXX)
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
cd "$W" || exit 0
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 "$VT" run -o exp.vtrace --force --cap 4GiB -- \
    python3 "$HERE/expandable_case.py" >exp.out 2>&1
grep -v "^RESULT" exp.out | tail -8
grep "^RESULT" exp.out || echo "no RESULT line"
"$VT" oom --json exp.vtrace | python3 -c "
import json, sys
d = json.load(sys.stdin)
print('| trace | value |')
print('|---|---|')
for o in d.get('ooms', [])[:2]:
    print('| OOM cause |', o.get('cause'), '|')
    print('| OOM requested bytes |', o.get('requested_bytes'), '|')
"
"$VT" report --json exp.vtrace | python3 -c "
import json, sys
d = json.load(sys.stdin)
print('| device 0 peak (trace) |', d['devices'][0]['peak_bytes'], '|')
print('| cap |', d['devices'][0].get('cap_bytes'), '|')
"

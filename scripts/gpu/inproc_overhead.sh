#!/usr/bin/env bash
# The shim's cost on the 1 MiB loop inside one process (scripts/gpu/inproc_overhead.c): bare (the control: both
# paths are the driver's), the shim preloaded with no collector, then under `vramtrace run` with the default
# settings and with call sites off.
#   Usage: bash scripts/gpu/inproc_overhead.sh DIR [BLOCKS] [PAIRS]   (DIR: vramtrace, libvramtrace.so)
#   CONFIGS="bare preload defaults none" (the default) picks which configurations each round runs.
set -u
DIR=$(cd "$1" && pwd)
BLOCKS=${2:-20}
PAIRS=${3:-1000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-inproc.XXXX)
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o "$W/inproc" "$HERE/inproc_overhead.c" -I"$CUDA_INC" -lcuda || { echo "inproc: build failed"; exit 1; }
CONFIGS=${CONFIGS:-bare preload defaults none}
has() { case " $CONFIGS " in *" $1 "*) return 0 ;; esac; return 1; }
for round in 1 2; do
    if has bare; then
        echo "--- round $round: bare (control)"
        "$W/inproc" "$BLOCKS" "$PAIRS" | grep '^inproc:'
    fi
    if has preload; then
        echo "--- round $round: the shim preloaded with no collector (its hooks run, nothing is recorded)"
        LD_PRELOAD="$VRAMTRACE_SHIM" "$W/inproc" "$BLOCKS" "$PAIRS" | grep '^inproc:' | grep -v 'exported==\|cuCtxGetDevice'
    fi
    if has defaults; then
        echo "--- round $round: vramtrace run (default settings: call sites of allocations of 1 MiB and more)"
        "$VT" run -q --force -o "$W/d.vtrace" -- "$W/inproc" "$BLOCKS" "$PAIRS" | grep '^inproc:' | grep -v 'exported==\|cuCtxGetDevice'
    fi
    if has none; then
        echo "--- round $round: vramtrace run --stacks none"
        "$VT" run -q --force --stacks none -o "$W/n.vtrace" -- "$W/inproc" "$BLOCKS" "$PAIRS" | grep '^inproc:' | grep -v 'exported==\|cuCtxGetDevice'
    fi
done
# Every call through the exported names is in the trace, none through the driver's own: (1000 warm-up pairs +
# BLOCKS x PAIRS) x 2 events, and the 100,300 cuMemFree_v2(0) of the warm and cold timings.
T="$W/n.vtrace"
[ -f "$T" ] || T="$W/d.vtrace"
[ -f "$T" ] && "$VT" report --json "$T" | python3 -c "
import json, sys
d = json.load(sys.stdin)
want = (1000 + $BLOCKS * $PAIRS) * 2 + 100300
print(f'last trace: events {d[\"events\"]} (expect {want}: the exported path only), dropped {d[\"dropped_events\"]}')"

#!/usr/bin/env bash
# Issue 39: how do cuDNN's workspaces grow with the batch? The conv workload of whatif_case.py run under vramtrace
# with its whole PyTorch history at several batches, and bare for PyTorch's own max_memory_reserved() at each.
# The requests the two-run fit could not place (neither constant, c*x nor c*x^2) are cuDNN's workspaces (issue 39,
# docs/gpu-runs/2026-11-28-whatif-batch-h200.md); their sizes across batches tell what a prediction can rely on.
#   Usage: bash scripts/gpu/workspaces.sh DIR    (DIR: the carried build)   BATCHES="16 32 48" picks the batches.
# $OUT/workspaces.tgz holds the traces and their gzipped histories (fixtures), and the bare runs' JSON lines.
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-workspaces-out}
W=$OUT/workspaces
mkdir -p "$W"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
STEPS=${STEPS:-6}
C=${C:-conv}
for b in ${BATCHES:-16 24 32 40 48 56 64}; do
    timeout 300 "$DIR/vramtrace" run -q --force --torch-history 4000000 -o "$W/$C.b$b.vtrace" -- \
        python3 "$CASE" "$C" --batch "$b" --steps "$STEPS" 2>>"$W/log.txt" | tail -1 >"$W/$C.b$b.json"
    timeout 300 python3 "$CASE" "$C" --batch "$b" --steps "$STEPS" 2>>"$W/log.txt" | tail -1 >"$W/$C.bare$b.json"
    echo "batch $b: traced $(cat "$W/$C.b$b.json")"
    echo "batch $b: bare   $(cat "$W/$C.bare$b.json")"
done
for p in "$W"/*.pickle; do [ -f "$p" ] && gzip -9f "$p"; done
tar czf "$OUT/workspaces.tgz" -C "$W" . && ls -la "$OUT/workspaces.tgz"

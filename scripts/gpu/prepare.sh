#!/usr/bin/env bash
# Builds the release pieces and copies them into .gpu/ (ignored by git), ready to carry to the GPU machine:
#   scripts/gpu/prepare.sh
#   then, with the device tool:  run  carry: [".gpu"]  command: bash scripts/gpu/check.sh .gpu  (timeout_s 600)
#   scripts/gpu/prepare.sh --bench   also the benchmarks' programs, for
#                                    VRAMTRACE_BENCH_BIN=.gpu scripts/bench.sh on the GPU machine's CPU
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cargo build --release
target="${CARGO_TARGET_DIR:-$root/target}/release"
mkdir -p .gpu
for f in vramtrace libvramtrace.so vramtrace-workload libfakecuda.so; do
    if [ -f "$target/$f" ]; then
        cp "$target/$f" .gpu/
    else
        echo "prepare.sh: $target/$f missing (not built)" >&2
    fi
done
if [ "${1:-}" = "--bench" ]; then
    cp "$target/bench_pairs" .gpu/
    # cargo names bench executables with a hash: take the newest of each.
    cargo bench -p vramtrace -p vramtrace-shim --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" ".gpu/bench-$name"; done
fi
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
# The device tool carries 64 MiB at most: drop debug info from the copies if they are too big.
if [ "$(du -sm .gpu | cut -f1)" -gt 48 ]; then
    strip --strip-debug .gpu/* || true
fi
du -sh .gpu
ls -l .gpu

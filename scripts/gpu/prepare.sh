#!/usr/bin/env bash
# Builds the release pieces and copies them into .gpu/ (ignored by git), ready to carry to the GPU machine:
#   scripts/gpu/prepare.sh
#   then, with the device tool:  run  carry: [".gpu"]  command: bash scripts/gpu/check.sh .gpu  (timeout_s 600)
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
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
# The device tool carries 64 MiB at most: drop debug info from the copies if they are too big.
if [ "$(du -sm .gpu | cut -f1)" -gt 48 ]; then
    strip --strip-debug .gpu/* || true
fi
du -sh .gpu
ls -l .gpu

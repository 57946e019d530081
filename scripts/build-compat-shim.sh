#!/usr/bin/env bash
# Builds libvramtrace.so for an old glibc baseline (2.17, as manylinux2014), so the shim loads on the compute
# nodes people run (RHEL 8 has glibc 2.28, Ubuntu 20.04 2.31) whatever glibc the build machine has. It links
# against zig's glibc 2.17 stubs through cargo-zigbuild; both come from PyPI (ziglang, cargo-zigbuild) and are
# installed into a virtual environment under the target folder if they are not on PATH (scripts/zigenv.sh).
#
# Usage: scripts/build-compat-shim.sh      prints the built library's path last
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
baseline=2.17

. "$root/scripts/zigenv.sh"

cargo zigbuild --locked --release -p vramtrace-shim --target "x86_64-unknown-linux-gnu.$baseline" \
    --target-dir "$target/compat" >&2
lib="$target/compat/x86_64-unknown-linux-gnu/release/libvramtrace.so"
[ -f "$lib" ] || { echo "build-compat-shim.sh: $lib was not built" >&2; exit 1; }
echo "$lib"

#!/usr/bin/env bash
# Builds vramtrace's wheel (`pip install vramtrace-*.whl`): one manylinux2014 (glibc 2.17) x86-64 wheel with
# `vramtrace` for the environment's PATH and the shim, the simulated driver and the demo's workload beside it.
# Everything is built against zig's glibc 2.17 stubs (cargo-zigbuild, scripts/zigenv.sh), then checked against
# the manylinux2014 policy and packed by scripts/wheel.py. docs/PACKAGING.md says why it is built this way and
# what an aarch64 wheel needs.
#
# Usage: scripts/build-wheel.sh [OUTDIR]      (default target/wheels); prints the wheel's path last
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${1:-$target/wheels}"
triple=x86_64-unknown-linux-gnu

. "$root/scripts/zigenv.sh"

# glibc217: what Rust's std links to that glibc 2.17 lacks (compat/), in the two binaries.
cargo zigbuild --locked --release -p vramtrace -p vramtrace-shim -p vramtrace-workload -p fakecuda \
    --features vramtrace/glibc217,vramtrace-workload/glibc217 \
    --target "$triple.2.17" --target-dir "$target/compat" >&2
built="$target/compat/$triple/release"
# The wheel's copies without debug information (a quarter of the size); their symbol tables stay, for backtraces
# and for the shim telling its own frames from its callers'.
stage="$target/compat/wheel-stage"
rm -rf "$stage" && mkdir -p "$stage"
for f in vramtrace libvramtrace.so libfakecuda.so vramtrace-workload; do
    objcopy --strip-debug "$built/$f" "$stage/$f"
done
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
python3 scripts/wheel.py --out "$out" --version "$version" --bin "$stage/vramtrace" \
    --lib "$stage/libvramtrace.so" --lib "$stage/libfakecuda.so" --lib "$stage/vramtrace-workload"

#!/usr/bin/env bash
# Build vramtrace in release mode and install it under PREFIX (default ~/.local):
#   PREFIX/bin/vramtrace
#   PREFIX/lib/vramtrace/{libvramtrace.so, vramtrace-workload, libfakecuda.so}
# `vramtrace` finds the other pieces in ../lib/vramtrace/ from its own folder.
#
# Usage: scripts/install.sh [PREFIX]
set -euo pipefail

prefix="${1:-$HOME/.local}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

command -v cargo >/dev/null 2>&1 || { echo "install.sh: cargo not found (install Rust from https://rustup.rs)" >&2; exit 1; }

cargo build --release

target="${CARGO_TARGET_DIR:-$root/target}/release"
for f in vramtrace libvramtrace.so vramtrace-workload libfakecuda.so; do
    [ -f "$target/$f" ] || { echo "install.sh: $target/$f was not built" >&2; exit 1; }
done
# The shim that ships is built for glibc 2.17, so it loads on older compute nodes than this machine.
shim="$target/libvramtrace.so"
if compat="$(scripts/build-compat-shim.sh)"; then
    shim="$compat"
else
    echo "install.sh: could not build the shim for glibc 2.17 (above); installing one for this machine's glibc" >&2
fi

mkdir -p "$prefix/bin" "$prefix/lib/vramtrace"
install -m 0755 "$target/vramtrace" "$prefix/bin/vramtrace"
install -m 0755 "$shim" "$prefix/lib/vramtrace/libvramtrace.so"
install -m 0755 "$target/vramtrace-workload" "$prefix/lib/vramtrace/vramtrace-workload"
install -m 0755 "$target/libfakecuda.so" "$prefix/lib/vramtrace/libfakecuda.so"

echo "installed: $prefix/bin/vramtrace"
echo "           $prefix/lib/vramtrace/{libvramtrace.so,vramtrace-workload,libfakecuda.so}"
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH; add it, e.g. export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
echo "try: vramtrace demo"

#!/usr/bin/env bash
# Builds libvramtrace.so for an old glibc baseline (2.17, as manylinux2014), so the shim loads on the compute
# nodes people run (RHEL 8 has glibc 2.28, Ubuntu 20.04 2.31) whatever glibc the build machine has. It links
# against zig's glibc 2.17 stubs through cargo-zigbuild; both come from PyPI (ziglang, cargo-zigbuild) and are
# installed into a virtual environment under the target folder if they are not on PATH.
#
# Usage: scripts/build-compat-shim.sh      prints the built library's path last
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
baseline=2.17

if ! command -v cargo-zigbuild >/dev/null 2>&1 || ! python3 -m ziglang version >/dev/null 2>&1; then
    env="$target/zigenv"
    if [ ! -x "$env/bin/cargo-zigbuild" ]; then
        echo "build-compat-shim.sh: installing ziglang and cargo-zigbuild (PyPI) into $env" >&2
        if python3 -m venv "$env" 2>/dev/null; then
            "$env/bin/python3" -m pip install -q --disable-pip-version-check ziglang cargo-zigbuild
        else
            # No venv module (Debian's python3 without python3-venv): a user install.
            python3 -m pip install -q --user --disable-pip-version-check ziglang cargo-zigbuild 2>/dev/null \
                || python3 -m pip install -q --user --break-system-packages --disable-pip-version-check \
                    ziglang cargo-zigbuild
            mkdir -p "$env/bin"
            ln -sf "$(python3 -m site --user-base)/bin/cargo-zigbuild" "$env/bin/cargo-zigbuild"
        fi
    fi
    export PATH="$env/bin:$PATH"
fi

cargo zigbuild --locked --release -p vramtrace-shim --target "x86_64-unknown-linux-gnu.$baseline" \
    --target-dir "$target/compat" >&2
lib="$target/compat/x86_64-unknown-linux-gnu/release/libvramtrace.so"
[ -f "$lib" ] || { echo "build-compat-shim.sh: $lib was not built" >&2; exit 1; }
echo "$lib"

#!/usr/bin/env bash
# Builds vramtrace's release wheel: one manylinux2014 (glibc 2.17) x86-64 wheel with `vramtrace` for the
# environment's PATH and the shim, the simulated driver and the demo's workload in `<env>/lib/vramtrace/`.
# A thin wrapper over the pyproject's build (`pip wheel .`: maturin, `bindings = "bin"`, through the small
# backend in pybuild/), with the release settings: `--zig --compatibility manylinux2014`, every binary linked
# against zig's glibc 2.17 stubs; then every binary in the wheel is checked against the manylinux2014 policy
# (scripts/wheel.py). docs/PACKAGING.md says why it is built this way and what an aarch64 wheel needs.
#
# The build's tools (maturin, ziglang, cargo-zigbuild, from PyPI) go into one virtual environment,
# `<target>/wheel-tools` (target: $CARGO_TARGET_DIR or ./target), installed once and reused; the build itself
# into `<target>/wheel/`.
#
# Usage: scripts/build-wheel.sh [OUTDIR]      (default <target>/wheels); prints the wheel's path last
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${1:-$target/wheels}"
triple=x86_64-unknown-linux-gnu
tools="$target/wheel-tools"

# The versions the pyproject asks for (its build-system requires) plus the two zig tools.
maturin_req="$(sed -n 's/^requires = \["\([^"]*\)"\]/\1/p' pyproject.toml | head -n1)"
if [ ! -x "$tools/bin/maturin" ] || ! "$tools/bin/python" -c 'import ziglang' 2>/dev/null \
    || [ ! -x "$tools/bin/cargo-zigbuild" ]; then
    echo "build-wheel.sh: installing the wheel's build tools ($maturin_req, ziglang, cargo-zigbuild; PyPI) into $tools" >&2
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check "$maturin_req" ziglang cargo-zigbuild >&2
fi

mkdir -p "$out"
rm -f "$out"/vramtrace-*.whl
# pip runs the pyproject's backend with the tools above (no isolated environment: nothing downloaded per build).
# The backend builds in $target/wheel/ and says what it builds on stderr.
CARGO_TARGET_DIR="$target" PATH="$tools/bin:$PATH" "$tools/bin/python" -m pip wheel . -q --no-deps \
    --no-build-isolation --disable-pip-version-check -w "$out" \
    --config-settings "build-args=--zig --compatibility manylinux2014 --target $triple" >&2
whl="$(ls "$out"/vramtrace-*.whl)"
python3 scripts/wheel.py "$whl"
echo "$whl"

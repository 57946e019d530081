#!/usr/bin/env bash
# `pip install .` from this checkout into a fresh virtual environment, as a user installs it (pip's isolated build
# environment, maturin from PyPI), then `vramtrace demo` from that environment alone: it must run the bundled
# workload on the simulated driver, print a user's report, and leave nothing in the temporary folder.
#
# Exactly a user's command, so it builds for this machine (not the release wheel's glibc 2.17 build, which
# scripts/build-wheel.sh makes and tests/e2e/tests/wheel.rs installs): a release build of the four binaries, in
# <target>/wheel/release/ (about 2 minutes on 2 cores; reused when nothing changed).
#
# Usage: scripts/test-pip-install.sh      exit 1 with the reason when any check fails
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d "${TMPDIR:-/tmp}/vramtrace-pip-install-XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "test-pip-install.sh: FAILED: $*" >&2; exit 1; }

python3 -m venv "$work/venv"
start=$SECONDS
CARGO_TARGET_DIR="$target" "$work/venv/bin/python" -m pip install -q --disable-pip-version-check . >&2 \
    || fail "pip install . into a fresh environment"
echo "test-pip-install.sh: pip install . took $((SECONDS - start)) s" >&2

bin="$work/venv/bin/vramtrace"
[ -x "$bin" ] || fail "no $bin after pip install ."
for f in libvramtrace.so libfakecuda.so vramtrace-workload; do
    [ -x "$work/venv/lib/vramtrace/$f" ] || fail "$f is not in <env>/lib/vramtrace/"
done

# The demo from the environment, with a temporary folder of its own that must be empty afterwards.
mkdir "$work/tmp" "$work/cwd"
out="$(cd "$work/cwd" && TMPDIR="$work/tmp" LD_PRELOAD= VRAMTRACE_SHIM= "$bin" demo --simulated --steps 3 2>&1)" \
    || fail "vramtrace demo from the environment: $out"
left="$(ls -A "$work/tmp")"
[ -z "$left" ] || fail "the demo left $left in its temporary folder"
[ -z "$(ls -A "$work/cwd")" ] || fail "the demo left $(ls -A "$work/cwd") in its working folder"
for want in "driver: simulated" "GPU 0  peak " "CALL SITES AT EACH DEVICE'S PEAK" "vramtrace_workload::"; do
    grep -qF -- "$want" <<<"$out" || fail "the demo's output lacks \"$want\":
$out"
done
for unwanted in "workload: " "core::ops::function" "std::rt::"; do
    ! grep -qF -- "$unwanted" <<<"$out" || fail "the demo's output shows \"$unwanted\":
$out"
done
echo "test-pip-install.sh: ok: pip install . and vramtrace demo from the environment" >&2

#!/usr/bin/env bash
# Two shims side by side on the 1 MiB loop inside one process: inproc_overhead.sh on build A, then B, then A, ...
# (each call two rounds of its four configurations), so that the machine's drift between calls falls on both.
#   Usage: bash scripts/gpu/inproc_ab.sh DIR_A DIR_B [TURNS] [BLOCKS] [PAIRS]
#   (each DIR: vramtrace, libvramtrace.so; prints each call's lines prefixed with its build)
set -u
A=$1
B=$2
TURNS=${3:-2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for t in $(seq "$TURNS"); do
    for d in "$A" "$B"; do
        echo "=== turn $t: $d"
        bash "$HERE/inproc_overhead.sh" "$d" "${4:-20}" "${5:-1000}" 2>&1 | sed "s|^|$(basename "$d") |"
    done
done

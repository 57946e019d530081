#!/usr/bin/env bash
# Builds side by side on the 1 MiB loop inside one process (inproc_overhead.c), over many short processes.
# One process's figure moves by up to 0.4% from the next with the same build (where its pages and the ring land),
# more than a change to the shim weighs: so each arm runs ROUNDS processes, the arms interleaved and their order
# turned each round, and the summary gives each arm's mean with its standard error, and each build's difference
# from the first, paired by round.
#   Usage: ROUNDS=12 CONFIGS="defaults" bash scripts/gpu/inproc_many.sh DIR [DIR...]
#   DIR: libvramtrace.so (and vramtrace; else the first DIR's). CONFIGS: any of bare (once, not per build),
#   preload (the shim with no collector), defaults, none (--stacks none). BLOCKS x PAIRS pairs each way a process
#   (default 10 x 1000). Prints one line a process, then the summary.
set -u
ROUNDS=${ROUNDS:-12}
CONFIGS=${CONFIGS:-defaults}
BLOCKS=${BLOCKS:-10}
PAIRS=${PAIRS:-1000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d /tmp/vt-many.XXXX)
DIRS=()
for d in "$@"; do DIRS+=("$(cd "$d" && pwd)"); done
[ ${#DIRS[@]} -gt 0 ] || { echo "usage: inproc_many.sh DIR [DIR...]"; exit 2; }
VT0="${DIRS[0]}/vramtrace"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o "$W/inproc" "$HERE/inproc_overhead.c" -I"$CUDA_INC" -lcuda || { echo "inproc: build failed"; exit 1; }
export INPROC_QUICK=1
ARMS=()
for c in $CONFIGS; do
    if [ "$c" = bare ]; then ARMS+=("bare:-"); continue; fi
    for d in "${DIRS[@]}"; do ARMS+=("$c:$d"); done
done
want=$(((1000 + BLOCKS * PAIRS) * 2))
: >"$W/results.tsv"
one() { # config dir round
    local c=$1 d=$2 r=$3 vt="$2/vramtrace" line out
    [ -x "$vt" ] || vt=$VT0
    case $c in
    bare) out=$("$W/inproc" "$BLOCKS" "$PAIRS") ;;
    preload) out=$(LD_PRELOAD="$d/libvramtrace.so" "$W/inproc" "$BLOCKS" "$PAIRS") ;;
    defaults) out=$(VRAMTRACE_SHIM="$d/libvramtrace.so" "$vt" run -q --force -o "$W/t.vtrace" -- "$W/inproc" "$BLOCKS" "$PAIRS") ;;
    none) out=$(VRAMTRACE_SHIM="$d/libvramtrace.so" "$vt" run -q --force --stacks none -o "$W/t.vtrace" -- "$W/inproc" "$BLOCKS" "$PAIRS") ;;
    *) echo "unknown configuration $c"; exit 2 ;;
    esac
    line=$(echo "$out" | grep 'mean of the fastest 95%')
    # "... mean of the fastest 95% +0.510% (+448.7 ns)"
    local pct ns events=-
    pct=$(echo "$line" | sed -E 's/.*fastest 95% ([-+0-9.]+)% \(([-+0-9.]+) ns\).*/\1/')
    ns=$(echo "$line" | sed -E 's/.*fastest 95% ([-+0-9.]+)% \(([-+0-9.]+) ns\).*/\2/')
    if [ "$c" = defaults ] || [ "$c" = none ]; then
        events=$("$vt" report --json "$W/t.vtrace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["events"], d["dropped_events"])')
        rm -f "$W/t.vtrace"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$(basename "$d")" "$r" "$pct" "$ns" "$events" | tee -a "$W/results.tsv"
}
n=${#ARMS[@]}
for r in $(seq "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
        a=${ARMS[$(((i + r) % n))]}
        one "${a%%:*}" "${a#*:}" "$r"
    done
done
python3 - "$W/results.tsv" "$want" <<'EOF'
import math, sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
want = sys.argv[2]
arms = collections.OrderedDict()
bad = []
for c, d, r, pct, ns, ev in rows:
    try:
        arms.setdefault((c, d), {})[int(r)] = (float(pct), float(ns))
    except ValueError:
        bad.append((c, d, r, "no figure"))
    if ev != "-" and ev.split()[0] != want or (ev != "-" and ev.split()[1] != "0"):
        bad.append((c, d, r, f"events/dropped {ev}, want {want}/0"))
def stats(v):
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else float("nan")
    return m, sd, sd / math.sqrt(len(v))
print("summary: arm, processes, mean %, sd, se; mean ns a pair")
for (c, d), by in arms.items():
    p = [x[0] for x in by.values()]
    m, sd, se = stats(p)
    print(f"summary: {c:8} {d:12} n={len(p):3} mean {m:+.3f}% sd {sd:.3f} se {se:.3f}; {sum(x[1] for x in by.values()) / len(p):+.0f} ns")
# Each build against the first, per configuration, paired by round.
first = {}
for (c, d), by in arms.items():
    if c == "bare":
        continue
    if c not in first:
        first[c] = (d, by)
        continue
    d0, by0 = first[c]
    diffs = [by[r][0] - by0[r][0] for r in by if r in by0]
    if len(diffs) > 1:
        m, sd, se = stats(diffs)
        print(f"summary: {c:8} {d} - {d0}: {m:+.3f}% (se {se:.3f}, {len(diffs)} rounds)")
for b in bad:
    print("summary: BAD", *b)
EOF

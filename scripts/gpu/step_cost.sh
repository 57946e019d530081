#!/usr/bin/env bash
# Issue 27: what vramtrace costs a training step, told apart from the machine's own spread. GPT-2 small
# (scripts/gpu/step_case.py) in alternating runs under each configuration, the order rotated every round; each run
# times STEPS steps after WARM, so start-up (imports, cuBLAS, the shim's first call) is not in the figure. Two
# settings of PyTorch: its caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor a cudaMalloc and
# cudaFree, as people debug memory) and on (a GPU-bound step). Configurations split vramtrace by part:
#   bare | vt (defaults) | vt --stacks none | vt --python-agent off | vt --stacks none --python-agent off
# Prints per-run medians, then per configuration the median of its runs' medians and its paired difference to
# bare (each round's run against the same round's bare run), with the driver calls per step from the trace.
#   Usage: bash scripts/gpu/step_cost.sh DIR [ROUNDS] [STEPS] [WARM]    (env STEP_CONFIGS, STEP_SETTINGS: a subset)
set -u
DIR=$(cd "$1" && pwd)
ROUNDS=${2:-5}
STEPS=${3:-20}
WARM=${4:-5}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=${OUT:-/tmp/vramtrace-step-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-step.XXXX)
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
CONFIGS=("bare" "vt" "vt --stacks none" "vt --python-agent off" "vt --stacks none --python-agent off")
# STEP_CONFIGS="bare,vt": some of them only; STEP_SETTINGS="nocache": one setting only.
[ -n "${STEP_CONFIGS:-}" ] && IFS=, read -r -a CONFIGS <<<"$STEP_CONFIGS"
run() { # run SETTING CONFIG -> the run's median step ms; the trace in $W
    local setting=$1 cfg=$2 env=() out
    [ "$setting" = nocache ] && env=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    if [ "$cfg" = bare ]; then
        out=$(env "${env[@]}" python3 "$HERE/step_case.py" "$STEPS" "$WARM" 2>>"$W/err")
    else
        # shellcheck disable=SC2086
        out=$(env "${env[@]}" "$DIR/vramtrace" run -q --force -o "$W/$setting.vtrace" ${cfg#vt} -- \
            python3 "$HERE/step_case.py" "$STEPS" "$WARM" 2>>"$W/err")
    fi
    echo "$out" | python3 -c 'import json,sys,statistics; print(statistics.median(json.loads(sys.stdin.read().strip().splitlines()[-1])["step_ms"]))' 2>/dev/null || echo nan
}
for setting in ${STEP_SETTINGS:-nocache cache}; do
    : >"$W/$setting.tsv"
    for r in $(seq "$ROUNDS"); do
        n=${#CONFIGS[@]}
        for k in $(seq 0 $((n - 1))); do
            cfg=${CONFIGS[$(((k + r) % n))]}
            m=$(run "$setting" "$cfg")
            printf '%s\t%s\t%s\n' "$r" "$cfg" "$m" >>"$W/$setting.tsv"
            echo "$setting round $r: $cfg: $m ms"
        done
    done
    calls=$("$DIR/vramtrace" report --json "$W/$setting.vtrace" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['events'])" 2>/dev/null)
    python3 - "$W/$setting.tsv" "$setting" "$calls" "$STEPS" "$WARM" <<'PY' | tee -a "$OUT/step_cost.txt"
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
setting, calls, steps, warm = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
by = collections.defaultdict(dict)
for r, cfg, m in rows:
    by[cfg][r] = float(m)
bare = by["bare"]
print(f"\n## {setting}: median step ms over {len(bare)} rounds ({steps} timed steps a run after {warm}); "
      f"last traced run: {calls} driver calls for {steps + warm} steps and start-up")
print("| configuration | median of runs | runs | paired vs bare (median) |")
print("|---|---|---|---|")
for cfg, runs in by.items():
    ms = [runs[r] for r in sorted(runs)]
    d = [(runs[r] / bare[r] - 1) * 100 for r in sorted(runs) if r in bare]
    print(f"| {cfg} | {statistics.median(ms):.2f} | {' '.join(f'{x:.2f}' for x in ms)} | "
          f"{statistics.median(d):+.2f}% ({' '.join(f'{x:+.1f}' for x in d)}) |")
PY
done
tail -5 "$W/err" >"$OUT/step_err.txt"

#!/usr/bin/env bash
# Issue 24 on a real GPU: true verdicts (recovered refusals are not errors, growth is a cause, the bridge arms
# PyTorch's allocation history by itself). Each case of verdicts_case.py under `DIR/vramtrace run` with default
# settings unless said, then `oom --json`, `report --json` and the text forms; the cost figures bare against
# `vramtrace run`, interleaved. Prints a table LAST; traces, JSON and logs go to $OUT/verdicts.tgz, the log also to
# $OUT/verdicts-log.txt, case (a)'s trace and snapshot to $OUT/fixture/ when under 2 MiB together.
#   Usage: bash scripts/gpu/verdicts.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
#   ONLY="a b c d e" picks cases ("i": the cost inside one process, not in the default set); VT_PROBE=1 times
#   the bridge's out-of-memory observer in (b); PIN=CPUS, ROUNDS=N, COST_CASES="cpu gpu" for (e).
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-verdicts-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-verdicts.XXXX)
LOG=$OUT/verdicts-log.txt
: >"$LOG"
DEADLINE=${DEADLINE:-570}
HERE_DIR=$(pwd)/scripts/gpu
CASE=$HERE_DIR/verdicts_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
export PYTHONUNBUFFERED=1
ONLY=${ONLY:-a b c d e}
# shellcheck source=lib.sh
source "$HERE_DIR/lib.sh"
cd "$W" || exit 0
want() { [[ " $ONLY " == *" $1 "* ]]; }

analyse() { # NAME
    local name=$1
    "$VT" oom --json "$name.vtrace" >"$name.oom.json" 2>>"$LOG"
    "$VT" oom "$name.vtrace" >"$name.oom.txt" 2>>"$LOG"
    "$VT" report --json "$name.vtrace" >"$name.report.json" 2>>"$LOG"
    "$VT" report "$name.vtrace" >"$name.report.txt" 2>>"$LOG"
    { echo "--- $name: oom"; cat "$name.oom.txt"; echo "--- $name: report (growth lines)"; grep -i -A3 "growth" "$name.report.txt"; } >>"$LOG" 2>&1
    ls -la "$name".vtrace* >>"$LOG" 2>&1
}

run_case() { # NAME SCRIPT TIMEOUT VT_ARGS... (the case name is the script's argument)
    local name=$1 script=$2 t=$3; shift 3
    if (($(left) < 20)); then say "skip $name: deadline"; return; fi
    say "=== $name: vramtrace run $* -- python3 $(basename "$script") $name"
    timeout "$(tmo "$t")" "$VT" run -o "$name.vtrace" --force "$@" -- python3 "$script" "$name" >"$name.out" 2>&1
    echo "rc=$?" >>"$name.out"
    tail -40 "$name.out" >>"$LOG"
    analyse "$name"
}

say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader); $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1); $("$VT" --version 2>&1)"

want a && run_case grow_cap "$CASE" 120 --cap 4GiB
want b && run_case grow_free "$CASE" 150
want c && run_case serve "$CASE" 150 --cap 6GiB
want d && run_case frag "$HERE_DIR/bridge_case.py" 120
want d && run_case pressure "$CASE" 60 --cap 2GiB

# (a)'s trace and snapshot, for collector/tests/fixtures/gpu/ when small.
if [ -f grow_cap.vtrace ]; then
    sz=$(du -cb grow_cap.vtrace grow_cap.vtrace.torch-*.pickle 2>/dev/null | tail -1 | cut -f1)
    say "grow_cap trace + pickle: $sz bytes"
    if [ "${sz:-0}" -lt $((2 << 20)) ]; then
        mkdir -p "$OUT/fixture" && cp grow_cap.vtrace grow_cap.vtrace.torch-*.pickle "$OUT/fixture/" 2>/dev/null
    fi
fi

# (e) the cost, interleaved: bare, under vramtrace run (defaults), and with the history on from the start.
# PIN=4,5: the Python process on those CPUs in every mode (taskset), to narrow run-to-run noise.
PY=(python3)
[ -n "${PIN:-}" ] && PY=(taskset -c "$PIN" python3)
if want e; then
    for i in $(seq 1 "${ROUNDS:-5}"); do
        for mode in bare auto hist; do
            for c in ${COST_CASES:-cpu gpu}; do
                [ "$c" = gpu ] && [ "$mode" = hist ] && continue
                if (($(left) < 15)); then continue; fi
                case $mode in
                    bare) timeout 60 "${PY[@]}" "$CASE" "$c" >"$c-$mode-$i.out" 2>&1 ;;
                    auto) timeout 60 "$VT" run -q -o "$c-$mode.vtrace" --force -- "${PY[@]}" "$CASE" "$c" >"$c-$mode-$i.out" 2>&1 ;;
                    hist) VRAMTRACE_TORCH_HISTORY=20000 timeout 60 "$VT" run -q -o "$c-$mode.vtrace" --force -- "${PY[@]}" "$CASE" "$c" >"$c-$mode-$i.out" 2>&1 ;;
                esac
                echo "$c $mode $i: $(grep '^RESULT' "$c-$mode-$i.out" | tail -1)" >>"$LOG"
            done
        done
        say "cost round $i done"
    done
fi

if want i; then  # (e) in one process: sampler on vs paused, history armed by hand (BLOCKS, BLOCK_STEPS)
    for r in $(seq 1 "${INPROC_ROUNDS:-1}"); do
        sfx=""; [ "$r" -gt 1 ] && sfx="_$r"
        say "=== cpu_inproc$sfx"
        timeout 120 "$VT" run -q -o cpu_inproc.vtrace --force -- python3 "$CASE" cpu_inproc >"cpu_inproc$sfx.out" 2>&1
        tail -5 "cpu_inproc$sfx.out" >>"$LOG"
        say "=== cpu_inproc_off$sfx, VRAMTRACE_TORCH_HISTORY=off (the sampler without the arming rule)"
        VRAMTRACE_TORCH_HISTORY=off timeout 120 "$VT" run -q -o cpu_inproc_off.vtrace --force -- python3 "$CASE" cpu_inproc >"cpu_inproc_off$sfx.out" 2>&1
        tail -5 "cpu_inproc_off$sfx.out" >>"$LOG"
    done
fi

python3 "$CASE" judge . >judge.txt 2>&1
[ -n "${PIN:-}" ] && echo "(e) pinned: taskset -c $PIN in every mode; $(nproc) CPUs" >>judge.txt
cat judge.txt >>"$LOG"
tar czf "$OUT/verdicts.tgz" ./*.vtrace ./*.pickle ./*.json ./*.txt ./*.out 2>/dev/null
ls -la >>"$LOG"
say "done"
cat judge.txt

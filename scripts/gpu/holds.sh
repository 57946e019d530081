#!/usr/bin/env bash
# Issue 35 on a real GPU: verdicts in the program's own terms. Growth counted in the program's steps (optimizer
# steps, else DataLoader batches) and told as "kept X per step over N steps"; at an out-of-memory error, what
# holds the CUDA tensors named (the bridge's walk of the Python heap). Each case of holds_case.py under
# `DIR/vramtrace run`, then `oom --json`, `oom`, `report --json`, `report`; the bridge's cost bare against
# `vramtrace run`, interleaved. Prints a table LAST (also $OUT/holds-table.md); the log is $OUT/holds-log.txt,
# outputs, JSON, texts and the traces under 4 MiB go to $OUT/holds.tgz (under 16 MiB).
#   Usage: bash scripts/gpu/holds.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
#   ONLY="keep_cap cycle ..." picks cases (default: all, below); DEADLINE (seconds, default 560) after which
#   nothing new starts; COST_ROUNDS (5) and GPU_ROUNDS (3) for the cost; VT_COMPILE=0 keeps warmup_steady eager.
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-holds-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-holds.XXXX)
LOG=$OUT/holds-log.txt
: >"$LOG"
DEADLINE=${DEADLINE:-560}
HERE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE_DIR/holds_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
export PYTHONUNBUFFERED=1
ALL="keep_cap keep_free eval_graph losses_list losses_then_big ddp_keep serve_double warmup_steady steady_cap
     batch_too_large cycle frag walk_cost cost_inproc cost"
ONLY=$(echo ${ONLY:-$ALL})
# shellcheck source=lib.sh
source "$HERE_DIR/lib.sh"
cd "$W" || exit 0
want() { [[ " $ONLY " == *" $1 "* ]]; }

analyse() { # NAME: the four analyses of NAME.vtrace, each bounded
    local name=$1
    [ -f "$name.vtrace" ] || { log "--- $name: no trace"; return; }
    timeout -k 5 "$(tmo 60)" "$VT" oom --json "$name.vtrace" >"$name.oom.json" 2>>"$LOG"
    timeout -k 5 "$(tmo 60)" "$VT" oom "$name.vtrace" >"$name.oom.txt" 2>>"$LOG"
    timeout -k 5 "$(tmo 60)" "$VT" report --json "$name.vtrace" >"$name.report.json" 2>>"$LOG"
    timeout -k 5 "$(tmo 60)" "$VT" report "$name.vtrace" >"$name.report.txt" 2>>"$LOG"
    {
        echo "--- $name: oom"
        head -80 "$name.oom.txt"
        echo "--- $name: report (growth and holders lines)"
        grep -i -E -A3 "growth|kept|held by|rank" "$name.report.txt" | head -40
    } >>"$LOG" 2>&1
    ls -la "$name".vtrace* >>"$LOG" 2>&1
}

run_cmd() { # NAME TIMEOUT VT_ARGS... -- CMD ARGS...: CMD under vramtrace run, then the analyses
    local name=$1 t=$2 vtargs=() t0 rc
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        vtargs+=("$1")
        shift
    done
    shift
    if (($(left) < 25)); then
        say "skip $name: deadline"
        echo "deadline: $(left) s left" >"$name.skipped"
        return
    fi
    say "=== $name: vramtrace run ${vtargs[*]} -- $*"
    t0=$SECONDS
    VT_CHECK_TAG="holds-$name" timeout -k 10 "$(tmo "$t")" "$VT" run -o "$name.vtrace" --force \
        ${vtargs[@]+"${vtargs[@]}"} -- "$@" >"$name.out" 2>&1
    rc=$?
    echo "rc=$rc wall=$((SECONDS - t0))" >>"$name.out"
    reap "holds-$name"
    tail -40 "$name.out" >>"$LOG"
    analyse "$name"
}

run_case() { # NAME TIMEOUT VT_ARGS...: holds_case.py NAME under vramtrace run
    local name=$1 t=$2
    shift 2
    run_cmd "$name" "$t" "$@" -- python3 "$CASE" "$name"
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >gpu.txt 2>/dev/null || echo "?" >gpu.txt
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
VERS=$(python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)' 2>&1 | tail -1)
say "$(head -1 gpu.txt) x${NGPU}; $VERS; $("$VT" --version 2>&1); $(python3 -V 2>&1)"
say "cases: $ONLY"

want keep_cap && run_case keep_cap 60 --cap 6GiB
want keep_free && run_case keep_free 60
want eval_graph && run_case eval_graph 60 --cap 6GiB
want losses_list && run_case losses_list 60
want losses_then_big && run_case losses_then_big 60 --cap 4GiB
if want ddp_keep; then
    if [ "${NGPU:-0}" -ge 2 ]; then
        TR=(torchrun)
        command -v torchrun >/dev/null 2>&1 || TR=(python3 -m torch.distributed.run)
        run_cmd ddp_keep 120 --cap 6GiB -- "${TR[@]}" --standalone --nproc-per-node "$NGPU" "$CASE" ddp_keep
    else
        say "ddp_keep: ${NGPU:-0} GPU(s): skipped"
        echo "RESULT case=ddp_keep skipped=1 gpus=${NGPU:-0}" >ddp_keep.out
    fi
fi
want serve_double && run_case serve_double 90 --cap 6GiB
want warmup_steady && run_case warmup_steady 150
want steady_cap && run_case steady_cap 60 --cap 3GiB
want batch_too_large && run_case batch_too_large 90 --cap 10GiB
want cycle && run_case cycle 60 --cap 4GiB
want frag && run_cmd frag 90 -- python3 "$HERE_DIR/bridge_case.py" frag
want walk_cost && run_case walk_cost 90
want cost_inproc && run_case cost_inproc 150

# The bridge's cost: bare and under vramtrace run (defaults), alternating, one process each run.
if want cost; then
    for i in $(seq 1 "${COST_ROUNDS:-5}"); do
        for c in cost_cpu cost_gpu; do
            [ "$c" = cost_gpu ] && [ "$i" -gt "${GPU_ROUNDS:-3}" ] && continue
            modes="bare traced"
            [ "$c" = cost_cpu ] && modes="bare traced noagent"
            for mode in $modes; do
                if (($(left) < 25)); then continue; fi
                case $mode in
                    bare) VT_CHECK_TAG=holds-cost timeout -k 5 "$(tmo 60)" python3 "$CASE" "$c" \
                        >"$c-$mode-$i.out" 2>&1 ;;
                    traced) VT_CHECK_TAG=holds-cost timeout -k 5 "$(tmo 60)" "$VT" run -q -o "$c-traced.vtrace" \
                        --force -- python3 "$CASE" "$c" >"$c-$mode-$i.out" 2>&1 ;;
                    # The shim and the collector without the bridge: what of a traced process's cost is not the
                    # bridge's (cost_inproc measures the bridge alone).
                    noagent) VT_CHECK_TAG=holds-cost timeout -k 5 "$(tmo 60)" "$VT" run -q --python-agent off \
                        -o "$c-noagent.vtrace" --force -- python3 "$CASE" "$c" >"$c-$mode-$i.out" 2>&1 ;;
                esac
                reap holds-cost
                log "$c $mode $i: $(grep '^RESULT' "$c-$mode-$i.out" | tail -1)"
            done
        done
        say "cost round $i done"
    done
fi

python3 "$CASE" judge . "$OUT/holds-table.md" >judge.txt 2>&1
{
    echo "--- judge notes"
    cat judge-notes.txt 2>/dev/null
    echo "--- judge"
    cat judge.txt
} >>"$LOG"

# Everything small, and the traces and snapshots up to 4 MiB each (12 MiB in all): under 16 MiB packed.
pack=()
for f in ./*.out ./*.json ./*.txt ./*.skipped; do
    [ -f "$f" ] && pack+=("$f")
done
room=$((12 << 20))
for f in ./*.vtrace ./*.pickle; do
    [ -f "$f" ] || continue
    sz=$(stat -c %s "$f")
    if [ "$sz" -le $((4 << 20)) ] && [ "$sz" -le "$room" ]; then
        pack+=("$f")
        room=$((room - sz))
    else
        log "not packed: $f ($sz bytes)"
    fi
done
tar czf "$OUT/holds.tgz" "${pack[@]}" 2>>"$LOG"
if [ "$(stat -c %s "$OUT/holds.tgz" 2>/dev/null || echo 0)" -gt $((16 << 20)) ]; then
    log "holds.tgz over 16 MiB: packed again without traces"
    tar czf "$OUT/holds.tgz" ./*.out ./*.json ./*.txt 2>>"$LOG"
fi
ls -la >>"$LOG"
say "done"
echo "--- judge notes (the last 1,500 characters; all of them in holds-log.txt)"
tail -c 1500 judge-notes.txt 2>/dev/null
echo
cat judge.txt

#!/usr/bin/env bash
# One device call's worth of the 2026-11-29 proofs (issues 48, 49, 50), run side by side where they do not need the
# GPU alone (every fit runs under its own cap, far below the GPU's memory; wall times are then under that load).
#   bash scripts/gpu/proofs.sh DIR fits     fit --verify on conv:6GiB convamp:4GiB lstm:4GiB (lane A) and
#                                           padded:40GiB, lstm:4GiB from 128,256 (lane B), side by side, with
#                                           scripts/gpu/dlmopen.sh in front; about 500 s
#   bash scripts/gpu/proofs.sh DIR loops    scripts/gpu/loops.sh on the new cases (LOOPS overrides the list)
#   bash scripts/gpu/proofs.sh DIR capfit   issue 50 item 4 and issue 48 (the later 2026-11-29 proofs): fit --verify
#                                           on conv:6GiB then convamp:4GiB (FITS overrides) in the background, and in
#                                           front scripts/gpu/cap_pulses.sh, then scripts/gpu/cap_escape.sh when
#                                           CAPESC_BY (default 230) seconds have not passed; about 250 s
# $OUT gets the tarballs of each part and summary.txt (every table, each lane's log); at most 8 files.
set -u
DIR=$(cd "$1" && pwd)
PART=${2:-fits}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-proofs-out}
export OUT
mkdir -p "$OUT"
L=$(mktemp -d /tmp/vt-proofs.XXXX)
S=$OUT/summary.txt
: >"$S"
STOP=${STOP:-470}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
    "$DIR/vramtrace" --version
} 2>&1 | tee -a "$S"
# fitlane NAME SPEC...: fit.sh once per SPEC (TAG:CASE:LIMIT[:FROM]) in turn, each given what is left of STOP.
fitlane() {
    local name=$1 spec tag c limit from left
    shift
    for spec in "$@"; do
        IFS=: read -r tag c limit from <<<"$spec"
        left=$((STOP - SECONDS))
        if ((left < 60)); then
            echo "[$SECONDS s] $name: $tag skipped, $left s left" >>"$L/$name.log"
            continue
        fi
        echo "[$SECONDS s] $name: $tag ($c:$limit${from:+ from $from}), budget $left s" >>"$L/$name.log"
        TAG=$tag YARD=0 KEEP=" " BUDGET=$left CASES="$c:$limit" FROM="$from" \
            bash "$HERE/fit.sh" "$DIR" >>"$L/$name.log" 2>&1
        echo "[$SECONDS s] $name: $tag done" >>"$L/$name.log"
    done
}
case $PART in
fits)
    fitlane A fitconv:conv:6GiB fitconvamp:convamp:4GiB fitlstm:lstm:4GiB &
    a=$!
    fitlane B fitpadded:padded:40GiB fitlstm2:lstm:4GiB:128,256 &
    b=$!
    bash "$HERE/dlmopen.sh" "$DIR" >"$L/dlmopen.log" 2>&1
    wait $a $b
    for n in dlmopen A B; do
        echo "=== $n" >>"$S"
        cat "$L/$n.log" >>"$S"
    done
    # The tarballs hold every fit's files; the tables last, where the reply's tail shows them.
    for n in A B; do grep -E '^\| |^\[|answer|ERROR' "$L/$n.log"; done
    cat "$OUT/dlmopen/table.md"
    ;;
loops)
    DEADLINE=${DEADLINE:-480} ONLY=${LOOPS:-"gen:none gen_long:2GiB gen_step:none gen_step_long:2GiB eval_cpu:none eval_gpu:4GiB eval_gpu_exit:none steady:none steady_lru:none serve:4GiB"} \
        bash "$HERE/loops.sh" "$DIR" >"$L/loops.log" 2>&1
    cat "$L/loops.log" >>"$S"
    grep -E '^\[|^\|' "$L/loops.log"
    ;;
capfit)
    TAG=fitconv YARD=0 KEEP="table.md log.txt" BUDGET=${FIT_BUDGET:-300} CASES=${FITS:-"conv:6GiB convamp:4GiB"} \
        bash "$HERE/fit.sh" "$DIR" >"$L/fit.log" 2>&1 &
    f=$!
    bash "$HERE/cap_pulses.sh" "$DIR" >"$L/cap_pulses.log" 2>&1
    if ((SECONDS < ${CAPESC_BY:-230})); then
        bash "$HERE/cap_escape.sh" "$DIR" >"$L/cap_escape.log" 2>&1
    else
        echo "cap_escape.sh skipped at $SECONDS s" >"$L/cap_escape.log"
    fi
    wait $f
    for n in cap_pulses cap_escape fit; do
        echo "=== $n" >>"$S"
        cat "$L/$n.log" >>"$S"
    done
    rm -f "$OUT/cap_escape.txt"
    grep -E '^\| |^\[|answer|ERROR' "$L/fit.log"
    grep -E '^\||cap_escape' "$L/cap_escape.log"
    sed -n '/^| case | ok/,$p' "$L/cap_pulses.log"
    ;;
esac
rm -rf "$L"
ls -la "$OUT"

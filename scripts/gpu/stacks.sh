#!/usr/bin/env bash
# vramtrace's call sites on a real GPU: each case runs under `DIR/vramtrace run`, then `vramtrace report` and
# `vramtrace oom` (text and --json) are judged by scripts/gpu/stacks_case.py against the program's own marked lines.
#
# Usage (on the GPU machine, from the repository root):  bash scripts/gpu/stacks.sh DIR
#   DIR holds the carried build: vramtrace, libvramtrace.so (scripts/gpu/prepare.sh makes .gpu).
#
# Cases:
#   sites-oom-nocache  PYTORCH_NO_CUDA_MEMORY_CACHING=1: 6 GiB weights (SITE-WEIGHTS), a small MLP, 5 GiB made in
#                      make_activations() (SITE-ACT), 4 GiB tensors (SITE-GROW) until the GPU runs out; the OOM's
#                      requesting site, top_live[] sites, live_by_call_site, the report's call_sites_at_peak, and
#                      the text outputs must name those lines of stacks_case.py
#   sites-oom-cache    the same with PyTorch's caching allocator (a segment's site: the line whose tensor grew it)
#   sites-thread       256 MiB from a threading.Thread target (SITE-THREAD): the site is that line, in `worker`
#   sites-overhead     MLP 8 x 4096^2, batch 256, fp32, AdamW, 200 timed steps: `--stacks none` vs the default,
#                      alternating 3 times each; median step time within 1%; driver allocations per run
#   sites-native       scripts/gpu/allocs.cu built with nvcc -g -lineinfo (shared cudart; static cudart as a
#                      second look): the sites are `main at allocs.cu:<line of each cudaMalloc/cudaMallocAsync>`
#
# Prints a table LAST (case | checked | expected | got | pass | note); the full log is $OUT/stacks-log.txt, the table
# $OUT/stacks-table.md, program outputs, JSON answers and text reports $OUT/stacks-details.tgz, the traces of the
# OOM and thread cases $OUT/stacks-traces.tgz. Each case is bounded by `timeout`; no case starts after
# STACKS_DEADLINE_S (default 400) seconds; the script always exits 0.
# VT_STACKS_FAKE=1 (with the simulated driver's libcuda.so.1 on LD_LIBRARY_PATH) runs the flow without torch.

set -u
set -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vramtrace-gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/stacks-log.txt"
TABLE="$OUT/stacks-table.md"
WORK="$(mktemp -d /tmp/vramtrace-stacks.XXXXXX)"
ROWS="$WORK/rows.tsv"
PY="${PYTHON:-python3}"
CASE_PY="$HERE/stacks_case.py"
DEADLINE="${STACKS_DEADLINE_S:-400}"
TAG="vtstacks-$$"
# log, say, left, tmo, reap: shared with the other GPU scripts.
TMO_MIN=5
. "$HERE/lib.sh"
: >"$LOG"
: >"$ROWS"

unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING VRAMTRACE_CAP VRAMTRACE_CAP_MODE VRAMTRACE_LEDGER \
    VRAMTRACE_STACKS VRAMTRACE_STACK_MIN_BYTES CUDA_LAUNCH_BLOCKING LD_PRELOAD

# ---------------------------------------------------------------------------------------------------------------
# Helpers

# row CASE CHECKED EXPECTED GOT PASS NOTE
row() {
    local a=("$@") i
    for i in 0 1 2 3 4 5; do a[i]=${a[i]:-}; a[i]=${a[i]//$'\t'/ }; a[i]=${a[i]//$'\n'/ }; a[i]=${a[i]//|//}; done
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${a[@]:0:6}" >>"$ROWS"
    say "$1: $2: ${a[4]} (got ${a[3]})"
}
time_for() {
    if (($(left) < $1)); then
        row "$2" "-" "-" "-" "SKIP" "time budget (${DEADLINE}s) spent"
        return 1
    fi
}
last_error() { grep -v -e '^\s*$' -e '^vramtrace: ' -e '^    ' "$1" 2>/dev/null | tail -n1 | cut -c1-110; }


CASE_ENV=()
FULL=1
TEXT=1
# The timeout of one `vramtrace report`/`oom`: 90 s, less past the deadline (20 s at least).
rtmo() {
    local l
    l=$(($(left) + 60))
    ((l > 90)) && l=90
    ((l < 20)) && l=20
    echo "$l"
}

# vrun NAME LIMIT [vramtrace run options...] -- CMD...: CMD under `vramtrace run --out TRACE OPTIONS --`, then
# NAME.report.json, NAME.report.txt (unless TEXT=0), and (FULL=1) NAME.oom.json and NAME.oom.txt, in WORK.
# Sets C_RC, C_OUT, C_TRACE, C_SECS, C_TIMEDOUT, C_NOTE.
vrun() {
    local name=$1 limit=$2 t t0 opts=() rc
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        opts+=("$1")
        shift
    done
    shift # --
    t=$(tmo "$limit")
    C_OUT="$WORK/$name.out"
    C_TRACE="$WORK/$name.vtrace"
    C_NOTE=""
    rm -f "$C_TRACE"
    log ""
    log "=== $name: env ${CASE_ENV[*]+${CASE_ENV[*]}} vramtrace run --out $C_TRACE ${opts[*]+${opts[*]}} -- $* (timeout ${t}s)"
    t0=$SECONDS
    env ${CASE_ENV[@]+"${CASE_ENV[@]}"} VT_CHECK_TAG="$TAG-$name" \
        timeout -k 10 "$t" "$VT" run --out "$C_TRACE" ${opts[@]+"${opts[@]}"} -- "$@" >"$C_OUT" 2>&1 </dev/null
    C_RC=$?
    C_SECS=$((SECONDS - t0))
    C_TIMEDOUT=0
    ((C_SECS >= t)) && C_TIMEDOUT=1
    reap "$TAG-$name"
    tail -n 60 "$C_OUT" >>"$LOG"
    log "--- $name: vramtrace run exit $C_RC after ${C_SECS}s (timed out: $C_TIMEDOUT); trace $(stat -c %s "$C_TRACE" 2>/dev/null || echo none) bytes"
    if [ ! -s "$C_TRACE" ]; then
        C_NOTE="no trace written"
        return
    fi
    timeout "$(rtmo)" "$VT" report --json "$C_TRACE" >"$WORK/$name.report.json" 2>"$WORK/$name.report.err"
    rc=$?
    ((rc != 0)) && C_NOTE="report --json exit $rc: $(head -n1 "$WORK/$name.report.err" | cut -c1-100)"
    cat "$WORK/$name.report.err" >>"$LOG"
    ((TEXT)) || return 0
    timeout "$(rtmo)" "$VT" report "$C_TRACE" >"$WORK/$name.report.txt" 2>&1
    log "--- $name: vramtrace report (first 60 lines):"
    head -n 60 "$WORK/$name.report.txt" >>"$LOG"
    ((FULL)) || return 0
    timeout "$(rtmo)" "$VT" oom --json "$C_TRACE" >"$WORK/$name.oom.json" 2>"$WORK/$name.oom.err"
    rc=$?
    ((rc != 0)) && C_NOTE="${C_NOTE:+$C_NOTE; }oom --json exit $rc: $(head -n1 "$WORK/$name.oom.err" | cut -c1-100)"
    cat "$WORK/$name.oom.err" >>"$LOG"
    timeout "$(rtmo)" "$VT" oom "$C_TRACE" >"$WORK/$name.oom.txt" 2>&1
    log "--- $name: vramtrace oom (first 80 lines):"
    head -n 80 "$WORK/$name.oom.txt" >>"$LOG"
}

# judge CASE ARGS...: stacks_case.py judge-... ARGS; its ROW lines become rows (one NO row if it gave none).
judge() {
    local case=$1 n=0 line
    shift
    log "--- judge: $PY $CASE_PY $*"
    while IFS= read -r line; do
        if [[ "$line" == ROW$'\t'* ]]; then
            line=${line#ROW$'\t'}
            line=${line//$'\t'/$'\x1f'} # not whitespace: empty fields stay fields
            IFS=$'\x1f' read -r c w e g p note <<<"$line"
            row "$c" "$w" "$e" "$g" "$p" "$note"
            n=$((n + 1))
        else
            log "judge: $line"
        fi
    done < <(timeout 120 "$PY" "$CASE_PY" "$@" 2>&1)
    ((n > 0)) || row "$case" "judge" "rows" "none" "NO" "stacks_case.py $1 printed no row (see the log)"
}

# ran CASE: a row when the program gave no RESULT line (returns 1 then).
ran() {
    if grep -q '^SKIP' "$C_OUT" 2>/dev/null; then
        row "$1" "program" "-" "-" "SKIP" "$(grep -m1 '^SKIP' "$C_OUT" | cut -c6-)"
        return 1
    fi
    if ! grep -q '^RESULT ' "$C_OUT" 2>/dev/null; then
        local why="exit $C_RC"
        ((C_TIMEDOUT)) && why="timed out after ${C_SECS}s"
        row "$1" "program ran" "a RESULT line" "none" "NO" "$why; ${C_NOTE:+$C_NOTE; }last line: $(last_error "$C_OUT")"
        return 1
    fi
    return 0
}

# The table, last thing printed; also on SIGTERM/SIGINT.
FINISHED=0
NVCC_PID=""
finish() {
    ((FINISHED)) && return
    FINISHED=1
    if [ -n "$NVCC_PID" ]; then
        reap "$TAG-nvcc"
        kill "$NVCC_PID" 2>/dev/null
        wait "$NVCC_PID" 2>/dev/null
    fi
    {
        echo "| case | checked | expected | got | pass | note |"
        echo "|---|---|---|---|---|---|"
        tr '\t' '\037' <"$ROWS" | while IFS=$'\x1f' read -r c w e g p n; do
            echo "| $c | $w | $e | $g | $p | $n |"
        done
        echo
        echo "yes: $(cut -f5 "$ROWS" | grep -cx yes), NO: $(cut -f5 "$ROWS" | grep -cx NO)," \
            "SKIP: $(cut -f5 "$ROWS" | grep -cx SKIP); ${SECONDS}s; log $LOG; work $WORK"
        echo "on: ${ENVLINE:-?}"
    } >"$TABLE"
    (cd "$WORK" && tar -czf "$OUT/stacks-details.tgz" -- *.out *.json *.txt *.err *.log rows.tsv 2>/dev/null)
    # The traces of the OOM and thread cases, when small enough to bring back.
    local tr=()
    for f in "$WORK"/sites-oom-*.vtrace "$WORK"/sites-thread.vtrace; do
        [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 20000000 ] && tr+=("$(basename "$f")")
    done
    ((${#tr[@]})) && (cd "$WORK" && tar -czf "$OUT/stacks-traces.tgz" -- "${tr[@]}" 2>/dev/null)
    cat "$TABLE" >>"$LOG"
    echo
    echo "=================== vramtrace call sites check: results ($TABLE) ==================="
    cat "$TABLE"
}
trap 'exit 0' TERM INT # the EXIT trap prints the table
trap 'finish; exit 0' EXIT

# ---------------------------------------------------------------------------------------------------------------
# Header

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    say "usage: bash scripts/gpu/stacks.sh DIR (DIR: the carried build with vramtrace, libvramtrace.so)"
    row "setup" "DIR" "a folder" "'${1:-}'" "NO" "DIR missing"
    exit 0
fi
DIR="$(cd "$1" && pwd)"
VT="$DIR/vramtrace"

{
    echo "# vramtrace call sites check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    echo "kernel $(uname -r); $(ldd --version 2>&1 | head -n1)"
    ls -l "$DIR"
    timeout 10 "$VT" --version
} 2>&1 | tee -a "$LOG"
VERSIONS=$(
    timeout 90 "$PY" - <<'EOF' 2>&1
import importlib
import sys
print("python", sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception as e:  # noqa: BLE001
    print("torch MISSING", type(e).__name__, str(e)[:80])
EOF
)
echo "$VERSIONS" | tee -a "$LOG"
ENVLINE="$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -n1); $(echo "$VERSIONS" | tr '\n' ' '| cut -c1-120); $("$VT" --version 2>/dev/null)"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n1)
echo "nvcc: ${NVCC:-MISSING} $([ -n "$NVCC" ] && timeout 30 "$NVCC" --version | tail -n1)" | tee -a "$LOG"
echo "marks: $("$PY" "$CASE_PY" marks 2>&1 | tr '\n' ' ')" | tee -a "$LOG"

if [ ! -x "$VT" ]; then
    row "setup" "vramtrace" "executable" "missing" "NO" "$VT missing or not executable"
    exit 0
fi
if ! "$VT" run --help 2>&1 | grep -q -- '--stacks'; then
    say "warning: 'vramtrace run --help' does not mention --stacks: an older build?"
fi
HAVE_TORCH=0
echo "$VERSIONS" | grep -q '^torch [0-9]' && HAVE_TORCH=1
[ "${VT_STACKS_FAKE:-}" = 1 ] && HAVE_TORCH=1

# The nvcc builds start now, in the background, so that they are ready when sites-native runs (host code only:
# the GPU is not used while compiling).
SRC="$HERE/allocs.cu"
if [ -n "$NVCC" ] && [ -f "$SRC" ]; then
    (
        export VT_CHECK_TAG="$TAG-nvcc"
        timeout 240 "$NVCC" -O2 -g -lineinfo -cudart shared -o "$WORK/allocs-shared" "$SRC" >"$WORK/nvcc-shared.log" 2>&1
        echo "exit $?" >>"$WORK/nvcc-shared.log"
        timeout 240 "$NVCC" -O2 -g -lineinfo -o "$WORK/allocs-static" "$SRC" >"$WORK/nvcc-static.log" 2>&1
        echo "exit $?" >>"$WORK/nvcc-static.log"
    ) &
    NVCC_PID=$!
fi

# ---------------------------------------------------------------------------------------------------------------
# 1. sites-oom: known lines, until the GPU runs out; without and with PyTorch's caching allocator.

case_oom() {
    local n=$1
    shift
    time_for 60 "$n" || return 0
    FULL=1
    CASE_ENV=("$@")
    vrun "$n" 150 -- "$PY" -u "$CASE_PY" oom
    CASE_ENV=()
    ran "$n" || return 0
    judge "$n" judge-oom "$n" "$WORK"
}

# ---------------------------------------------------------------------------------------------------------------
# 2. sites-thread: an allocation made by a threading.Thread's target.

case_thread() {
    local n=sites-thread
    time_for 40 $n || return 0
    FULL=0
    CASE_ENV=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    vrun $n 90 -- "$PY" -u "$CASE_PY" thread
    CASE_ENV=()
    ran $n || return 0
    judge $n judge-thread $n "$WORK"
}

# ---------------------------------------------------------------------------------------------------------------
# 3. sites-overhead: a training step with the default settings vs --stacks none, alternating.

case_overhead() {
    local n=sites-overhead i none="" all="" a
    time_for 90 $n || return 0
    # The nvcc builds (background, CPU only) must not run beside the timed steps.
    if [ -n "$NVCC_PID" ] && kill -0 "$NVCC_PID" 2>/dev/null; then
        say "$n: waiting for the nvcc builds (at most 90 s)"
        local w=0
        while kill -0 "$NVCC_PID" 2>/dev/null && ((w < 90)); do
            sleep 1
            w=$((w + 1))
        done
    fi
    FULL=0
    TEXT=0
    CASE_ENV=()
    for i in 1 2 3; do
        if (($(left) < 50)); then
            say "$n: time budget: stopped after $((i - 1)) pairs"
            break
        fi
        vrun "ovh-none-$i" 120 --stacks none -- "$PY" -u "$CASE_PY" train
        grep -q '^RESULT ' "$C_OUT" && none="$none${none:+,}ovh-none-$i"
        say "$n: none run $i: $(grep '^RESULT ' "$C_OUT" | tr ' ' '\n' | grep -E '^(median_ms|mean_ms|segments_timed)=' | tr '\n' ' ')(exit $C_RC)"
        vrun "ovh-all-$i" 120 -- "$PY" -u "$CASE_PY" train
        grep -q '^RESULT ' "$C_OUT" && all="$all${all:+,}ovh-all-$i"
        say "$n: default run $i: $(grep '^RESULT ' "$C_OUT" | tr ' ' '\n' | grep -E '^(median_ms|mean_ms|segments_timed)=' | tr '\n' ' ')(exit $C_RC)"
    done
    if [ -z "$none" ] || [ -z "$all" ]; then
        a="$WORK/ovh-all-1.out"
        [ -f "$a" ] || a="$WORK/ovh-none-1.out"
        TEXT=1
        row $n "training runs" "RESULT lines" "none: '$none', default: '$all'" "NO" "last line: $(last_error "$a")"
        return 0
    fi
    TEXT=1
    judge $n judge-overhead "$WORK" "$none" "$all"
}

# ---------------------------------------------------------------------------------------------------------------
# 4. sites-native: allocs.cu built with -g -lineinfo.

case_native() {
    local n=sites-native v
    if [ -z "$NVCC" ]; then
        row $n "nvcc" "found" "not found" "SKIP" "no nvcc on PATH or in /usr/local/cuda/bin"
        return 0
    fi
    time_for 30 $n || return 0
    if [ -n "$NVCC_PID" ]; then
        local waited=0
        while kill -0 "$NVCC_PID" 2>/dev/null && ((waited < $(left) - 20)); do
            sleep 1
            waited=$((waited + 1))
        done
        if kill -0 "$NVCC_PID" 2>/dev/null; then
            row $n "nvcc builds" "done" "still running" "SKIP" "time budget"
            return 0
        fi
        wait "$NVCC_PID" 2>/dev/null
        NVCC_PID=""
    fi
    for v in shared static; do
        cat "$WORK/nvcc-$v.log" >>"$LOG" 2>/dev/null
        if [ ! -x "$WORK/allocs-$v" ]; then
            row "$n-$v" "nvcc -O2 -g -lineinfo $([ $v = shared ] && echo '-cudart shared')" "built" "failed" "NO" \
                "$(grep -v '^exit' "$WORK/nvcc-$v.log" 2>/dev/null | tail -n1 | cut -c1-100)"
            continue
        fi
        time_for 20 "$n-$v" || return 0
        FULL=0
        CASE_ENV=()
        vrun "$n-$v" 60 -- "$WORK/allocs-$v" basic
        if ! grep -q '^RESULT ' "$C_OUT"; then
            row "$n-$v" "program ran" "a RESULT line" "none" "NO" "exit $C_RC; ${C_NOTE:+$C_NOTE; }$(last_error "$C_OUT")"
            continue
        fi
        if [ $v = shared ]; then
            judge "$n" judge-native "$n-$v" "$WORK" "$SRC"
        else
            judge "$n-static" judge-native "$n-$v" "$WORK" "$SRC" static
        fi
    done
}

if ((HAVE_TORCH)); then
    case_oom sites-oom-nocache PYTORCH_NO_CUDA_MEMORY_CACHING=1
    case_oom sites-oom-cache
    case_thread
    case_overhead
else
    row "sites-*" "torch importable" "yes" "no" "SKIP" "$(echo "$VERSIONS" | grep '^torch' | cut -c1-100)"
fi
case_native

exit 0

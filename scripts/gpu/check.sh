#!/usr/bin/env bash
# vramtrace on a real GPU: every case runs under `DIR/vramtrace run`, then `vramtrace report --json`, and the trace's
# device peak is compared with the framework's own figure. Prints a table LAST (the device tool keeps the last
# 12,000 characters); the full log is $OUT/gpu-log.txt, the table $OUT/gpu-table.md, case outputs and JSON
# reports $OUT/gpu-details.tgz, the PyTorch and JAX traces $OUT/gpu-traces.tgz (the rest stay in /tmp/vramtrace-check.*).
#
# Usage (on the GPU machine, from the repository root):  bash scripts/gpu/check.sh DIR
#   DIR holds the carried build: vramtrace, libvramtrace.so, vramtrace-workload (see docs/GPU.md).
#
# Each case is isolated (a failing framework does not stop the others), every command is bounded by `timeout`,
# a framework that is not installed gives SKIP, and the script always exits 0: the table says what matched.
# A case that fails under vramtrace is run once more without it, so the note says whose failure it is.
#
# match: yes = equal to the byte; close = within max(2 MiB, 1%); NO = further apart, or the case failed.
# PyTorch and JAX rows compare the allocator's part of the trace (vtread.py split reads the whole trace; torch_case.py
# dumps torch.cuda.memory_snapshot() to tell its segments apart) with the framework's figure; what libraries
# allocate outside the allocator (cuBLAS/cuBLASLt workspaces, live until exit) is reported in the note.
# Environment: OUT (default /tmp/vramtrace-gpu-out), PYTHON (default python3), CHECK_DEADLINE_S (default 510:
# no case starts later than this many seconds into the run, and none is allowed to run past it).

set -u
set -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vramtrace-gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu-log.txt"
TABLE="$OUT/gpu-table.md"
WORK="$(mktemp -d /tmp/vramtrace-check.XXXXXX)"
ROWS="$WORK/rows.tsv"
PY="${PYTHON:-python3}"
DEADLINE="${CHECK_DEADLINE_S:-510}"
TAG="vtcheck-$$"
# log, say, left, tmo, reap: shared with the other GPU scripts.
. "$HERE/lib.sh"
MIB=1048576
: >"$LOG"
: >"$ROWS"

# Settings from the machine must not leak into the cases.
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING XLA_PYTHON_CLIENT_PREALLOCATE \
    XLA_PYTHON_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR JAX_PLATFORMS CUPY_GPU_MEMORY_LIMIT

# ---------------------------------------------------------------------------------------------------------------
# Helpers

row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$ROWS"; }
# amend NAME TEXT: appends TEXT to the note of the last row when that row is case NAME.
amend() {
    local last
    last=$(tail -n1 "$ROWS")
    [ "${last%%$'\t'*}" = "$1" ] || return 0
    [ "$(cut -f4 <<<"$last")" = SKIP ] && return 0
    sed -i '$d' "$ROWS"
    printf '%s; %s\n' "$last" "$2" >>"$ROWS"
}
bytes() { awk -v b="$1" 'BEGIN { if (b !~ /^-?[0-9]+$/) { print "-"; exit } printf "%.0f (%.1f MiB)", b, b / 1048576 }'; }
smib() { awk -v b="$1" 'BEGIN { printf "%+.2f MiB", b / 1048576 }'; }
# Whether time is left for a case that needs about $1 seconds; if not, a SKIP row for case $2.
time_for() {
    if (($(left) < $1)); then
        row "$2" "-" "-" "SKIP" "time budget (${DEADLINE}s) spent"
        say "$2: SKIP (time budget)"
        return 1
    fi
}


CASE_ENV=()
SPLIT=""

# traced NAME LIMIT CMD...: runs CMD under `vramtrace run` with CASE_ENV, then reads the trace's JSON report.
# Sets C_RC C_OUT C_PEAK (device peak) C_PPEAK (process peak) C_EVENTS C_DROPPED C_NDEV C_NPROC C_TRACE_NOTE.
traced() {
    local name=$1 limit=$2 t rrc
    shift 2
    t=$(tmo "$limit")
    C_OUT="$WORK/$name.out"
    local trace="$WORK/$name.vtrace" json="$WORK/$name.json"
    rm -f "$trace"
    log ""
    log "=== $name: env ${CASE_ENV[*]+${CASE_ENV[*]}} vramtrace run --out $trace -- $* (timeout ${t}s)"
    env ${CASE_ENV[@]+"${CASE_ENV[@]}"} VT_CHECK_TAG="$TAG-$name" \
        timeout -k 10 "$t" "$VT" run --out "$trace" -- "$@" >"$C_OUT" 2>&1 </dev/null
    C_RC=$?
    reap "$TAG-$name"
    tail -n 150 "$C_OUT" >>"$LOG"
    log "--- $name: exit $C_RC"
    C_PEAK="" C_PPEAK="" C_EVENTS="" C_DROPPED="" C_NDEV="" C_NPROC="" C_TRACE_NOTE=""
    if [ ! -s "$trace" ]; then
        C_TRACE_NOTE="no trace written"
        return
    fi
    timeout 60 "$VT" report --json "$trace" >"$json" 2>"$WORK/$name.report.err"
    rrc=$?
    if [ $rrc -ne 0 ]; then
        C_TRACE_NOTE="report --json failed (exit $rrc): $(head -c 120 "$WORK/$name.report.err" | head -n1)"
        cat "$WORK/$name.report.err" >>"$LOG"
    elif ! read -r C_PEAK C_PPEAK C_EVENTS C_DROPPED C_NDEV C_NPROC < <("$PY" "$HERE/tracepeak.py" "$json" 2>>"$LOG"); then
        C_TRACE_NOTE="report JSON unreadable"
        C_PEAK=""
    fi
    log "--- $name: trace device_peak=$C_PEAK process_peak=$C_PPEAK events=$C_EVENTS dropped=$C_DROPPED devices=$C_NDEV processes=$C_NPROC"
    # The text report, for the log.
    timeout 60 "$VT" report "$trace" 2>&1 | head -n 40 >>"$LOG"
}

# bare NAME LIMIT CMD...: the same command without vramtrace (after a failure), prints its exit code.
bare() {
    local name=$1 limit=$2 t rc
    shift 2
    t=$(tmo "$limit")
    log "=== $name (without vramtrace, to tell whose failure it is): $* (timeout ${t}s)"
    env ${CASE_ENV[@]+"${CASE_ENV[@]}"} VT_CHECK_TAG="$TAG-$name-bare" \
        timeout -k 10 "$t" "$@" >"$WORK/$name.bare.out" 2>&1 </dev/null
    rc=$?
    reap "$TAG-$name-bare"
    tail -n 60 "$WORK/$name.bare.out" >>"$LOG"
    log "--- $name without vramtrace: exit $rc"
    echo "$rc"
}

# A KEY=value from the program's result line: `RESULT k=v ...` (Python, C++) or `workload: peak_expected_bytes=...`.
field() {
    grep -E '^(RESULT |workload: peak_expected_bytes=)' "$C_OUT" 2>/dev/null | tail -n1 | tr ' ' '\n' |
        sed -n "s/^$1=//p" | head -n1
}
# The program's last words: its last line that is not vramtrace's own summary.
last_error() { grep -v -e '^\s*$' -e '^vramtrace: ' "$1" 2>/dev/null | tail -n1 | cut -c1-100; }

# check NAME LIMIT EXTRA_NOTE -- CMD...: one case, one row. The figure is framework_peak_bytes (or the workload's
# peak_expected_bytes); expected_bytes is shown in the note when it differs.
check() {
    local name=$1 limit=$2 extra=$3
    shift 4 # past the --
    time_for 20 "$name" || return 0
    traced "$name" "$limit" "$@"
    if [ "$C_RC" -eq 3 ] && grep -q '^SKIP' "$C_OUT"; then
        row "$name" "-" "-" "SKIP" "$(grep -m1 '^SKIP' "$C_OUT" | cut -c6-)"
        say "$name: SKIP"
        return 0
    fi
    if [ "$C_RC" -ne 0 ]; then
        local why="exit $C_RC under vramtrace"
        { [ "$C_RC" -eq 124 ] || [ "$C_RC" -eq 137 ]; } && why="timed out under vramtrace"
        local brc="not rerun (time)"
        if (($(left) > limit / 2 + 30)); then
            brc=$(bare "$name" "$limit" "$@")
            [ "$brc" = 0 ] && brc="passes without it: vramtrace's fault" || brc="exit $brc without it too"
        fi
        row "$name" "$(bytes "$(field framework_peak_bytes)")" "$(bytes "$C_PEAK")" "NO" \
            "$why; $brc; last line: $(last_error "$C_OUT")"
        say "$name: FAILED ($why; $brc)"
        return 0
    fi
    local fig expected
    fig=$(field framework_peak_bytes)
    [ -z "$fig" ] && fig=$(field peak_expected_bytes)
    expected=$(field expected_bytes)
    if [ -n "$SPLIT" ]; then
        split_judge "$name" "$fig" "$expected" "$SPLIT" "$extra"
    else
        judge "$name" "$fig" "$expected" "$extra"
    fi
}

# split_judge NAME FIGURE EXPECTED MODE NOTE: reads the whole trace (vtread.py split), splits the device's bytes into
# the framework allocator's (MODE: torch-default = cuMemAlloc_v2 at a segment address of torch.cuda.memory_snapshot();
# torch-expandable = cuMemCreate handles; torch-async = cuMemAllocAsync; jax = the BFC pool's regions) and the rest
# (cuBLAS/cuBLASLt workspaces and other libraries), and compares the allocator's own peak with FIGURE: yes only
# when equal to the byte. The rest is reported in the note.
split_judge() {
    local name=$1 fig=$2 expected=$3 mode=$4 note=$5 line k who match d ad tol
    local -A S=()
    if ! [[ "$fig" =~ ^[0-9]+$ ]] || [ -n "$C_TRACE_NOTE" ] || ! [[ "$C_PEAK" =~ ^[0-9]+$ ]]; then
        judge "$name" "$fig" "$expected" "$note"
        return 0
    fi
    local args=(split "$WORK/$name.vtrace" --mode "$mode" --figure "$fig")
    [ -f "$WORK/$name.snapshot.json" ] && args+=(--snapshot "$WORK/$name.snapshot.json")
    while IFS= read -r line; do
        k=${line%%=*}
        [ -n "$k" ] && S[$k]=${line#*=}
    done < <(timeout 180 "$PY" "$HERE/vtread.py" "${args[@]}" 2>>"$LOG")
    log "--- $name split ($mode): $(for k in "${!S[@]}"; do printf '%s=%s; ' "$k" "${S[$k]}"; done)"
    if ! [[ "${S[in_peak]:-}" =~ ^[0-9]+$ ]] || ! [[ "${S[total_peak]:-}" =~ ^[0-9]+$ ]]; then
        judge "$name" "$fig" "$expected" "split failed (${S[error]:-vtread.py: see log}); $note"
        return 0
    fi
    if [ "$mode" = jax ]; then
        who="outside the BFC pool"
    else
        who="libraries outside PyTorch's allocator"
    fi
    d=$((${S[in_peak]} - fig))
    ad=${d#-}
    tol=$((fig / 100))
    ((tol < 2 * MIB)) && tol=$((2 * MIB))
    if ((d == 0)); then
        match=yes
    elif ((ad <= tol)); then
        match=close
    else
        match=NO
    fi
    note="$who: ${S[out_at_peak]} bytes at the peak (${S[out_desc]}); allocator = ${S[rule]}; $note"
    ((d != 0)) && note="allocator-figure $(smib "$d") (rounding that matches: ${S[rounding_that_matches]:-?}); $note"
    [ "${S[in_at_peak]}" != "${S[in_peak]}" ] && note="$note; allocator part at the device peak ${S[in_at_peak]}"
    [ "${S[total_peak]}" != "$C_PEAK" ] && note="$note; replayed device peak ${S[total_peak]} != report's $C_PEAK"
    [ -n "${S[snapshot_segments]:-}" ] &&
        note="$note; snapshot ${S[snapshot_segments]} segments, ${S[snapshot_segment_bytes]} bytes${S[snapshot_error]:+ (${S[snapshot_error]})}"
    [ -n "${S[handles_mapped_in_segments]:-}" ] && note="$note; handles mapped in segments ${S[handles_mapped_in_segments]}"
    if [[ "$expected" =~ ^[0-9]+$ ]] && [ "$expected" != "$fig" ]; then
        note="$note; expected $(bytes "$expected")"
    fi
    [[ "$C_DROPPED" =~ ^[1-9] ]] && note="$note; DROPPED $C_DROPPED events"
    [[ "$C_NPROC" =~ ^[0-9]+$ ]] && ((C_NPROC != 1)) && note="$note; $C_NPROC processes"
    note="$note; events $C_EVENTS"
    row "$name" "$(bytes "$fig")" "allocator $(bytes "${S[in_peak]}") of peak $(bytes "$C_PEAK")" "$match" "$note"
    say "$name: $match (figure $fig, allocator part ${S[in_peak]}, outside ${S[out_at_peak]}, trace peak $C_PEAK)"
}

# judge NAME FIGURE EXPECTED NOTE: compares the trace's device peak (C_PEAK) with FIGURE and adds the row.
judge() {
    local name=$1 fig=$2 expected=$3 note=$4 peak=$C_PEAK match d ad tol
    if ! [[ "$fig" =~ ^[0-9]+$ ]]; then
        row "$name" "-" "$(bytes "$peak")" "NO" "no result line from the program; $(last_error "$C_OUT")"
        say "$name: NO (no result line)"
        return 0
    fi
    if [ -n "$C_TRACE_NOTE" ] || ! [[ "$peak" =~ ^[0-9]+$ ]]; then
        row "$name" "$(bytes "$fig")" "-" "NO" "${C_TRACE_NOTE:-no trace peak}"
        say "$name: NO (${C_TRACE_NOTE:-no trace peak})"
        return 0
    fi
    if [ "$peak" = 0 ] && [[ "$C_PPEAK" =~ ^[1-9][0-9]*$ ]]; then
        note="device peak 0, process peak used; $note"
        peak=$C_PPEAK
    fi
    d=$((peak - fig))
    ad=${d#-}
    tol=$((fig / 100))
    ((tol < 2 * MIB)) && tol=$((2 * MIB))
    if ((d == 0)); then
        match=yes
    elif ((ad <= tol)); then
        match=close
    else
        match=NO
    fi
    ((d != 0)) && note="trace-figure $(smib "$d"); $note"
    if [[ "$expected" =~ ^[0-9]+$ ]] && [ "$expected" != "$fig" ]; then
        note="$note; expected $(bytes "$expected")"
    fi
    [[ "$C_DROPPED" =~ ^[1-9] ]] && note="$note; DROPPED $C_DROPPED events"
    [[ "$C_NPROC" =~ ^[0-9]+$ ]] && ((C_NPROC != 1)) && note="$note; $C_NPROC processes"
    [[ "$C_NDEV" =~ ^[0-9]+$ ]] && ((C_NDEV != 1)) && note="$note; $C_NDEV devices"
    note="$note; events $C_EVENTS"
    row "$name" "$(bytes "$fig")" "$(bytes "$peak")" "$match" "$note"
    say "$name: $match (figure $fig, trace $peak)"
}

# The table, last thing printed; also on SIGTERM/SIGINT so a cut-short run still shows what it has.
FINISHED=0
finish() {
    ((FINISHED)) && return
    FINISHED=1
    {
        echo "| case | framework figure (bytes) | trace device peak (bytes) | match | note |"
        echo "|---|---|---|---|---|"
        while IFS=$'\t' read -r c f p m n; do
            echo "| $c | $f | $p | $m | $n |"
        done <"$ROWS"
        echo
        echo "yes: $(cut -f4 "$ROWS" | grep -cx yes), close: $(cut -f4 "$ROWS" | grep -cx close)," \
            "NO: $(cut -f4 "$ROWS" | grep -cx NO), SKIP: $(cut -f4 "$ROWS" | grep -cx SKIP);" \
            "${SECONDS}s; log $LOG; traces in $WORK"
    } >"$TABLE"
    (cd "$WORK" && tar -czf "$OUT/gpu-details.tgz" -- *.out *.json *.err *.log 2>/dev/null)
    # The traces of the split cases, small enough to bring back for a second look.
    (cd "$WORK" && tar -czf "$OUT/gpu-traces.tgz" -- torch-*.vtrace jax-*.vtrace 2>/dev/null)
    cat "$TABLE" >>"$LOG"
    echo
    echo "=================== vramtrace GPU check: results ($TABLE) ==================="
    cat "$TABLE"
}
trap 'exit 0' TERM INT # the EXIT trap prints the table (running finish inside this trap can upset bash's parser)
trap 'finish' EXIT

# ---------------------------------------------------------------------------------------------------------------
# Header

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    say "usage: bash scripts/gpu/check.sh DIR (DIR: the carried build with vramtrace, libvramtrace.so, vramtrace-workload)"
    row "setup" "-" "-" "NO" "DIR missing: '${1:-}'"
    finish
    exit 0
fi
DIR="$(cd "$1" && pwd)"
VT="$DIR/vramtrace"
WL="$DIR/vramtrace-workload"

{
    echo "# vramtrace GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    echo "kernel $(uname -r); $(ldd --version 2>&1 | head -n1)"
    echo "DIR $DIR:"
    ls -l "$DIR"
    timeout 10 "$VT" --version
} 2>&1 | tee -a "$LOG"
VERSIONS=$(
    timeout 90 "$PY" - <<'EOF' 2>&1
import importlib
import sys
print("python", sys.version.split()[0])
for m in ("torch", "jax", "jaxlib", "cupy"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, str(e)[:80])
EOF
)
echo "$VERSIONS" | tee -a "$LOG"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n1)
echo "nvcc: ${NVCC:-MISSING} $([ -n "$NVCC" ] && timeout 30 "$NVCC" --version | tail -n1)" | tee -a "$LOG"
have() { echo "$VERSIONS" | grep -q "^$1 [0-9]"; }

if [ ! -x "$VT" ]; then
    row "setup" "-" "-" "NO" "$VT missing or not executable"
    finish
    exit 0
fi
[ -f "$DIR/libvramtrace.so" ] || say "warning: $DIR/libvramtrace.so missing: vramtrace run may not find the shim"

# ---------------------------------------------------------------------------------------------------------------
# 8. The cudarc workload: stream-ordered (cuMemAllocAsync) and --sync-alloc (cuMemAlloc_v2).

if [ -x "$WL" ]; then
    CASE_ENV=()
    check workload-async 90 "cudarc cuMemAllocAsync" -- "$WL"
    check workload-sync 90 "cudarc cuMemAlloc_v2" -- "$WL" --sync-alloc
else
    row "workload" "-" "-" "SKIP" "$WL not carried"
fi

# `vramtrace demo` end to end: it must pick the real driver here (and the simulated one when told to).
demo_case() {
    local name=$1 want=$2 out rc
    shift 2
    time_for 30 "$name" || return 0
    out="$WORK/$name.out"
    env VT_CHECK_TAG="$TAG-$name" timeout -k 10 "$(tmo 90)" "$VT" demo --steps 3 --out "$WORK/$name.vtrace" "$@" \
        >"$out" 2>&1 </dev/null
    rc=$?
    reap "$TAG-$name"
    log ""
    log "=== $name: vramtrace demo --steps 3 $*"
    tail -n 80 "$out" >>"$LOG"
    if [ $rc -eq 0 ] && grep -q "driver: $want" "$out"; then
        row "$name" "-" "-" "yes" "exit 0; $(grep -m1 'driver:' "$out" | cut -c1-90)"
    else
        row "$name" "-" "-" "NO" "exit $rc; $(grep -m1 'driver:' "$out" | cut -c1-60); last line: $(last_error "$out")"
    fi
    say "$name: exit $rc"
}
if [ -x "$WL" ]; then
    demo_case demo-real "the real NVIDIA driver"
    if [ -f "$DIR/libfakecuda.so" ]; then
        demo_case demo-simulated "simulated" --simulated
    else
        row "demo-simulated" "-" "-" "SKIP" "libfakecuda.so not carried"
    fi
fi

# ---------------------------------------------------------------------------------------------------------------
# 7. An nvcc-built program: static cudart (nvcc's default), shared cudart, per-thread default stream (_ptsz).

if [ -n "$NVCC" ]; then
    declare -A CU_FLAGS=([static]="" [shared]="-cudart shared" [ptsz]="--default-stream per-thread")
    for v in static shared ptsz; do
        time_for 40 "cu-$v" || continue
        # shellcheck disable=SC2086
        if timeout "$(tmo 120)" "$NVCC" -O2 ${CU_FLAGS[$v]} -o "$WORK/allocs-$v" "$HERE/allocs.cu" \
            >"$WORK/nvcc-$v.log" 2>&1; then
            CASE_ENV=()
            check "cu-$v-basic" 60 "cudaMalloc+cudaMallocAsync, ${CU_FLAGS[$v]:-static cudart}" -- "$WORK/allocs-$v" basic
            [ "$v" = static ] && check "cu-$v-extra" 60 "+cudaMallocPitch, cudaMallocManaged" -- "$WORK/allocs-$v" extra
        else
            cat "$WORK/nvcc-$v.log" >>"$LOG"
            row "cu-$v" "-" "-" "NO" "nvcc failed: $(last_error "$WORK/nvcc-$v.log")"
            say "cu-$v: nvcc failed"
        fi
    done
else
    row "cu-*" "-" "-" "SKIP" "nvcc not found"
fi

# ---------------------------------------------------------------------------------------------------------------
# 1-4. PyTorch: the caching allocator, expandable segments, the cudaMallocAsync backend, no caching.

# The trace holds PyTorch's allocations and those of libraries that call the driver themselves (cuBLAS/cuBLASLt
# workspaces, live until exit): the allocator's part (told apart with torch.cuda.memory_snapshot()) must equal
# PyTorch's figure exactly; the rest is reported.
if have torch; then
    CASE_ENV=(VT_SNAPSHOT="$WORK/torch-default.snapshot.json")
    SPLIT=torch-default
    check torch-default 120 "max_memory_reserved, caching allocator" -- "$PY" -u "$HERE/torch_case.py" default
    CASE_ENV=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True VT_SNAPSHOT="$WORK/torch-expandable.snapshot.json")
    SPLIT=torch-expandable
    check torch-expandable 120 "max_memory_reserved, expandable_segments (cuMemCreate)" -- \
        "$PY" -u "$HERE/torch_case.py" expandable
    CASE_ENV=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync VT_SNAPSHOT="$WORK/torch-mallocasync.snapshot.json")
    SPLIT=torch-async
    check torch-mallocasync 120 "max_memory_allocated, cudaMallocAsync backend" -- \
        "$PY" -u "$HERE/torch_case.py" async
    amend torch-mallocasync "max_memory_reserved $(bytes "$(field max_memory_reserved)")"
    SPLIT=""
    CASE_ENV=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    check torch-nocache 120 "script's held peak, PYTORCH_NO_CUDA_MEMORY_CACHING=1" -- \
        "$PY" -u "$HERE/torch_case.py" nocache
    amend torch-nocache "torch's max_memory_reserved $(field max_memory_reserved), allocated $(field max_memory_allocated)"
    CASE_ENV=()
else
    row "torch-*" "-" "-" "SKIP" "torch not importable"
fi

# ---------------------------------------------------------------------------------------------------------------
# 6. CuPy: no pool (cudaMalloc per array) and the default pool.

if have cupy; then
    CASE_ENV=()
    check cupy-nopool 90 "set_allocator(None), script's held peak" -- "$PY" -u "$HERE/cupy_case.py" nopool
    check cupy-pool 90 "default pool, peak total_bytes()" -- "$PY" -u "$HERE/cupy_case.py" pool
else
    row "cupy-*" "-" "-" "SKIP" "cupy not importable"
fi

# ---------------------------------------------------------------------------------------------------------------
# 5. JAX: without preallocation (known arrays), and with the default preallocation (75% of the total).

# The trace also holds small allocations outside XLA's BFC pool: the pool's part must equal its figure exactly.
if have jax; then
    SPLIT=jax
    CASE_ENV=(JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false)
    check jax-noprealloc 120 "BFC pool peak; PREALLOCATE=false" -- "$PY" -u "$HERE/jax_case.py" noprealloc
    amend jax-noprealloc "figure=$(field figure), peak_bytes_in_use $(bytes "$(field peak_bytes_in_use)")"
    CASE_ENV=(JAX_PLATFORMS=cuda)
    check jax-prealloc 120 "preallocated pool" -- "$PY" -u "$HERE/jax_case.py" prealloc
    total=$(field device_total)
    if [[ "$total" =~ ^[1-9][0-9]*$ ]] && [[ "$C_PEAK" =~ ^[0-9]+$ ]]; then
        amend jax-prealloc "figure=$(field figure); trace peak = $(awk -v p="$C_PEAK" -v t="$total" \
            'BEGIN { printf "%.2f%%", 100 * p / t }') of total $(bytes "$total") (XLA fraction $(field fraction))"
    fi
    SPLIT=""
    CASE_ENV=()
else
    row "jax-*" "-" "-" "SKIP" "jax not importable"
fi

# ---------------------------------------------------------------------------------------------------------------
# 9. Overhead: --tiny-loop N x (cuMemAlloc_v2 + cuMemFree_v2) of 1 MiB, without and with vramtrace, alternating.

ns_of() { sed -n 's/^loop: .*ns_per_pair=\([0-9.]*\).*/\1/p' "$1" | tail -n1; }
median3() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

bench() {
    local iters=200000 cal est i plain=() traced_ns=() p t pm tm pct match note=""
    [ -x "$WL" ] || { row "overhead" "-" "-" "SKIP" "$WL not carried"; return; }
    time_for 60 "overhead" || return
    timeout 60 "$WL" --tiny-loop 2000 --bytes "$MIB" >"$WORK/bench-cal.out" 2>&1
    cal=$(ns_of "$WORK/bench-cal.out")
    cat "$WORK/bench-cal.out" >>"$LOG"
    if [ -z "$cal" ]; then
        row "overhead" "-" "-" "NO" "calibration failed: $(last_error "$WORK/bench-cal.out")"
        return
    fi
    # Six runs must fit the time left (with room for start-up): fewer iterations if the GPU is slow.
    est=$(awk -v c="$cal" -v n="$iters" 'BEGIN { printf "%d", c * n / 1e9 }')
    local per_run=$((($(left) - 30) / 6 - 5))
    ((per_run > 60)) && per_run=60
    if ((est > per_run)); then
        iters=$(awk -v c="$cal" -v s="$per_run" 'BEGIN { n = s * 1e9 / c; if (n < 1000) n = 1000; printf "%d", n }')
        note="iterations cut to $iters (calibration ${cal} ns/pair); "
    fi
    say "overhead: $iters iterations per run (calibration $cal ns/pair)"
    for i in 1 2 3; do
        timeout -k 5 "$(tmo 120)" "$WL" --tiny-loop "$iters" --bytes "$MIB" >"$WORK/bench-plain-$i.out" 2>&1
        cat "$WORK/bench-plain-$i.out" >>"$LOG"
        p=$(ns_of "$WORK/bench-plain-$i.out")
        [ -n "$p" ] && plain+=("$p")
        CASE_ENV=()
        traced "bench-traced-$i" 120 "$WL" --tiny-loop "$iters" --bytes "$MIB"
        t=$(ns_of "$C_OUT")
        [ -n "$t" ] && traced_ns+=("$t")
        say "overhead run $i: plain ${p:-?} ns/pair, traced ${t:-?} ns/pair (exit $C_RC)"
    done
    if ((${#plain[@]} == 0 || ${#traced_ns[@]} == 0)); then
        row "overhead" "-" "-" "NO" "${note}runs failed: $(last_error "$C_OUT")"
        return
    fi
    pm=$(median3 "${plain[@]}")
    tm=$(median3 "${traced_ns[@]}")
    pct=$(awk -v p="$pm" -v t="$tm" 'BEGIN { printf "%+.2f", 100 * (t - p) / p }')
    match=$(awk -v x="$pct" 'BEGIN { print (x <= 2.0) ? "yes" : "NO" }')
    note="${note}traced vs plain ${pct}% (target <= 2%); plain ${plain[*]}; traced ${traced_ns[*]} ns/pair"
    note="$note; last trace: peak $C_PEAK, events $C_EVENTS (expect $((2 * iters))), dropped ${C_DROPPED:-?}"
    row "overhead ($iters x 1 MiB alloc+free)" "plain median ${pm} ns/pair" "traced median ${tm} ns/pair" \
        "$match" "$note"
}
bench

finish
exit 0

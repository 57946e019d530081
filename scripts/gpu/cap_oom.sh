#!/usr/bin/env bash
# vramtrace's cap and out-of-memory diagnosis on a real GPU. Every case runs under `DIR/vramtrace run` (the hog of
# oom-external alone runs outside it), then the trace is read three ways: `vramtrace report --json`, the trace file
# itself (scripts/gpu/vtread.py: refusals, over-cap events, out-of-memory records), and `vramtrace oom --json` when
# this build has that verb (otherwise its checks say SKIP and the rest still runs).
#
# Usage (on the GPU machine, from the repository root):  bash scripts/gpu/cap_oom.sh DIR
#   DIR holds the carried build: vramtrace, libvramtrace.so (scripts/gpu/prepare.sh makes .gpu).
#
# Prints a table LAST (case | checked | expected | got | pass | note); the full log is $OUT/cap-oom-log.txt, the table
# $OUT/cap-oom-table.md, case outputs and JSON answers $OUT/cap-oom-details.tgz. Each case is isolated and bounded by
# `timeout`; no case starts after CAP_OOM_DEADLINE_S (default 470) seconds; the script always exits 0.
# pass: yes = as expected (to the byte where a number is expected); close = within the stated tolerance;
# NO = not; SKIP = not run (framework missing, verb missing, time spent).
#
# Cases: a cap-torch, b cap-jax, c cap-two-procs, d cap-warn, e oom-pressure, f oom-cap, g oom-external,
# h oom-killed, i nvml-cap, j nvml-nocap (run in the order a b i j c d f e h g: the hog of g fills 90% of the GPU, so
# it goes last). i and j need pynvml (nvidia-ml-py), not torch.

set -u
set -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vramtrace-gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/cap-oom-log.txt"
TABLE="$OUT/cap-oom-table.md"
WORK="$(mktemp -d /tmp/vramtrace-capoom.XXXXXX)"
ROWS="$WORK/rows.tsv"
PY="${PYTHON:-python3}"
CASE_PY="$HERE/cap_oom_case.py"
DEADLINE="${CAP_OOM_DEADLINE_S:-470}"
TAG="vtcapoom-$$"
# log, say, left, tmo, reap: shared with the other GPU scripts.
TMO_MIN=5
. "$HERE/lib.sh"
MIB=1048576
: >"$LOG"
: >"$ROWS"

unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING XLA_PYTHON_CLIENT_PREALLOCATE \
    XLA_PYTHON_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR JAX_PLATFORMS CUPY_GPU_MEMORY_LIMIT \
    VRAMTRACE_CAP VRAMTRACE_CAP_MODE VRAMTRACE_LEDGER LD_PRELOAD

# ---------------------------------------------------------------------------------------------------------------
# Helpers (copied from check.sh, so that each script stands alone)

bytes() { awk -v b="$1" 'BEGIN { if (b !~ /^-?[0-9]+$/) { print (b == "" ? "-" : b); exit } printf "%.0f (%.1f MiB)", b, b / 1048576 }'; }
smib() { awk -v b="$1" 'BEGIN { printf "%+.2f MiB", b / 1048576 }'; }
isnum() { [[ "${1:-}" =~ ^-?[0-9]+$ ]]; }
# row CASE CHECKED EXPECTED GOT PASS NOTE
row() {
    local a=("$@") i
    for i in 0 1 2 3 4 5; do a[i]=${a[i]:-}; a[i]=${a[i]//$'\t'/ }; a[i]=${a[i]//$'\n'/ }; a[i]=${a[i]//|//}; done
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${a[@]:0:6}" >>"$ROWS"
    say "$1: $2: ${a[4]} (got ${a[3]})"
}
# yn COND: yes when the arithmetic condition holds (NO when it fails or a number is missing)
yn() { if (($1)) 2>/dev/null; then echo yes; else echo NO; fi; }
time_for() {
    if (($(left) < $1)); then
        row "$2" "-" "-" "-" "SKIP" "time budget (${DEADLINE}s) spent"
        return 1
    fi
}
last_error() { grep -v -e '^\s*$' -e '^vramtrace: ' -e '^    ' "$1" 2>/dev/null | tail -n1 | cut -c1-110; }


# nvidia-smi sampled every 0.2 s in the background: per-process used MiB and the GPU's used MiB.
SMI_PID=""
smi_loop() {
    local f=$1 apps gpu
    while :; do
        apps=$(timeout 5 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            tr -d ' ' | tr '\n' ';')
        gpu=$(timeout 5 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null |
            head -n1 | tr -d ' ')
        echo "t=$SECONDS gpu=$gpu apps=$apps" >>"$f"
        sleep 0.2
    done
}
smi_start() {
    : >"$1"
    smi_loop "$1" &
    SMI_PID=$!
}
smi_stop() {
    if [ -n "$SMI_PID" ]; then
        kill "$SMI_PID" 2>/dev/null
        wait "$SMI_PID" 2>/dev/null
    fi
    SMI_PID=""
}
# smi_max FILE PID: "<max MiB of PID, or -> <max GPU used MiB, or -> <samples>"
smi_max() {
    awk -v pid="$2" '
        { n++
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^gpu=[0-9]+$/) { v = substr($i, 5) + 0; if (g == "" || v > g) g = v }
            if ($i ~ /^apps=/) {
              k = split(substr($i, 6), a, ";")
              for (j = 1; j <= k; j++) { split(a[j], b, ","); if (b[1] == pid && (m == "" || b[2] + 0 > m)) m = b[2] + 0 }
            }
          } }
        END { printf "%s %s %d\n", (m == "" ? "-" : m), (g == "" ? "-" : g), n }' "$1" 2>/dev/null
}
gpu_used_now() { timeout 10 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n1 | tr -d ' '; }

# A KEY=value from the program's last `RESULT k=v ...` line.
field() {
    grep -E '^RESULT ' "$C_OUT" 2>/dev/null | tail -n1 | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}
start_field() {
    grep -E '^START ' "$C_OUT" 2>/dev/null | head -n1 | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}
msg() { grep -m1 '^MSG ' "$C_OUT" 2>/dev/null | cut -c5-120; }

# kv ARRAY CMD...: runs CMD (prints key=value lines) and fills the associative array ARRAY.
kv() {
    local -n _a=$1
    local line k
    shift
    _a=()
    while IFS= read -r line; do
        k=${line%%=*}
        [ -n "$k" ] && [ "$k" != "$line" ] && _a[$k]=${line#*=}
    done < <("$@" 2>>"$LOG")
}

CASE_ENV=()
declare -A R=() T=() V=()
HAVE_OOM=0

# vrun NAME LIMIT [vramtrace run options...] -- CMD...: runs CMD under `vramtrace run --out TRACE OPTIONS --`, then
# fills R (report --json), T (the trace file: vtread.py ooms) and V (vramtrace oom --json, when the verb exists).
# Sets C_RC (vramtrace run's exit code), C_OUT, C_TRACE, C_SECS, C_TIMEDOUT, C_NOTE.
vrun() {
    local name=$1 limit=$2 t t0 opts=()
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
    tail -n 120 "$C_OUT" >>"$LOG"
    log "--- $name: vramtrace run exit $C_RC after ${C_SECS}s (timed out: $C_TIMEDOUT)"
    R=() T=() V=()
    if [ ! -s "$C_TRACE" ]; then
        C_NOTE="no trace written"
        return
    fi
    if timeout 60 "$VT" report --json "$C_TRACE" >"$WORK/$name.report.json" 2>"$WORK/$name.report.err"; then
        kv R timeout 60 "$PY" "$HERE/vtread.py" report "$WORK/$name.report.json"
    else
        C_NOTE="report --json failed: $(head -n1 "$WORK/$name.report.err" | cut -c1-100)"
    fi
    kv T timeout 120 "$PY" "$HERE/vtread.py" ooms "$C_TRACE"
    if ((HAVE_OOM)); then
        timeout 60 "$VT" oom "$C_TRACE" --json >"$WORK/$name.oom.json" 2>"$WORK/$name.oom.err"
        local orc=$?
        log "--- $name: vramtrace oom --json exit $orc: $(head -c 2000 "$WORK/$name.oom.json")"
        cat "$WORK/$name.oom.err" >>"$LOG"
        kv V timeout 60 "$PY" "$HERE/vtread.py" oomverb "$WORK/$name.oom.json"
        [ -n "${V[n]:-}" ] || V[error]="vramtrace oom --json exit $orc, unreadable: $(head -n1 "$WORK/$name.oom.err" | cut -c1-80)"
    fi
    log "--- $name report: $(for k in "${!R[@]}"; do printf '%s=%s ' "$k" "${R[$k]}"; done)"
    log "--- $name trace: $(for k in "${!T[@]}"; do printf '%s=%s ' "$k" "${T[$k]}"; done)"
    log "--- $name oom verb: $(for k in "${!V[@]}"; do printf '%s=%s ' "$k" "${V[$k]}"; done)"
    timeout 60 "$VT" report "$C_TRACE" 2>&1 | head -n 30 >>"$LOG"
    ((HAVE_OOM)) && timeout 60 "$VT" oom "$C_TRACE" 2>&1 | head -n 60 >>"$LOG"
}

# ran NAME: a row when the program gave no RESULT line (returns 1 then).
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

# The trace's job peak against a cap.
peak_le() { # NAME CAP_BYTES
    local p=${R[device_peak]:-}
    row "$1" "trace: job device peak <= cap" "<= $(bytes "$2")" "$(bytes "$p")" "$(isnum "$p" && yn "p <= $2" || echo NO)" \
        "report --json; ${C_NOTE:+$C_NOTE; }cap refusals ${R[cap_refusals]:--}, oom results ${R[oom_results]:--}, dropped ${R[dropped_events]:--}"
}

# The oom verb's cause: oom_cause NAME WANT [EXTRA_NOTE]
oom_cause() {
    local name=$1 want=$2 extra=${3:-}
    if ((!HAVE_OOM)); then
        row "$name" "vramtrace oom: cause" "$want" "-" "SKIP" "no oom verb in this build; trace: ${T[oom_records]:-?} OOM records, ${T[refused_events]:-?} cap refusals${extra:+; $extra}"
        return
    fi
    if [ -n "${V[error]:-}" ]; then
        row "$name" "vramtrace oom: cause" "$want" "-" "NO" "${V[error]}"
        return
    fi
    local p=NO trace="trace file: ${T[oom_records]:-?} OOM records (kind 7), ${T[refused_events]:-?} cap refusals (flag 2)"
    [ "${V[n]:-0}" -ge 1 ] 2>/dev/null && [ "${V[distinct_causes]}" = "$want" ] && p=yes
    if [ "${V[n]:-0}" = 0 ]; then
        row "$name" "vramtrace oom: cause (every OOM)" "$want" "no OOM analysed" "NO" \
            "${V[message]:-?}; oom_records ${V[oom_records]:-?}, oom_results ${V[oom_results]:-?}; $trace${extra:+; $extra}"
        return
    fi
    row "$name" "vramtrace oom: cause (every OOM)" "$want" "${V[causes]:-none} (${V[n]:-0} OOMs)" "$p" \
        "rule ${V[first_cause_rule]:-?}; requested $(bytes "${V[first_requested_bytes]:-}"), device_free $(bytes "${V[first_device_free_bytes]:-}"), job_live $(bytes "${V[first_job_live_bytes]:-}") (${V[first_job_live_source]:-?}), cap ${V[first_cap_bytes]:-null}; $trace${extra:+; $extra}"
}

# Whether the program's error was PyTorch's out-of-memory error.
err_row() { # NAME EXPECTED_TYPE
    local et
    et=$(field error_type)
    row "$1" "error the program got" "$2" "${et:--}" "$([ "$et" = "$2" ] && echo yes || echo NO)" "$(msg)"
}

# The table, last thing printed; also on SIGTERM/SIGINT.
FINISHED=0
HOG_PID=""
kill_hog() {
    [ -n "$HOG_PID" ] || return 0
    kill -TERM "$HOG_PID" 2>/dev/null
    local i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$HOG_PID" 2>/dev/null || break
        sleep 0.5
    done
    kill -KILL "$HOG_PID" 2>/dev/null
    wait "$HOG_PID" 2>/dev/null
    reap "$TAG-hog"
    HOG_PID=""
}
finish() {
    ((FINISHED)) && return
    FINISHED=1
    smi_stop
    kill_hog
    {
        echo "| case | checked | expected | got | pass | note |"
        echo "|---|---|---|---|---|---|"
        while IFS=$'\t' read -r c w e g p n; do
            echo "| $c | $w | $e | $g | $p | $n |"
        done <"$ROWS"
        echo
        echo "yes: $(cut -f5 "$ROWS" | grep -cx yes), close: $(cut -f5 "$ROWS" | grep -cx close)," \
            "NO: $(cut -f5 "$ROWS" | grep -cx NO), SKIP: $(cut -f5 "$ROWS" | grep -cx SKIP);" \
            "${SECONDS}s; oom verb: $( ((HAVE_OOM)) && echo present || echo absent); log $LOG; traces in $WORK"
    } >"$TABLE"
    (cd "$WORK" && tar -czf "$OUT/cap-oom-details.tgz" -- *.out *.json *.err *.smi 2>/dev/null)
    (cd "$WORK" && tar -czf "$OUT/cap-oom-traces.tgz" -- *.vtrace 2>/dev/null)
    cat "$TABLE" >>"$LOG"
    echo
    echo "=================== vramtrace cap / OOM check: results ($TABLE) ==================="
    cat "$TABLE"
}
trap 'exit 0' TERM INT # the EXIT trap prints the table (running finish inside this trap can upset bash's parser)
trap 'finish' EXIT

# ---------------------------------------------------------------------------------------------------------------
# Header

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    say "usage: bash scripts/gpu/cap_oom.sh DIR (DIR: the carried build with vramtrace, libvramtrace.so)"
    row "setup" "DIR" "a folder" "'${1:-}'" "NO" "DIR missing"
    finish
    exit 0
fi
DIR="$(cd "$1" && pwd)"
VT="$DIR/vramtrace"

{
    echo "# vramtrace cap / OOM check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
    timeout 30 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
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
for m in ("torch", "jax", "jaxlib", "cupy"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, str(e)[:80])
EOF
)
echo "$VERSIONS" | tee -a "$LOG"
have() { echo "$VERSIONS" | grep -q "^$1 [0-9]"; }
if [ ! -x "$VT" ]; then
    row "setup" "vramtrace" "executable" "missing" "NO" "$VT missing or not executable"
    finish
    exit 0
fi
if timeout 10 "$VT" oom --help >/dev/null 2>&1; then
    HAVE_OOM=1
    say "vramtrace oom: present"
else
    say "vramtrace oom: absent (its checks say SKIP)"
fi
if ! have torch; then
    row "torch cases" "torch importable" "yes" "no" "SKIP" "$(echo "$VERSIONS" | grep '^torch' | cut -c1-100)"
fi

# ---------------------------------------------------------------------------------------------------------------
# a. cap-torch: --cap 4GiB, 256 MiB tensors until torch.OutOfMemoryError.

case_cap_torch() {
    local n=cap-torch cap=4294967296 pid s pm gm samples base ctx res
    time_for 40 $n || return 0
    base=$(gpu_used_now)
    smi_start "$WORK/$n.smi"
    CASE_ENV=()
    vrun $n 120 --cap 4GiB -- "$PY" -u "$CASE_PY" grow 256
    smi_stop
    ran $n || { peak_le $n $cap; return 0; }
    err_row $n OutOfMemoryError
    res=$(field max_memory_reserved)
    row $n "torch max_memory_reserved <= cap" "<= $cap" "$(bytes "$res")" "$(isnum "$res" && yn "res <= cap" || echo NO)" \
        "$(field tensors) tensors of 256 MiB held at the error"
    s=$(field start_total)
    row $n "mem_get_info() total at start" "$cap" "$(bytes "$s")" "$([ "$s" = $cap ] && echo yes || echo NO)" "cuMemGetInfo_v2 under the cap"
    s=$(field start_free)
    row $n "mem_get_info() free at start" "<= $cap" "$(bytes "$s")" "$(isnum "$s" && yn "s <= cap" || echo NO)" \
        "at the error: free $(bytes "$(field free_at_oom)"), total $(field total_at_oom)"
    pid=$(start_field pid)
    read -r pm gm samples < <(smi_max "$WORK/$n.smi" "$pid")
    if isnum "$pm"; then
        ctx=$(awk -v u="$pm" -v r="$res" 'BEGIN { printf "%.0f", u - r / 1048576 }')
        row $n "nvidia-smi used by the pid (max, 0.2 s samples)" "<= 4096 MiB + context (<= 1024 MiB)" "$pm MiB" \
            "$(yn "pm <= 4096 + 1024")" "context = used - max_memory_reserved = $ctx MiB (expected ~500-600); $samples samples; at the error $(field smi_pid_mib) MiB"
    elif isnum "$gm"; then
        ctx=$(awk -v u="$gm" -v b="${base:-0}" -v r="$res" 'BEGIN { printf "%.0f", u - b - r / 1048576 }')
        row $n "nvidia-smi GPU used - before (max)" "<= 4096 MiB + context (<= 1024 MiB)" "$((gm - ${base:-0})) MiB" \
            "$(yn "gm - ${base:-0} <= 4096 + 1024")" "pid $pid not listed by nvidia-smi (pid namespace?): whole GPU used $gm MiB, $base before; context ~ $ctx MiB; $samples samples"
    else
        row $n "nvidia-smi used by the pid" "<= 5120 MiB" "-" "NO" "no nvidia-smi samples ($samples); pid $pid"
    fi
    peak_le $n $cap
    row $n "trace: cap refusals recorded" ">= 1" "${R[cap_refusals]:--}" "$(isnum "${R[cap_refusals]:-}" && yn "${R[cap_refusals]} >= 1" || echo NO)" \
        "flag-2 events in the trace file ${T[refused_events]:--}; OOM records (kind 7) ${T[oom_records]:--}"
    # The case keeps every tensor in a list until the cap refuses: the bridge's walk names that list, and
    # growth is decided before the cap's rules (docs/OOM.md), so the verdict is growth (since before c6bf344;
    # GPU-RESULTS, session 59's final check). The cap's refusal itself is the rows above.
    oom_cause $n growth
}

# ---------------------------------------------------------------------------------------------------------------
# b. cap-jax: --cap 8GiB, JAX's default preallocation (75% of the total cuMemGetInfo reports).

case_cap_jax() {
    local n=cap-jax cap=8589934592 want=6442450944 p d ad tol bl pool t
    time_for 40 $n || return 0
    CASE_ENV=(JAX_PLATFORMS=cuda)
    vrun $n 150 --cap 8GiB -- "$PY" -u "$CASE_PY" jax
    CASE_ENV=()
    ran $n || { peak_le $n $cap; return 0; }
    p=${R[device_peak]:-}
    tol=$((want / 100))
    if isnum "$p"; then
        d=$((p - want))
        ad=${d#-}
        row $n "trace: job device peak = 0.75 x cap" "$want" "$(bytes "$p")" "$( ((d == 0)) && echo yes || { ((ad <= tol)) && echo close || echo NO; })" \
            "peak-0.75cap $(smib "$d") ($d bytes; tolerance 1%); memory_stats peak_pool_bytes $(field peak_pool_bytes), pool_bytes $(field pool_bytes)"
    else
        row $n "trace: job device peak = 0.75 x cap" "$want" "-" "NO" "${C_NOTE:-no device peak}; exit $C_RC"
    fi
    local -A S=()
    kv S timeout 120 "$PY" "$HERE/vtread.py" split "$C_TRACE" --mode jax --figure "$want"
    pool=${S[in_peak]:-}
    if isnum "$pool"; then
        d=$((pool - want))
        ad=${d#-}
        row $n "trace: BFC pool part (${S[rule]})" "$want" "$(bytes "$pool")" "$( ((d == 0)) && echo yes || { ((ad <= tol)) && echo close || echo NO; })" \
            "outside the pool ${S[out_at_peak]} bytes (${S[out_desc]})"
    fi
    bl=$(field bytes_limit)
    if isnum "$bl" && ((bl > 0)); then
        d=$((bl - want))
        ad=${d#-}
        row $n "jax memory_stats bytes_limit" "$want" "$(bytes "$bl")" "$( ((d == 0)) && echo yes || { ((ad <= tol)) && echo close || echo NO; })" \
            "bytes_limit-0.75cap $d bytes"
    else
        row $n "jax memory_stats bytes_limit" "$want" "${bl:--}" "NO" "memory_stats had no bytes_limit"
    fi
    t=$(field cu_device_total)
    row $n "cuDeviceTotalMem_v2 in the job (ctypes dlsym)" "$cap" "$(bytes "$t")" "$([ "$t" = $cap ] && echo yes || echo NO)" "min(cap, physical)"
    peak_le $n $cap
}

# ---------------------------------------------------------------------------------------------------------------
# c. cap-two-procs: one --cap 6GiB over two processes, 1 GiB cudaMalloc each (no caching) until refused.

case_two_procs() {
    local n=cap-two-procs cap=6442450944 got total=0 each="" bad=0 ok=0 g notoom=0
    time_for 40 $n || return 0
    rm -rf "$WORK/barrier"
    mkdir -p "$WORK/barrier"
    CASE_ENV=(PYTORCH_NO_CUDA_MEMORY_CACHING=1 VT_BARRIER="$WORK/barrier" VT_WORKERS=2)
    vrun $n 150 --cap 6GiB -- bash -c '"$0" -u "$1" worker & "$0" -u "$1" worker & wait' "$PY" "$CASE_PY"
    CASE_ENV=()
    while read -r got; do
        isnum "$got" || continue
        ok=$((ok + 1))
        total=$((total + got))
        each="$each${each:+ + }$got"
        ((got > 6)) && bad=1
    done < <(grep '^RESULT ' "$C_OUT" | tr ' ' '\n' | sed -n 's/^got_gib=//p')
    notoom=$(grep '^RESULT ' "$C_OUT" | grep -c 'is_oom=0')
    if ((ok != 2)); then
        row $n "both workers reported" "2 RESULT lines" "$ok" "NO" "exit $C_RC; last line: $(last_error "$C_OUT")"
    fi
    row $n "GiB held by both together" "<= 6 (6 expected)" "$each = $total" "$( ((ok >= 1 && total <= 6)) && echo yes || echo NO)" \
        "each GiB is one cudaMalloc (PYTORCH_NO_CUDA_MEMORY_CACHING=1); $( ((total == 6)) && echo "cap filled exactly" || echo "cap not filled")"
    row $n "no worker over the cap alone" "each <= 6" "$each" "$( ((ok >= 1 && bad == 0)) && echo yes || echo NO)" \
        "errors: $(grep -h '^MSG ' "$C_OUT" | cut -c5-60 | sort | uniq -c | tr -s ' ' | tr '\n' ';')$( ((notoom)) && echo " $notoom worker(s) ended without an OOM error")"
    peak_le $n $cap
    g=${R[process_peaks]:-}
    row $n "trace: processes holding memory" "2" "$(awk -F, '{ print NF }' <<<"$g")" "$([ "$(awk -F, '{ print NF }' <<<"$g")" = 2 ] && echo yes || echo NO)" \
        "process peaks ${g:--}; ended ${R[ended]:--}; cap refusals ${R[cap_refusals]:--}"
}

# ---------------------------------------------------------------------------------------------------------------
# d. cap-warn: --cap 1GiB --cap-mode warn, one 2 GiB tensor: it must succeed, and the trace shows it past the cap.

case_cap_warn() {
    local n=cap-warn cap=1073741824 p
    time_for 30 $n || return 0
    CASE_ENV=()
    vrun $n 90 --cap 1GiB --cap-mode warn -- "$PY" -u "$CASE_PY" warn 2048
    ran $n || return 0
    row $n "2 GiB allocation succeeds" "ok=1, exit 0" "ok=$(field ok), exit $C_RC" "$([ "$(field ok)" = 1 ] && [ "$C_RC" = 0 ] && echo yes || echo NO)" \
        "$(msg)mem_get_info after: free $(field after_free), total $(field after_total) (start total $(field start_total))"
    p=${R[device_peak]:-}
    row $n "trace: device peak > cap" "> $cap (2147483648 expected)" "$(bytes "$p")" "$(isnum "$p" && yn "p > cap" || echo NO)" "$([ "$p" = 2147483648 ] && echo "exactly 2 GiB" || echo "not exactly 2 GiB")"
    row $n "trace: processes[].cap_refusals" "0" "${R[cap_refusals]:--}" "$([ "${R[cap_refusals]:-x}" = 0 ] && echo yes || echo NO)" \
        "over-cap events (flag 4) in the trace file: ${T[over_cap_events]:--}"
    row $n "trace: over-cap events (flag 4)" ">= 1" "${T[over_cap_events]:--}" "$(isnum "${T[over_cap_events]:-}" && yn "${T[over_cap_events]} >= 1" || echo NO)" "warn mode records what passes the cap"
}

# ---------------------------------------------------------------------------------------------------------------
# e. oom-pressure: no cap, 4 GiB tensors until the GPU itself runs out.

case_oom_pressure() {
    local n=oom-pressure res jl fr df d
    time_for 60 $n || return 0
    CASE_ENV=()
    vrun $n 180 -- "$PY" -u "$CASE_PY" pressure 4096
    ran $n || return 0
    err_row $n OutOfMemoryError
    res=$(field max_memory_reserved)
    fr=$(field free_at_oom)
    row $n "trace: OOM records (kind 7)" ">= 1" "${T[oom_records]:--}" "$(isnum "${T[oom_records]:-}" && yn "${T[oom_records]} >= 1" || echo NO)" \
        "first: requested $(bytes "${T[first_requested_bytes]:-}"), driver free $(bytes "${T[first_device_free_bytes]:-}"); torch: reserved $(bytes "$(field reserved_at_oom)"), allocated $(bytes "$(field allocated_at_oom)"), mem_get_info free $(bytes "$fr") of $(field total_at_oom); nvidia-smi pid $(field smi_pid_mib) MiB, GPU $(field smi_gpu_mib) MiB"
    oom_cause $n pressure "$(field tensors) x 4 GiB held"
    if ((HAVE_OOM)) && [ -z "${V[error]:-}" ]; then
        jl=${V[first_job_live_bytes]:-}
        if isnum "$jl" && isnum "$res"; then
            d=$((jl - res))
            row $n "oom: job_live_bytes vs max_memory_reserved" "within 8 MiB of $res" "$(bytes "$jl")" "$( ((d == 0)) && echo yes || { ((${d#-} <= 8 * MIB)) && echo close || echo NO; })" "diff $(smib "$d")"
        else
            row $n "oom: job_live_bytes vs max_memory_reserved" "$res" "${jl:--}" "NO" "missing figure"
        fi
        df=${V[first_device_free_bytes]:-}
        if isnum "$df" && isnum "$fr"; then
            d=$((df - fr))
            row $n "oom: device_free_bytes vs mem_get_info free at the error" "within 32 MiB of $fr" "$(bytes "$df")" "$( ((d == 0)) && echo yes || { ((${d#-} <= 32 * MIB)) && echo close || echo NO; })" "diff $(smib "$d")"
        else
            row $n "oom: device_free_bytes vs mem_get_info free" "$fr" "${df:--}" "NO" "missing figure"
        fi
    else
        row $n "oom: job_live_bytes / device_free_bytes" "~ $res / ~ $fr" "-" "SKIP" "${V[error]:-no oom verb}"
    fi
}

# ---------------------------------------------------------------------------------------------------------------
# f. oom-cap: --cap 4GiB, a training loop whose batch doubles until torch.OutOfMemoryError.

case_oom_cap() {
    local n=oom-cap cap=4294967296 res
    time_for 40 $n || return 0
    CASE_ENV=()
    vrun $n 150 --cap 4GiB -- "$PY" -u "$CASE_PY" batch
    ran $n || { peak_le $n $cap; return 0; }
    err_row $n OutOfMemoryError
    res=$(field max_memory_reserved)
    row $n "torch max_memory_reserved <= cap" "<= $cap" "$(bytes "$res")" "$(isnum "$res" && yn "res <= cap" || echo NO)" \
        "batch $(field failed_batch) failed, $(field last_ok_batch) was the last to fit"
    peak_le $n $cap
    oom_cause $n cap
    if ((HAVE_OOM)) && [ -z "${V[error]:-}" ]; then
        row $n "vramtrace oom: cap_bytes" "$cap" "${V[first_cap_bytes]:--}" "$([ "${V[first_cap_bytes]:-}" = $cap ] && echo yes || echo NO)" \
            "requested $(bytes "${V[first_requested_bytes]:-}"), job_live $(bytes "${V[first_job_live_bytes]:-}"); advice: ${V[first_advice]:-none}"
    else
        row $n "vramtrace oom: cap_bytes" "$cap" "-" "SKIP" "${V[error]:-no oom verb}"
    fi
}

# ---------------------------------------------------------------------------------------------------------------
# i. nvml-cap: --cap 4GiB, 256 MiB held through cuMemAlloc_v2 (ctypes): pynvml's nvmlDeviceGetMemoryInfo (v1 and v2)
#    report the capped device, as cuMemGetInfo_v2 does. Before the driver is initialised NVML's own figures stand.

NVML_MIB=256

# nvml_v2_rows NAME TOTAL FREE RESERVED USED: the v2 rows, or one SKIP row when pynvml has no v2.
nvml_v2_rows() {
    local n=$1 t=$2 f=$3 rs=$4 u=$5 gt gf gr gu
    if [ "$(field has_v2)" != 1 ]; then
        row $n "pynvml v2 (nvmlMemory_v2)" "-" "-" "SKIP" "this pynvml has no nvmlMemory_v2${C_NOTE:+; $C_NOTE}$(field v2_error | sed 's/^/; error /')"
        return
    fi
    gt=$(field v2_total) gf=$(field v2_free) gr=$(field v2_reserved) gu=$(field v2_used)
    row $n "pynvml v2 total" "$(bytes "$t")" "$(bytes "$gt")" "$([ "$gt" = "$t" ] && echo yes || echo NO)" "nvmlDeviceGetMemoryInfo_v2"
    row $n "pynvml v2 reserved + used + free = total" "$(bytes "$gt")" "$(bytes $((gr + gu + gf)))" "$(isnum "$gr" && yn "gr + gu + gf == gt" || echo NO)" \
        "reserved $(bytes "$gr"), used $(bytes "$gu"), free $(bytes "$gf")"
    if [ -n "$f" ]; then
        row $n "pynvml v2 free, used" "$(bytes "$f"), $(bytes "$u")" "$(bytes "$gf"), $(bytes "$gu")" \
            "$([ "$gf" = "$f" ] && [ "$gu" = "$u" ] && echo yes || echo NO)" "reserved $(bytes "$gr") (expected $(bytes "$rs"))"
    fi
}

case_nvml_cap() {
    local n=nvml-cap cap=4294967296 a t f u pre smi
    time_for 30 $n || return 0
    CASE_ENV=()
    vrun $n 90 --cap 4GiB -- "$PY" -u "$CASE_PY" nvml $NVML_MIB
    ran $n || return 0
    a=$((NVML_MIB * MIB))
    t=$(field v1_total) f=$(field v1_free) u=$(field v1_used)
    row $n "pynvml nvmlDeviceGetMemoryInfo total" "$(bytes $cap)" "$(bytes "$t")" "$([ "$t" = $cap ] && echo yes || echo NO)" \
        "CUDA device 0 = NVML index $(field nvml_index) of $(field nvml_devices) ($(field uuid))"
    row $n "pynvml v1 free" "$(bytes $((cap - a)))" "$(bytes "$f")" "$([ "$f" = $((cap - a)) ] && echo yes || echo NO)" "cap - the job's $NVML_MIB MiB"
    row $n "pynvml v1 used" "$(bytes $a)" "$(bytes "$u")" "$([ "$u" = $a ] && echo yes || echo NO)" "total - free"
    row $n "cuMemGetInfo_v2 (free, total) = pynvml's" "$(field v1_free), $(field v1_total)" "$(field cu_free), $(field cu_total)" \
        "$([ "$(field cu_free)" = "$f" ] && [ "$(field cu_total)" = "$t" ] && echo yes || echo NO)" "rc $(field cu_rc)"
    nvml_v2_rows $n $cap $((cap - a)) 0 $a
    pre=$(field pre_total) smi=$(field smi_total_mib)
    row $n "pynvml total before cuInit (NVML's own)" "physical ($smi MiB, nvidia-smi)" "$(bytes "$pre")" \
        "$(isnum "$pre" && isnum "$smi" && yn "pre / $MIB == smi || (pre + $MIB - 1) / $MIB == smi" || echo NO)" \
        "documented: before the driver is initialised no GPU is known as a CUDA device"
}

# ---------------------------------------------------------------------------------------------------------------
# j. nvml-nocap: no cap, 256 MiB held: pynvml's figures are NVML's, equal to nvidia-smi's (run outside the job).

case_nvml_nocap() {
    local n=nvml-nocap t f u pre st sr su sf gr gu d
    time_for 30 $n || return 0
    CASE_ENV=()
    vrun $n 90 -- "$PY" -u "$CASE_PY" nvml $NVML_MIB
    ran $n || return 0
    t=$(field v1_total) f=$(field v1_free) u=$(field v1_used) pre=$(field pre_total)
    st=$(field smi_total_mib) sr=$(field smi_reserved_mib) su=$(field smi_used_mib) sf=$(field smi_free_mib)
    row $n "pynvml total = nvidia-smi memory.total" "$st MiB" "$(bytes "$t")" \
        "$(isnum "$t" && isnum "$st" && yn "t / $MIB == st || (t + $MIB - 1) / $MIB == st" || echo NO)" "before cuInit $(bytes "$pre")"
    row $n "pynvml total unchanged by cuInit" "$(bytes "$pre")" "$(bytes "$t")" "$([ "$t" = "$pre" ] && echo yes || echo NO)" ""
    if isnum "$sf" && isnum "$f"; then
        d=$((f / MIB - sf))
        row $n "pynvml v1 free ~ nvidia-smi memory.free" "$sf MiB" "$((f / MIB)) MiB" "$( ((d == 0)) && echo yes || { ((${d#-} <= 16)) && echo close || echo NO; })" \
            "queried a moment apart (tolerance 16 MiB); v1 used $(bytes "$u")"
    else
        row $n "pynvml v1 free ~ nvidia-smi memory.free" "${sf:--}" "$(bytes "$f")" "NO" "no nvidia-smi figure"
    fi
    if [ "$(field has_v2)" = 1 ]; then
        gr=$(field v2_reserved) gu=$(field v2_used)
        if isnum "$sr"; then
            row $n "pynvml v2 reserved = nvidia-smi memory.reserved" "$sr MiB" "$(bytes "$gr")" \
                "$(isnum "$gr" && yn "gr / $MIB == sr || (gr + $MIB - 1) / $MIB == sr" || echo NO)" ""
        fi
        if isnum "$su" && isnum "$gu"; then
            d=$((gu / MIB - su))
            row $n "pynvml v2 used ~ nvidia-smi memory.used" "$su MiB" "$((gu / MIB)) MiB" "$( ((d == 0)) && echo yes || { ((${d#-} <= 16)) && echo close || echo NO; })" \
                "tolerance 16 MiB; includes the job's $NVML_MIB MiB and its context"
        fi
    else
        row $n "pynvml v2" "-" "-" "SKIP" "this pynvml has no nvmlMemory_v2"
    fi
}

# ---------------------------------------------------------------------------------------------------------------
# g. oom-external: a process outside the job holds 90% of the GPU; the job (no cap) takes 2 GiB tensors until OOM.

case_oom_external() {
    local n=oom-external ready="$WORK/hog.ready" i hb
    time_for 70 $n || return 0
    rm -f "$ready"
    log ""
    log "=== $n: hog outside the job: $PY -u $CASE_PY hog $ready 0.9"
    VT_CHECK_TAG="$TAG-hog" timeout -k 5 "$(tmo 240)" "$PY" -u "$CASE_PY" hog "$ready" 0.9 >"$WORK/hog.out" 2>&1 </dev/null &
    HOG_PID=$!
    for i in $(seq 1 180); do
        [ -s "$ready" ] && break
        kill -0 "$HOG_PID" 2>/dev/null || break
        sleep 0.5
    done
    cat "$WORK/hog.out" >>"$LOG"
    if [ ! -s "$ready" ]; then
        row $n "hog outside the job holds 90%" "ready" "not ready" "NO" "hog: $(last_error "$WORK/hog.out")"
        kill_hog
        return 0
    fi
    hb=$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' "$ready")
    say "$n: hog ready: $(cat "$ready")"
    CASE_ENV=()
    vrun $n 150 -- "$PY" -u "$CASE_PY" pressure 2048
    kill_hog
    row $n "hog outside the job" "~90% of the GPU" "$(bytes "$hb")" "$(isnum "$hb" && yn "hb > 0" || echo NO)" "$(cut -c1-100 "$ready")"
    ran $n || return 0
    err_row $n OutOfMemoryError
    row $n "trace: OOM records (kind 7)" ">= 1" "${T[oom_records]:--}" "$(isnum "${T[oom_records]:-}" && yn "${T[oom_records]} >= 1" || echo NO)" \
        "job held $(field tensors) x 2 GiB; driver free at the OOM $(bytes "${T[first_device_free_bytes]:-}"); torch reserved $(bytes "$(field reserved_at_oom)")"
    oom_cause $n external
}

# ---------------------------------------------------------------------------------------------------------------
# h. oom-killed: no cap, OOM, then SIGKILL right after catching it: the OOM must be in the trace.

case_oom_killed() {
    local n=oom-killed
    time_for 60 $n || return 0
    CASE_ENV=()
    vrun $n 180 -- "$PY" -u "$CASE_PY" killed 4096
    row $n "vramtrace run exit code" "137 (SIGKILL)" "$C_RC" "$([ "$C_RC" = 137 ] && ((!C_TIMEDOUT)) && echo yes || echo NO)" \
        "$(grep -m1 '^OOM caught' "$C_OUT" | cut -c1-80)$( ((C_TIMEDOUT)) && echo "; TIMED OUT")"
    row $n "trace: OOM records (kind 7)" ">= 1" "${T[oom_records]:--}" "$(isnum "${T[oom_records]:-}" && yn "${T[oom_records]} >= 1" || echo NO)" \
        "PyTorch retries once after emptying its cache: 2 driver OOMs per torch OOM; process ended ${R[ended]:--}; ${C_NOTE:-trace read}"
    if ((HAVE_OOM)) && [ -z "${V[error]:-}" ]; then
        row $n "vramtrace oom --json: OOMs" ">= 1" "${V[n]:-0}" "$( [ "${V[n]:-0}" -ge 1 ] 2>/dev/null && echo yes || echo NO)" "causes ${V[causes]:-none}"
    else
        row $n "vramtrace oom --json: OOMs" ">= 1" "-" "SKIP" "${V[error]:-no oom verb}"
    fi
}

if have torch; then
    case_cap_torch
fi
if have jax; then
    case_cap_jax
else
    row cap-jax "jax importable" "yes" "no" "SKIP" "$(echo "$VERSIONS" | grep '^jax ' | cut -c1-100)"
fi
case_nvml_cap
case_nvml_nocap
if have torch; then
    case_two_procs
    case_cap_warn
    case_oom_cap
    case_oom_pressure
    case_oom_killed
    case_oom_external
fi

finish
exit 0

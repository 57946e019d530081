#!/usr/bin/env bash
# The Python bridge on a real GPU (issue 8): each case of bridge_case.py under `DIR/vramtrace run`, then
# `vramtrace oom --json` / `report --json`, compared with PyTorch's own figures. Prints a table LAST; traces and
# JSON go to $OUT/bridge-traces.tgz, the log to $OUT/bridge-log.txt.
#   Usage: bash scripts/gpu/bridge.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-bridge-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-bridge.XXXX)
LOG=$OUT/bridge-log.txt
: >"$LOG"
CASE=$(pwd)/scripts/gpu/bridge_case.py
HERE_DIR=$(pwd)/scripts/gpu
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
cd "$W" || exit 0
TABLE=()
row() { TABLE+=("| $1 | $2 | $3 | $4 |"); }
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {'d': d}))" "$@" 2>>"$LOG"; }
res() { grep -o "$2=[^ ]*" "$1" | head -1 | cut -d= -f2; }

run_case() { # NAME TIMEOUT VT_ARGS... -- (the case name is the bridge_case argument)
    local name=$1 t=$2; shift 2
    echo "=== $name: $VT run $* -- python3 $CASE $name" >>"$LOG"
    timeout "$t" "$VT" run -o "$name.vtrace" --force "$@" -- python3 "$CASE" "$name" >"$name.out" 2>&1
    echo "rc=$?" >>"$name.out"
    cat "$name.out" >>"$LOG"
    "$VT" oom --json "$name.vtrace" >"$name.oom.json" 2>>"$LOG"
    "$VT" oom "$name.vtrace" >"$name.oom.txt" 2>>"$LOG"
    "$VT" report --json "$name.vtrace" >"$name.report.json" 2>>"$LOG"
    "$VT" report "$name.vtrace" >"$name.report.txt" 2>>"$LOG"
    cat "$name.oom.txt" >>"$LOG"
}

if [ -n "${SAMPLER_ONLY:-}" ]; then
    timeout 200 "$VT" run -q -o sampler.vtrace --force -- python3 "$CASE" sampler >sampler.out 2>&1
    cat sampler.out
    exit 0
fi

# (a) cache fragmentation
run_case frag 180
O="d['ooms'][0]"
got=$(field frag.oom.json "($O['cause'], $O['framework']['allocated_bytes'], $O['framework']['reserved_bytes'], $O['framework']['inactive_split_bytes'], $O['framework']['largest_free_block_bytes'], $O['framework']['alloc_retries'])")
want="('fragmentation_cache', $(res frag.out allocated), $(res frag.out reserved), $(res frag.out inactive_split), $(res frag.out largest_free), $(res frag.out retries))"
row "(a) frag: cause, allocated, reserved, inactive split, largest free, retries" "$want" "$got" "$([ "$got" = "$want" ] && echo yes || echo NO)"

# (b) kept outputs under a cap, with the allocation history
run_case keep 240 --cap 6GiB --torch-history=20000
got=$(field keep.oom.json "($O['cause'], [f['kind'] for f in $O['findings'] if 'leak' in f['kind']], ($O['framework'].get('kept') or [{}])[0].get('label'))")
keep_line=$(grep -n "out = model(x)  # the line whose tensors are kept" "$CASE" | cut -d: -f1)
# The cause is the growth (docs/OOM.md: the growth rule comes before the cap's: a job that keeps every step's
# output fails under any cap, and raising it only moves the failure).
row "(b) keep: cause, leak findings, top kept line" "growth; allocated_leak_trend; bridge_case.py:$keep_line (out = model(x))" "$got" "$(echo "$got" | grep -q "'growth'" && echo "$got" | grep -q "allocated_leak_trend" && echo "$got" | grep -q "bridge_case.py:$keep_line in" && echo yes || echo NO)"
ls -la keep.vtrace* >>"$LOG" 2>&1

# (c) OOM on autograd's backward thread
run_case backward 180 --cap 3584MiB
got=$(field backward.oom.json "($O['framework']['thread'], [f['kind'] for f in $O['findings'] if f['kind']=='backward_thread'], $O.get('request_site'))")
row "(c) backward: thread, finding, request site" "pt_autograd_0; backward_thread; autograd node" "$got" "$(echo "$got" | grep -q "pt_autograd" && echo "$got" | grep -q "backward_thread" && echo "$got" | grep -q "Backward" && echo yes || echo NO)"

# request larger than the device
run_case huge 120
got=$(field huge.oom.json "($O['cause'], $O['requested_bytes'])")
row "huge: cause, requested" "('request_too_large', $((1 << 40)))" "$got" "$([ "$got" = "('request_too_large', $((1 << 40)))" ] && echo yes || echo NO)"

# JAX: XLA's figures through the bridge
run_case jax 180
got=$("$VT" report --json jax.vtrace | python3 -c "import json,sys; d=json.load(sys.stdin); print([f['last']['allocated_bytes'] for p in d['processes'] for f in p['framework'] if f['framework']=='jax'])" 2>>"$LOG")
row "jax: bytes_in_use at the end" "[$(res jax.out bytes_in_use)]" "$got" "$([ "$got" = "[$(res jax.out bytes_in_use)]" ] && echo yes || echo NO)"

# Issue 9 today: fork children ending in os._exit, and a process that os._exits right after allocating
run_case forked 240
kids=$(res forked.out pids)
n=0; for k in ${kids//,/ }; do "$VT" report --json forked.vtrace | python3 -c "
import json,sys; d=json.load(sys.stdin)
print(sum(1 for p in d['processes'] if p['pid']==$k and p['allocations']>0))" 2>>"$LOG" | grep -q 1 && n=$((n+1)); done
row "forked: children whose allocations are in the trace" "3 of 3" "$n of 3" "$([ "$n" = 3 ] && echo yes || echo NO)"
run_case osexit 120
p=$(res osexit.out pid)
got=$("$VT" report --json osexit.vtrace | python3 -c "
import json,sys; d=json.load(sys.stdin)
print(max([p['peak_bytes'] for p in d['processes'] if p['pid']==$p] or [0]))" 2>>"$LOG")
row "osexit: the 256 MiB allocation in the trace" ">= 268435456" "$got" "$(python3 -c "print('yes' if int('${got:-0}') >= 268435456 else 'NO')" 2>/dev/null)"

# (e) overhead: the bridge on (default) against off, and --torch-history, interleaved 3 times each
for i in 1 2 3; do
    for mode in off on hist; do
        case $mode in off) a=(--python-agent off);; on) a=();; hist) a=(--torch-history);; esac
        STEPS=80 timeout 120 "$VT" run -q -o step-$mode.vtrace --force "${a[@]}" -- python3 "$CASE" step >step-$mode-$i.out 2>&1
        echo "step $mode $i $(res step-$mode-$i.out median_ms)" >>"$LOG"
    done
done
med() { for i in 1 2 3; do res step-$1-$i.out median_ms; done | sort -n | sed -n 2p; }
off=$(med off); on=$(med on); hist=$(med hist)
pct() { python3 -c "print('%+.2f%%' % ((float('$1') / float('$2') - 1) * 100))" 2>/dev/null; }
row "(e) step median ms: off / on / history" "on <= off + 0.5%" "$off / $on / $hist ($(pct "$on" "$off"), history $(pct "$hist" "$off"))" "$(python3 -c "print('yes' if float('$on') <= float('$off') * 1.005 else 'NO')" 2>/dev/null)"
samples=$(field step-on.report.json "1" >/dev/null; "$VT" report --json step-on.vtrace | python3 -c "import json,sys; d=json.load(sys.stdin); print([(x['device'], (x.get('framework') or {}).get('peak_allocated_bytes')) for x in d['devices']])" 2>>"$LOG")
echo "step-on devices framework peaks: $samples" >>"$LOG"

# (e) the same, inside one process: the sampler running against paused, interleaved
timeout 200 "$VT" run -q -o sampler.vtrace --force -- python3 "$CASE" sampler >sampler.out 2>&1
cat sampler.out >>"$LOG"
row "(e) one process, sampler on vs paused: step ms, cost of one sample" "on <= paused + 0.5%" "$(res sampler.out on_ms) / $(res sampler.out off_ms) ($(res sampler.out pct)%); one sample $(res sampler.out sample_us) us every $(res sampler.out interval_ms) ms" "$(python3 -c "print('yes' if float('$(res sampler.out pct)') <= 0.5 else 'NO')" 2>/dev/null)"

tar czf "$OUT/bridge-traces.tgz" ./*.vtrace ./*.json ./*.txt ./*.out ./*.pickle 2>/dev/null
echo
echo "| case | expected (PyTorch's own) | vramtrace | match |"
echo "|---|---|---|---|"
printf '%s\n' "${TABLE[@]}"

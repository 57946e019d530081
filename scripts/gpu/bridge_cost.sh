#!/usr/bin/env bash
# Issue 49: what the Python bridge costs a program per iteration. scripts/gpu/bridge_cost_case.py times small loops,
# each counted by one of the bridge's hooks (outermost no_grad / inference_mode entries, the optimizer's step hook,
# DataLoader batches), plus one realistic step, in processes run bare, under `vramtrace run` (defaults: the bridge
# on) and under `vramtrace run --python-agent off` (the shim alone). Each round runs bare, on, off, off, on, bare
# (ABBA, so a drift in time falls on every configuration alike); rounds repeat while STOP seconds have not passed
# (a round starts only if the last one's length still fits). Two warm-up processes first, not counted.
#   Usage: bash scripts/gpu/bridge_cost.sh DIR     (DIR: vramtrace and libvramtrace.so, e.g. .gpu)
#   env: STOP (default 120 s), ROUNDS (most rounds, default 4), WARM, RUN (seconds a case warms up / is timed;
#        0.1, 0.35), CASES (default with,deco,inf,with_async,big,loader,train)
# Prints the per-run medians, then the table (median over runs of each run's median us per iteration; the
# bridge's added us = on - off) last; $OUT gets bridge_cost.tsv, bridge_cost.txt and report_on.txt.
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-bridge-cost-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-bridge-cost.XXXX)
STOP=${STOP:-120}
ROUNDS=${ROUNDS:-4}
WARM=${WARM:-0.1}
RUN=${RUN:-0.35}
CASES=${CASES:-with,deco,inf,with_async,big,loader,train}
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING
TSV=$OUT/bridge_cost.tsv
: >"$TSV"
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    "$DIR/vramtrace" --version
    nproc
} 2>&1 | tee "$OUT/bridge_cost.txt"

one() { # one CFG ROUND POS: a process of the case script under CFG; a line per case into $TSV
    local cfg=$1 r=$2 pos=$3 t0 t1 out
    t0=$(date +%s.%N)
    case $cfg in
    bare) out=$(python3 "$HERE/bridge_cost_case.py" "$CASES" "$WARM" "$RUN" 2>>"$W/err") ;;
    on) out=$("$DIR/vramtrace" run -q --force -o "$W/on.vtrace" -- \
        python3 "$HERE/bridge_cost_case.py" "$CASES" "$WARM" "$RUN" 2>>"$W/err") ;;
    off) out=$("$DIR/vramtrace" run -q --force -o "$W/off.vtrace" --python-agent off -- \
        python3 "$HERE/bridge_cost_case.py" "$CASES" "$WARM" "$RUN" 2>>"$W/err") ;;
    esac
    t1=$(date +%s.%N)
    echo "$out" | tail -1 | python3 -c '
import json, sys
cfg, r, pos, wall = sys.argv[1:5]
try:
    d = json.loads(sys.stdin.read())
except Exception:
    print(f"{r}\t{pos}\t{cfg}\tERROR\tnan\tnan\tnan\t0\t{wall}\t-")
    sys.exit()
h = json.dumps(d["hooks"], separators=(",", ":"))
for c, m in d["cases"].items():
    fields = [r, pos, cfg, c] + ["%.3f" % m[k] for k in ("med", "p10", "p90")] + [m["n"], wall, h]
    print("\t".join(str(f) for f in fields))
' "$cfg" "$r" "$pos" "$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")" >>"$TSV"
    echo "[$SECONDS s] round $r pos $pos $cfg: $(tail -1 "$TSV" | cut -f9) s, $(grep -c "^$r	$pos	" "$TSV") cases"
}

# Warm-up (file caches, the driver's first start, the trace's first write): not counted.
CASES=with WARM=0.05 RUN=0.05 one bare 0 0 >/dev/null
CASES=with WARM=0.05 RUN=0.05 one on 0 1 >/dev/null
: >"$TSV"
echo "[$SECONDS s] warm-up done"

last=60
for r in $(seq "$ROUNDS"); do
    if ((r > 1 && SECONDS + last > STOP)); then
        echo "[$SECONDS s] round $r not started (last took $last s, STOP $STOP)"
        break
    fi
    s0=$SECONDS
    pos=0
    for cfg in bare on off off on bare; do
        one "$cfg" "$r" "$pos"
        pos=$((pos + 1))
    done
    last=$((SECONDS - s0))
done
"$DIR/vramtrace" report "$W/on.vtrace" >"$OUT/report_on.txt" 2>&1 || true
tail -20 "$W/err" >"$OUT/bridge_cost_err.txt"

python3 - "$TSV" <<'PY' | tee -a "$OUT/bridge_cost.txt"
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
med = collections.defaultdict(list)  # (case, cfg) -> run medians
byround = collections.defaultdict(list)  # (case, cfg, round) -> run medians
walls = collections.defaultdict(dict)  # cfg -> (round, pos) -> process seconds
hooks = {}
for r, pos, cfg, case, m, p10, p90, n, wall, h in rows:
    walls[cfg][(r, pos)] = float(wall)
    hooks[cfg] = h
    if case == "ERROR":
        continue
    med[(case, cfg)].append(float(m))
    byround[(case, cfg, r)].append(float(m))
print("\n## per run: case, configuration: median us per iteration of each run (in order)")
cases = list(dict.fromkeys(c for c, _ in med))
for c in cases:
    for cfg in ("bare", "on", "off"):
        print(f"{c:10s} {cfg:4s} " + " ".join(f"{x:.2f}" for x in med[(c, cfg)]))
print("\nhooks seen at the end of a process:", {k: v for k, v in hooks.items()})
print("process wall s (median; runs):", {k: (round(statistics.median(v.values()), 2), len(v)) for k, v in walls.items()})
rounds = sorted({r for _, _, r in byround})
print(f"\n## median over runs of each run's median us per iteration ({len(rounds)} rounds of bare on off off on bare)")
print("| case | bare | bridge off | bridge on | on / off | on / bare | added by the bridge (on - off), us; each round |")
print("|---|---|---|---|---|---|---|")
for c in cases:
    b, off, on = (statistics.median(med[(c, k)]) for k in ("bare", "off", "on"))
    per = []
    for r in rounds:
        x, y = byround.get((c, "on", r)), byround.get((c, "off", r))
        if x and y:
            per.append(statistics.mean(x) - statistics.mean(y))
    print(f"| {c} | {b:.2f} | {off:.2f} | {on:.2f} | {on / off:.3f} | {on / b:.3f} | {on - off:+.2f} "
          f"({' '.join(f'{d:+.2f}' for d in per)}) |")
PY
rm -rf "$W"
ls -la "$OUT"

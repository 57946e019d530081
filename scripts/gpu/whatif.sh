#!/usr/bin/env bash
# Issue 28 on a real GPU: is `vramtrace whatif` right? For each workload of whatif_case.py (training, fine-tuning
# with varying lengths, serving with a growing KV cache, a fragmenting loop):
#   1. one run under vramtrace with the defaults and the whole history kept (--torch-history);
#   2. the same workload run bare under each other setting: PyTorch's own max_memory_reserved();
#   3. `vramtrace whatif` on run 1's trace: the model's reserve peak for each setting, compared with 2;
#   4. a cap between the allocated peak and what the defaults need: the predicted first failure (step and line)
#      against a real capped run's, and the predicted best setting run under that cap.
# Prints a table per workload; JSON, traces and logs go to $OUT/whatif/ (small ones: fixtures for CI).
#   Usage: bash scripts/gpu/whatif.sh DIR        (DIR: the carried build: vramtrace, libvramtrace.so)
#   CASES="train frag" picks workloads; SETTINGS="..." the settings run for real (comma-free list, space-split).
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-whatif-out}
mkdir -p "$OUT/whatif"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
CASES=${CASES:-train finetune serve frag}
SETTINGS=${SETTINGS:-expandable_segments:True max_split_size_mb:256 roundup_power2_divisions:4 backend:cudaMallocAsync}
W=$OUT/whatif
LOG=$W/log.txt
: >"$LOG"
for c in $CASES; do
    echo "=== $c" | tee -a "$LOG"
    "$VT" run -q --force --torch-history 4000000 -o "$W/$c.vtrace" -- python3 "$CASE" "$c" >"$W/$c.defaults.out" 2>>"$LOG"
    tail -1 "$W/$c.defaults.out" >"$W/$c.defaults.json"
    confs=()
    for s in $SETTINGS; do
        PYTORCH_CUDA_ALLOC_CONF=$s python3 "$CASE" "$c" 2>>"$LOG" | tail -1 >"$W/$c.$s.json"
        confs+=(--alloc-conf "$s")
    done
    "$VT" whatif --json "${confs[@]}" "$W/$c.vtrace" >"$W/$c.whatif.json" 2>>"$LOG"
    # A cap from the model's own figures (the grid): between what the setting that needs least needs and what
    # the defaults need, so the defaults fail and that setting should fit; if no setting needs 1% less, between
    # the allocated peak and what the defaults need.
    "$VT" whatif --json "$W/$c.vtrace" >"$W/$c.whatif-grid.json" 2>>"$LOG"
    cap=$(python3 -c "
import json; t = json.load(open('$W/$c.whatif-grid.json'))['traces'][0]
run = t['configs'][0]['smallest_cap']
best = min(x['smallest_cap'] for x in t['configs'] if not x['approximate'])
d = t['configs'][0]['devices'][0]
print((best + run) // 2 if best < run * 0.99 else (d['allocated_peak'] + run) // 2)" 2>>"$LOG")
    echo "$cap" >"$W/$c.cap"
    "$VT" whatif --json --cap "$cap" "$W/$c.vtrace" >"$W/$c.whatif-cap.json" 2>>"$LOG"
    "$VT" run -q --force --cap "$cap" --torch-history off -o "$W/$c.capped.vtrace" -- python3 "$CASE" "$c" 2>>"$LOG" |
        tail -1 >"$W/$c.capped.json"
    best=$(python3 -c "
import json; t = json.load(open('$W/$c.whatif-cap.json'))['traces'][0]
b = t['best']
print(b['conf'] if b and next(x for x in t['configs'] if x['conf'] == b['conf'] and x['label'] == b['label'])['fits'] else '')" 2>>"$LOG")
    if [ -n "$best" ]; then
        PYTORCH_CUDA_ALLOC_CONF=$best "$VT" run -q --force --cap "$cap" --torch-history off -o "$W/$c.best.vtrace" -- \
            python3 "$CASE" "$c" 2>>"$LOG" | tail -1 >"$W/$c.best.json"
    fi
    python3 - "$W" "$c" "$SETTINGS" "$best" <<'PY' | tee -a "$W/results.md"
import json, os, re, sys
w, c, settings, best = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
load = lambda n: json.load(open(os.path.join(w, n)))
wi = load(f"{c}.whatif.json")["traces"][0]
h = wi["histories"][0]
real_def = load(f"{c}.defaults.json")
GiB = 1 << 30
print(f"\n### {c}: {h['entries']} history entries, complete {h['complete']}")
print("| settings | PyTorch max_memory_reserved | model | error |")
print("|---|---|---|---|")
rows = [("as run (defaults)", real_def["max_reserved"], wi["configs"][0]["processes"][0]["reserved_peak"])]
for s in settings:
    cfg = next((x for x in wi["configs"] if x["conf"] == s), None)
    try:
        real = load(f"{c}.{s}.json")["max_reserved"]
    except Exception:
        real = None
    rows.append((s, real, cfg["processes"][0]["reserved_peak"] if cfg else None))
worst = 0.0
for name, real, model in rows:
    if real and model is not None:
        e = (model - real) / real * 100
        if "cudaMallocAsync" not in name:
            worst = max(worst, abs(e))
        print(f"| {name} | {real / GiB:.3f} GiB | {model / GiB:.3f} GiB | {e:+.2f}% |")
    else:
        print(f"| {name} | {real} | {model} | - |")
print(f"\nworst error (native settings): {worst:.2f}% -> {'within 1%' if worst <= 1 else 'NOT within 1%'}")
cap = int(open(os.path.join(w, f"{c}.cap")).read())
wc = load(f"{c}.whatif-cap.json")["traces"][0]
f = wc["configs"][0]["first_failure"]
steps = real_def["steps_us"]
def step_of(t):
    k = -1
    for i, s in enumerate(steps):
        if s <= t:
            k = i
    return k
def tried(size):
    # PyTorch's message names the segment it asked for (its format_size).
    seg = 2 << 20 if size <= 1 << 20 else 20 << 20 if size < 10 << 20 else -(-size // (2 << 20)) * (2 << 20)
    return f"{seg / (1 << 30):.2f} GiB" if seg >= 1 << 30 else f"{seg / (1 << 20):.2f} MiB"
pred = None
if f:
    line = re.search(r":(\d+) in ", f["site"] or "")
    pred = (step_of(f["time_unix_us"]), int(line.group(1)) if line else None, tried(f["size"]))
try:
    real_cap = load(f"{c}.capped.json")
    o = real_cap.get("oom")
    got = (o["step"], o["line"], o.get("tried")) if o else None
except Exception:
    got = "no result"
# A request with no Python frames (autograd's backward thread) has no line in the history: step and size decide.
same = pred == got or (pred and got and pred[1] is None and (pred[0], pred[2]) == (got[0], got[2]))
print(f"\ncap {cap / GiB:.3f} GiB: predicted first failure (step, line, request) {pred}; real capped run {got} -> "
      f"{'same' if same else 'DIFFERENT'}")
if best:
    try:
        rb = load(f"{c}.best.json")
        print(f"predicted to fit the cap and to need least: {best}; run under the cap: "
              f"{'out of memory at ' + str(rb['oom']) if rb.get('oom') else 'fits'} (max_reserved {rb['max_reserved'] / GiB:.3f} GiB)")
    except Exception as e:
        print(f"predicted best {best}: no result ({e})")
# The real ranking of the settings run, against the model's.
real = {"defaults": real_def["max_reserved"]}
for s in settings:
    try:
        real[s] = load(f"{c}.{s}.json")["max_reserved"]
    except Exception:
        pass
mdl = {"defaults": wi["configs"][0]["processes"][0]["reserved_peak"]}
for x in wi["configs"][1:]:
    if x["conf"] in real and "cudaMallocAsync" not in x["conf"]:
        mdl[x["conf"]] = x["processes"][0]["reserved_peak"]
native = [k for k in real if "cudaMallocAsync" not in k]
rb, mb = min(native, key=lambda k: real[k]), min(mdl, key=lambda k: mdl[k])
print(f"lowest reserve among native settings: real {rb}, model {mb} -> {'same' if rb == mb or real[rb] == real[mb] else 'DIFFERENT'}")
PY
done
ls -la "$W" >>"$LOG"
# What comes back: the tables, the JSON, and the small traces with their histories (fixtures for CI).
tar czf "$OUT/whatif.tgz" -C "$W" --exclude='*.capped.vtrace' --exclude='*.best.vtrace' . 2>>"$LOG"
ls -la "$OUT/whatif.tgz"

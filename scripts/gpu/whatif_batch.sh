#!/usr/bin/env bash
# Issue 39 on a real GPU: is `vramtrace whatif --knob batch` right? For each workload of whatif_case.py with a
# batch (train: a transformer language model; conv: a small ResNet-like network; finetune: the language model with
# its sequence lengths varying step to step):
#   1. two short runs under vramtrace at batches A < B, each with its whole PyTorch history (--torch-history);
#   2. `whatif --knob batch` from those two: the reserved peak predicted at a batch between them (IN) and one past
#      them (OUT), under the defaults and under expandable_segments:True;
#   3. the same workload run bare at IN and OUT (and at OUT with expandable segments): PyTorch's own
#      max_memory_reserved(), against the prediction (within 3%?);
#   4. a cap halfway between the predicted peaks at IN and OUT: the predicted largest batch L under it, then L and
#      L+1 run under that cap (`vramtrace run --cap`): L should fit and L+1 fail.
# Prints a table per workload (and $OUT/whatif_batch/results.md); JSON, traces and logs go to $OUT/whatif_batch/;
# $OUT/whatif_batch.tgz holds the two runs' traces and gzipped histories per workload (fixtures for CI) and the
# results (gpu_results.json).
#   Usage: bash scripts/gpu/whatif_batch.sh DIR     (DIR: the carried build: vramtrace, libvramtrace.so)
#   CASES="train conv" picks workloads (the unseen ones too: padded, convamp, ckpt; whatif_case.py says what
#   they are); STEPS=N the steps a run takes (default 6). About 2 minutes a workload on
#   an H100 (ten short runs of a few seconds each, most of it Python's and CUDA's start).
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-whatif-batch-out}
W=$OUT/whatif_batch
mkdir -p "$W"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
CASES=${CASES:-train conv finetune}
STEPS=${STEPS:-6}
LOG=$W/log.txt
: >"$LOG"
: >"$W/results.md"
ES=expandable_segments:True
# Per workload: the two runs' batches, one untried between them and one past them.
batches() {
    case $1 in
    train) echo "4 8 6 12" ;;
    conv) echo "16 32 24 48" ;;
    finetune) echo "4 8 6 12" ;;
    padded) echo "4 8 6 12" ;;
    convamp) echo "16 32 24 48" ;;
    ckpt) echo "8 16 12 24" ;;
    esac
}
bare() { # CASE BATCH NAME [CONF]: a bare run's last line (PyTorch's own figures) to $W/NAME.json
    PYTORCH_CUDA_ALLOC_CONF=${4:-} timeout 300 python3 "$CASE" "$1" --batch "$2" --steps "$STEPS" 2>>"$LOG" |
        tail -1 >"$W/$3.json"
}
for c in $CASES; do
    read -r A B IN OUTB <<<"$(batches "$c")"
    echo "=== $c: runs at $A and $B, predicted at $IN and $OUTB" | tee -a "$LOG"
    for b in $A $B; do
        timeout 300 "$VT" run -q --force --torch-history 4000000 -o "$W/$c.b$b.vtrace" -- \
            python3 "$CASE" "$c" --batch "$b" --steps "$STEPS" 2>>"$LOG" | tail -1 >"$W/$c.b$b.json"
    done
    "$VT" whatif --json --knob batch --alloc-conf "$ES" --at "$IN" --at "$OUTB" \
        "$W/$c.b$A.vtrace=$A" "$W/$c.b$B.vtrace=$B" >"$W/$c.predict.json" 2>>"$LOG"
    echo "whatif --knob exit $?" >>"$LOG"
    bare "$c" "$IN" "$c.bare$IN"
    bare "$c" "$OUTB" "$c.bare$OUTB"
    bare "$c" "$OUTB" "$c.bare$OUTB.es" "$ES"
    # The cap: halfway between the job's predicted peaks at IN and OUT (as run), so the largest batch lies
    # between them.
    cap=$(python3 -c "
import json; t = json.load(open('$W/$c.predict.json'))
at = t['configs'][0]['at']
print((at[0]['predicted']['peak'] + at[1]['predicted']['peak']) // 2)" 2>>"$LOG")
    echo "${cap:-0}" >"$W/$c.cap"
    "$VT" whatif --json --knob batch --alloc-conf "$ES" --cap "${cap:-0}" \
        "$W/$c.b$A.vtrace=$A" "$W/$c.b$B.vtrace=$B" >"$W/$c.largest.json" 2>>"$LOG"
    L=$(python3 -c "
import json; l = json.load(open('$W/$c.largest.json'))['configs'][0]['largest']
print(l['value'] or 0)" 2>>"$LOG")
    L=${L:-0}
    echo "$L" >"$W/$c.L"
    for b in $L $((L + 1)); do
        [ "$b" -gt 0 ] || continue
        timeout 300 "$VT" run -q --force --cap "${cap:-0}" --torch-history off -o "$W/$c.capped$b.vtrace" -- \
            python3 "$CASE" "$c" --batch "$b" --steps "$STEPS" 2>>"$LOG" | tail -1 >"$W/$c.capped$b.json"
    done
    python3 - "$W" "$c" "$A" "$B" "$IN" "$OUTB" "$L" <<'PY' | tee -a "$W/results.md"
import json, os, sys
w, c = sys.argv[1], sys.argv[2]
A, B, IN, OUTB, L = (int(x) for x in sys.argv[3:])
GiB = 1 << 30
def load(n):
    try:
        return json.load(open(os.path.join(w, n)))
    except Exception as e:
        return {"error": str(e)}
p = load(f"{c}.predict.json")
res = {"case": c, "runs": [A, B], "rows": []}
print(f"\n### {c}: runs at batch {A} and {B}")
if "configs" not in p:
    print(f"whatif --knob gave no answer: {p.get('error')} (see log.txt)")
else:
    h = p["runs"][0]["histories"][0]
    print(f"{h['requests']} requests matched; setup {h['setup_requests']}, {h['steps']} steps of {h['step_requests']}; "
          f"fits: " + ", ".join(f"{f['shape']} {f['requests']} ({f['ambiguous']} ambiguous)" for f in p["fits"]))
    print("| batch | settings | PyTorch max_memory_reserved | predicted | range | error | within 3% |")
    print("|---|---|---|---|---|---|---|")
    es = next((x for x in p["configs"] if x["conf"] == "expandable_segments:True"), None)
    for i, (b, conf, cfg, real) in enumerate([
        (IN, "defaults", p["configs"][0], load(f"{c}.bare{IN}.json")),
        (OUTB, "defaults", p["configs"][0], load(f"{c}.bare{OUTB}.json")),
        (OUTB, "expandable_segments:True", es, load(f"{c}.bare{OUTB}.es.json")),
    ]):
        at = next((x for x in (cfg or {}).get("at", []) if x["value"] == b), None)
        pred = at["predicted"]["reserved_peaks"][0] if at else None
        alt = at["alternative"]["reserved_peaks"][0] if at and at["alternative"] else None
        rng = f"{min(pred, alt) / GiB:.3f}-{max(pred, alt) / GiB:.3f} GiB" if alt is not None else "-"
        got = real.get("max_reserved")
        if pred is not None and got and not real.get("oom"):
            e = (pred - got) / got * 100
            ok = abs(e) <= 3
            print(f"| {b} | {conf} | {got / GiB:.3f} GiB | {pred / GiB:.3f} GiB | {rng} | {e:+.2f}% | {'yes' if ok else 'NO'} |")
        else:
            e, ok = None, False
            print(f"| {b} | {conf} | {got} (oom {real.get('oom')}) | {pred} | {rng} | - | NO |")
        res["rows"].append({"batch": b, "conf": conf, "real": got, "predicted": pred, "alternative": alt,
                            "error_pct": e, "within_3pct": ok})
cap = int(open(os.path.join(w, f"{c}.cap")).read() or 0)
lg = load(f"{c}.largest.json")
res.update(cap=cap, largest=L)
if L > 0:
    fit, nxt = load(f"{c}.capped{L}.json"), load(f"{c}.capped{L + 1}.json")
    fits = "max_reserved" in fit and not fit.get("oom")
    fails = bool(nxt.get("oom"))
    print(f"\ncap {cap / GiB:.3f} GiB: predicted largest batch {L}; run at {L}: {'fits' if fits else 'FAILS ' + str(fit.get('oom'))}; "
          f"run at {L + 1}: {'fails at ' + str(nxt['oom']) if fails else 'FITS (prediction too low)'} -> "
          f"{'right' if fits and fails else 'WRONG'}")
    res.update(largest_fits=fits, next_fails=fails)
else:
    print(f"\ncap {cap / GiB:.3f} GiB: no largest batch predicted ({lg.get('error', 'nothing fits')})")
with open(os.path.join(w, f"{c}.result.json"), "w") as f:
    json.dump(res, f)
PY
done
python3 - "$W" "$CASES" <<'PY'
import json, os, sys
w = sys.argv[1]
out = {"date": __import__("time").strftime("%Y-%m-%d"), "cases": {}}
try:
    import torch
    out["gpu"] = torch.cuda.get_device_name(0)
    out["torch"] = torch.__version__
except Exception as e:
    out["gpu"] = f"unknown ({e})"
for c in sys.argv[2].split():
    try:
        out["cases"][c] = json.load(open(os.path.join(w, f"{c}.result.json")))
    except Exception as e:
        out["cases"][c] = {"error": str(e)}
json.dump(out, open(os.path.join(w, "gpu_results.json"), "w"), indent=1)
PY
# What comes back: the table, the JSON, and the two runs' traces per workload with their histories gzipped (the
# fixtures for CI: collector/tests/fixtures/whatif_batch/).
for p in "$W"/*.b*.vtrace.torch-*.pickle; do
    [ -f "$p" ] && gzip -9f "$p"
done
ls -la "$W" >>"$LOG"
tar czf "$OUT/whatif_batch.tgz" -C "$W" --exclude='*.capped*.vtrace' . 2>>"$LOG"
ls -la "$OUT/whatif_batch.tgz"

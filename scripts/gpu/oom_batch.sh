#!/usr/bin/env bash
# Issue 39 on a real GPU: does `vramtrace oom`'s advice name a batch that fits? For each workload of
# whatif_case.py with a batch (train: a transformer language model; finetune: the same with sequence lengths drawn
# per step; conv: a small ResNet-like network):
#   1. a run at a small batch A with its PyTorch history (no cap: it finishes);
#   2. a run at a large batch F under a cap, with its history: it runs out of memory;
#   3. `vramtrace oom` on the failed trace, which finds the run at A beside it (their commands differ only in
#      --batch): the largest batch L it advises, and the accumulation (k steps of m) that keeps F;
#   4. L, L+1 and m run under the same cap: L and m should fit, L+1 fail.
# Prints a table per workload (and $OUT/oom_batch/results.md); $OUT/oom_batch.tgz holds the two runs' traces and
# gzipped histories per workload (CI fixtures), the post-mortems and the results (gpu_results.json).
#   Usage: bash scripts/gpu/oom_batch.sh DIR    (DIR: the carried build)    CASES="train conv" picks workloads;
#   SMALL=N FAILED=M other batches than the defaults (the same cap). The unseen workloads (padded, convamp, ckpt)
#   take the caps whatif_batch.sh chose in the same $OUT; CAP_BYTES=N sets the cap for every workload.
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-oom-batch-out}
W=$OUT/oom_batch
mkdir -p "$W"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
CASES=${CASES:-train finetune conv}
STEPS=${STEPS:-6}
LOG=$W/log.txt
: >"$LOG"
# Per workload: the small batch, the failing one, and the cap (the caps of whatif_batch.sh's H200 run, where
# 9, 10 and 43 were the largest batches).
setup() {
    case $1 in
    train) echo "4 12 2644663091" ;;
    finetune) echo "4 12 3956800000" ;;
    conv) echo "16 48 1256277934" ;;
    # The unseen workloads: the cap whatif_batch.sh chose in this $OUT (run it first), else none.
    padded) echo "4 12 $(cat "$OUT/whatif_batch/padded.cap" 2>/dev/null || echo 0)" ;;
    convamp) echo "16 48 $(cat "$OUT/whatif_batch/convamp.cap" 2>/dev/null || echo 0)" ;;
    ckpt) echo "8 24 $(cat "$OUT/whatif_batch/ckpt.cap" 2>/dev/null || echo 0)" ;;
    esac
}
for c in $CASES; do
    read -r A F CAP <<<"$(setup "$c")"
    A=${SMALL:-$A} F=${FAILED:-$F} CAP=${CAP_BYTES:-$CAP}
    D=$W/$c
    mkdir -p "$D"
    echo "=== $c: a run at $A, a run at $F under a cap of $CAP bytes" | tee -a "$LOG"
    timeout 300 "$VT" run -q --force --torch-history 4000000 -o "$D/$c.b$A.vtrace" -- \
        python3 "$CASE" "$c" --batch "$A" --steps "$STEPS" 2>>"$LOG" | tail -1 >"$W/$c.b$A.json"
    timeout 300 "$VT" run -q --force --cap "$CAP" --torch-history 4000000 -o "$D/$c.b$F.vtrace" -- \
        python3 "$CASE" "$c" --batch "$F" --steps "$STEPS" 2>>"$LOG" | tail -1 >"$W/$c.b$F.json"
    "$VT" oom --json "$D/$c.b$F.vtrace" >"$W/$c.oom.json" 2>>"$LOG"
    "$VT" oom "$D/$c.b$F.vtrace" >"$W/$c.oom.txt" 2>>"$LOG"
    read -r L M <<<"$(python3 -c "
import json
es = json.load(open('$W/$c.oom.json'))['ooms']
b = ([x['framework']['batch'] for x in es if (x.get('framework') or {}).get('batch')] or [{}])[-1]
print(b.get('largest') or 0, b.get('accumulation_value') or 0)" 2>>"$LOG" || echo "0 0")"
    echo "$L $M" >"$W/$c.advised"
    # No batch advised (withheld: the post-mortem says why): nothing to run.
    [ "$L" -gt 0 ] || { L=0; M=0; }
    for b in $( [ "$L" -gt 0 ] && echo "$L $((L + 1)) $M"); do
        [ "$b" -gt 0 ] || continue
        [ -f "$W/$c.capped$b.json" ] && continue
        timeout 300 "$VT" run -q --force --cap "$CAP" --torch-history off -o "$W/$c.capped$b.vtrace" -- \
            python3 "$CASE" "$c" --batch "$b" --steps "$STEPS" 2>>"$LOG" | tail -1 >"$W/$c.capped$b.json"
    done
    python3 - "$W" "$c" "$A" "$F" "$L" "$M" <<'PY' | tee -a "$W/results.md"
import json, sys
w, c, a, f, l, m = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
def last(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
failed = last(f"{w}/{c}.b{f}.json")
oom = last(f"{w}/{c}.oom.json") or {}
# The advice is on the last error whose replay reproduced the failure (a run may recover from earlier ones).
b = ([e["framework"]["batch"] for e in oom.get("ooms") or [] if (e.get("framework") or {}).get("batch")] or [{}])[-1]
print(f"### {c}: a run at {a}; the run at {f} under the cap: {'out of memory' if failed and failed.get('oom') else 'DID NOT FAIL'}")
print(f"advice: {json.dumps(b)}")
def fits(x):
    r = last(f"{w}/{c}.capped{x}.json")
    return None if r is None else r.get("oom") is None
rows = []
if l:
    rows.append((l, fits(l), True))
    rows.append((l + 1, fits(l + 1), False))
if m and m != l:
    rows.append((m, fits(m), True))
print("| batch | advised to fit | ran under the cap | right |")
print("|---|---|---|---|")
ok = bool(l) and failed is not None and bool(failed.get("oom"))
for x, got, want in rows:
    right = got is not None and got == want
    ok = ok and right
    print(f"| {x} | {'yes' if want else 'no'} | {'fits' if got else ('fails' if got is not None else 'not run')} | {'yes' if right else 'NO'} |")
# The post-mortem `vramtrace run` itself wrote beside the failed trace names the same batch (it looks beside too).
import glob
own = "".join(open(p).read() for p in glob.glob(f"{w}/{c}/{c}.b{f}.oom.txt"))
named = bool(l) and f"--batch {l} fits where {f} failed" in own
print(f"the run's own post-mortem names --batch {l}: {'yes' if named else 'NO'}")
print(f"verdict: {'right' if ok else 'WRONG'}\n")
res = last(f"{w}/gpu_results.json") or {}
res[c] = {"small": a, "failed": f, "advice": b, "rows": rows, "right": ok, "run_post_mortem_names_it": named}
json.dump(res, open(f"{w}/gpu_results.json", "w"), indent=1)
PY
done
for p in "$W"/*/*.pickle; do [ -f "$p" ] && gzip -9f "$p"; done
tar czf "$OUT/oom_batch.tgz" -C "$W" --exclude='*.capped*.vtrace' . 2>>"$LOG"
ls -la "$OUT/oom_batch.tgz"

#!/usr/bin/env bash
# Issue 49 on a real GPU: verdicts on loops with neither an optimizer nor a DataLoader. Each case of loops_case.py
# under `DIR/vramtrace run --cap 4GiB` (default settings otherwise) until PyTorch raises out-of-memory, then
# `vramtrace oom --json` and `oom` (text). Prints a table LAST (also $OUT/loops/table.md); the traces, JSON, text
# and program output go to $OUT/loops.tgz.
#   Usage: bash scripts/gpu/loops.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
#   ONLY="serve longer longer_opt plain longer_in" picks cases (default: serve longer longer_opt plain, in that
#   order, each only while time is left);
#   DEADLINE=S: nothing new starts after S seconds of this script (default 150); CAP (default 4GiB).
#   A case may carry its own cap: NAME:CAP (`NAME:none`: no cap, the program runs to its end). Every case also gets
#   `vramtrace report` and `report --json` (the verdict at exit of a run without an out-of-memory error: the
#   devices' growth, PyTorch's allocated_leak and small_growth), and `run`'s own summary is kept ($c.out).
#   WHATIF="serve ...": those cases also get `vramtrace whatif` ($c.whatif.txt; its last lines are printed).
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-loops-out}
HERE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE_DIR/loops_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1
ONLY=${ONLY:-serve longer longer_opt plain}
CAP=${CAP:-4GiB}
DEADLINE=${DEADLINE:-150}
mkdir -p "$OUT/loops"
W=$(mktemp -d /tmp/vt-loops.XXXX)
LOG=$W/log.txt
: >"$LOG"
# shellcheck source=lib.sh
source "$HERE_DIR/lib.sh"
cd "$W" || exit 1

say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader); $(python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1); $("$VT" --version 2>&1)"
NAMES=""
for spec in $ONLY; do
    c=${spec%%:*}
    cap=$CAP
    [ "$c" != "$spec" ] && cap=${spec#*:}
    NAMES="$NAMES $c"
    capflag=(--cap "$cap")
    [ "$cap" = none ] && capflag=()
    if (($(left) < 25)); then
        say "skip $c: past the deadline"
        continue
    fi
    say "=== $c: vramtrace run ${capflag[*]} -- python3 loops_case.py $c"
    t0=$SECONDS
    timeout "$(tmo 120)" "$VT" run -o "$c.vtrace" --force "${capflag[@]}" -- python3 "$CASE" "$c" >"$c.out" 2>&1
    rc=$?
    echo "rc=$rc wall=$((SECONDS - t0))" >>"$c.out"
    tail -30 "$c.out" >>"$LOG"
    "$VT" oom --json "$c.vtrace" >"$c.oom.json" 2>"$c.oom.err"
    echo "oom --json rc=$?" >>"$c.oom.err"
    "$VT" oom "$c.vtrace" >"$c.oom.txt" 2>>"$c.oom.err"
    "$VT" report "$c.vtrace" >"$c.report.txt" 2>&1
    "$VT" report --json "$c.vtrace" >"$c.report.json" 2>&1
    if [[ " ${WHATIF:-} " == *" $c "* ]]; then
        timeout "$(tmo 60)" "$VT" whatif "$c.vtrace" >"$c.whatif.txt" 2>&1
        echo "whatif rc=$?" >>"$c.whatif.txt"
        { echo "--- $c: whatif (last 6 lines)"; tail -6 "$c.whatif.txt"; } | tee -a "$LOG"
    fi
    { echo "--- $c: oom (text)"; cat "$c.oom.txt"; cat "$c.oom.err"; } >>"$LOG"
    say "$c: exit $rc, $((SECONDS - t0)) s; $(grep '^RESULT' "$c.out" | tail -1 | cut -c1-300)"
done

python3 - "$W" "$NAMES" <<'PY' | tee "$OUT/loops/table.md"
import json, os, sys
w, cases = sys.argv[1], sys.argv[2].split()
MiB = 1 << 20
expect = {
    "serve": "growth, no_grad_iterations, 32 MiB/iter, prefix_cache",
    "plain": "growth, held_entries, 32 MiB/entry, prefix_cache",
    "longer": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
    "longer_opt": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
    "longer_in": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
    "gen": "finishes; no growth, no leak at exit",
    "gen_step": "finishes; no growth, no leak at exit",
    "gen_long": "cap (a step too large), never growth",
    "gen_step_long": "cap (a step too large), never growth",
    "eval_cpu": "finishes; no growth",
    "eval_gpu": "growth, dataloader_batches, 32 MiB/batch, outputs",
    "eval_gpu_exit": "finishes; growth named at exit, 32 MiB/batch, outputs",
    "steady": "finishes; no growth",
    "steady_lru": "finishes; no growth",
}
print("| case | program (RESULT) | cause | growth unit / steps / per step | findings | holders | first advice | 'fix what' said | expected |")
print("|---|---|---|---|---|---|---|---|---|")
summary = {}
for c in cases:
    p = os.path.join(w, c + ".oom.json")
    if not os.path.exists(os.path.join(w, c + ".out")):
        print(f"| {c} | not run ||||||| {expect.get(c, '')} |")
        continue
    res = ""
    for line in open(os.path.join(w, c + ".out"), errors="replace"):
        if line.startswith("RESULT"):
            kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
            if "oom_at" in kv:
                res = "oom at %s%s" % (kv.get("oom_at"), ", cached %s (%.0f MiB)" % (kv["cached"], int(kv["kept_bytes"]) / MiB) if "cached" in kv else ", tokens %s" % kv.get("tokens"))
            else:
                res = "finished: " + " ".join("%s=%s" % (k, kv[k]) for k in ("requests", "batches", "tokens", "cached", "kept_gpu_bytes") if k in kv)
    try:
        j = json.load(open(p))
        o = (j.get("ooms") or [None])[0]
    except (OSError, ValueError) as e:
        print(f"| {c} | {res} | no JSON: {e} ||||||| {expect.get(c, '')} |")
        continue
    if o is None:
        # The verdict at exit: the report's growth (driver), PyTorch's allocated_leak and small_growth.
        try:
            r = json.load(open(os.path.join(w, c + ".report.json")))
        except (OSError, ValueError) as e:
            r = {"devices": []}
        ex = []
        for dv in r.get("devices") or []:
            fw = dv.get("framework") or {}
            for name, gr in (("growth", dv.get("growth")), ("allocated_leak", fw.get("allocated_leak")), ("small_growth", fw.get("small_growth"))):
                if gr:
                    ex.append("%s: %s / %s / %s" % (name, gr.get("unit"), gr.get("steps"),
                              "%.2f MiB" % (gr["per_step_bytes"] / MiB) if gr.get("per_step_bytes") is not None else "-"))
        said = [l.strip() for l in open(os.path.join(w, c + ".out"), errors="replace") if not l.startswith(("RESULT", "SETUP")) and any(k in l.lower() for k in ("grow", "leak"))]
        print(f"| {c} | {res} | no oom (exit) | {'; '.join(ex) or 'none'} | run said: {' / '.join(said)[:200] or '-'} |||| {expect.get(c, '')} |")
        summary[c] = {"exit": ex, "said": said}
        continue
    g = o.get("growth") or {}
    gs = "-" if not g else "%s / %s / %s" % (g.get("unit"), g.get("steps"),
                                             "%.2f MiB" % (g["per_step_bytes"] / MiB) if g.get("per_step_bytes") is not None else "null")
    kinds = [f.get("kind") + ("(%s)" % f["shape"] if f.get("shape") else "") for f in o.get("findings") or []]
    hs = (o.get("holders") or {}).get("holders") or []
    hold = ", ".join("%s %s %.0f MiB" % (h.get("kind"), h.get("name"), (h.get("bytes") or 0) / MiB) for h in hs[:3]) or "-"
    adv = o.get("advice") or []
    fixwhat = any("fix what is kept" in a or "Fix what" in a for a in adv)
    first = (adv[0][:110].replace("|", "/") + ("..." if len(adv[0]) > 110 else "")) if adv else "-"
    print(f"| {c} | {res} | {o.get('cause')} | {gs} | {', '.join(map(str, kinds))} | {hold} | {first} | {'YES' if fixwhat else 'no'} | {expect.get(c, '')} |")
    summary[c] = {"cause": o.get("cause"), "growth": g and {k: g.get(k) for k in ("unit", "steps", "per_step_bytes", "rise_bytes")},
                  "findings": kinds, "advice": adv, "holders": hs[:5]}
json.dump(summary, open(os.path.join(w, "summary.json"), "w"), indent=1)
PY
cp "$LOG" "$W/log.txt" 2>/dev/null
tar czf "$OUT/loops.tgz" -C "$W" . 2>/dev/null
# 16 MiB at most comes back per file: without the traces if they make it larger.
if [ "$(stat -c %s "$OUT/loops.tgz")" -gt $((15 << 20)) ]; then
    tar czf "$OUT/loops.tgz" -C "$W" --exclude='*.vtrace*' --exclude='*.pickle' . 2>/dev/null
fi
rm -rf "$W"

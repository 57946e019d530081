#!/usr/bin/env bash
# Issue 49 on a real GPU: verdicts on loops with neither an optimizer nor a DataLoader. Each case of loops_case.py
# under `DIR/vramtrace run --cap 4GiB` (default settings otherwise) until PyTorch raises out-of-memory, then
# `vramtrace oom --json` and `oom` (text). Prints a table LAST (also $OUT/loops/table.md); the traces, JSON, text
# and program output go to $OUT/loops.tgz.
#   Usage: bash scripts/gpu/loops.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
#   ONLY="serve longer longer_opt plain longer_in" picks cases (default: serve longer longer_opt plain, in that
#   order, each only while time is left);
#   DEADLINE=S: nothing new starts after S seconds of this script (default 150); CAP (default 4GiB).
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
for c in $ONLY; do
    if (($(left) < 25)); then
        say "skip $c: past the deadline"
        continue
    fi
    say "=== $c: vramtrace run --cap $CAP -- python3 loops_case.py $c"
    t0=$SECONDS
    timeout "$(tmo 120)" "$VT" run -o "$c.vtrace" --force --cap "$CAP" -- python3 "$CASE" "$c" >"$c.out" 2>&1
    rc=$?
    echo "rc=$rc wall=$((SECONDS - t0))" >>"$c.out"
    tail -30 "$c.out" >>"$LOG"
    "$VT" oom --json "$c.vtrace" >"$c.oom.json" 2>"$c.oom.err"
    echo "oom --json rc=$?" >>"$c.oom.err"
    "$VT" oom "$c.vtrace" >"$c.oom.txt" 2>>"$c.oom.err"
    { echo "--- $c: oom (text)"; cat "$c.oom.txt"; cat "$c.oom.err"; } >>"$LOG"
    say "$c: exit $rc, $((SECONDS - t0)) s; $(grep '^RESULT' "$c.out" | tail -1 | cut -c1-300)"
done

python3 - "$W" "$ONLY" <<'PY' | tee "$OUT/loops/table.md"
import json, os, sys
w, cases = sys.argv[1], sys.argv[2].split()
MiB = 1 << 20
expect = {
    "serve": "growth, no_grad_iterations, 32 MiB/iter, prefix_cache",
    "plain": "growth, held_entries, 32 MiB/entry, prefix_cache",
    "longer": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
    "longer_opt": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
    "longer_in": "cap, step_need_rises, 'Bound what each ...', no 'fix what is kept'",
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
            res = "oom at %s%s" % (kv.get("oom_at"), ", cached %s (%.0f MiB)" % (kv["cached"], int(kv["kept_bytes"]) / MiB) if "cached" in kv else ", tokens %s" % kv.get("tokens"))
    try:
        j = json.load(open(p))
        o = (j.get("ooms") or [None])[0]
    except (OSError, ValueError) as e:
        print(f"| {c} | {res} | no JSON: {e} ||||||| {expect.get(c, '')} |")
        continue
    if o is None:
        print(f"| {c} | {res} | no oom in the trace ||||||| {expect.get(c, '')} |")
        continue
    g = o.get("growth") or {}
    gs = "-" if not g else "%s / %s / %s" % (g.get("unit"), g.get("steps"),
                                             "%.2f MiB" % (g["per_step_bytes"] / MiB) if g.get("per_step_bytes") is not None else "null")
    kinds = [f.get("kind") for f in o.get("findings") or []]
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

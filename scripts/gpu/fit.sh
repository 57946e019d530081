#!/usr/bin/env bash
# Issue 48 on a real GPU: is `vramtrace fit` right, and how long does it take? For each workload of
# whatif_case.py (given as CASE:LIMIT, LIMIT a cap such as 16GiB, or `device` for the whole GPU):
#   1. one short run of the program alone (`python3 whatif_case.py CASE --batch 16 --steps 5`), and the same under
#      `vramtrace run` once: the yardstick for fit's whole time;
#   2. `vramtrace fit [--cap LIMIT] --verify --json -- python3 whatif_case.py CASE --batch {} --steps 100000`: the
#      program would run for hours, so fit must stop each of its runs itself; --verify runs the answer and one past
#      it (under the cap, or on the whole device) and says whether each fitted as predicted.
# Prints a table last (and $OUT/fit/table.md); $OUT/fit/results.json has every figure; $OUT/fit.tgz the fits' JSON,
# their stderr and the programs' logs (no traces).
#   Usage: bash scripts/gpu/fit.sh DIR     (DIR: the carried build: vramtrace, libvramtrace.so)
#   CASES="train:16GiB conv:device" picks workloads and limits (default: the five below, capped);
#   BUDGET=S: no new case starts after S seconds (default 540), and a fit is cut off at S+40.
#   PROBE="conv:6GiB:298 ..." (CASE:CAP:ANSWER; CASES="" to run only these): where --verify found answer+1 fitting,
#   how far the answer was low: runs under the cap at 2%, 5%, 10% and 20% past it (5 steps each, as fit's runs),
#   each said to fit or to run out of memory ($OUT/fit/probe.md).
#   FROM=A,B: fit's first pair (`--from A,B`; default fit's own, 8 and 16);
#   YARD=0: no yardstick runs (step 1); VERIFY=0: fit without --verify; TAG=NAME: $OUT/NAME/ and $OUT/NAME.tgz
#   instead of fit (a second call in one session keeps the first's files); KEEP="table.md ...": the files left
#   beside the tarball in $OUT/NAME/ (default: table.md results.json log.txt probe.md; the tarball has them all).
#   With --verify, where the answer or answer+1 contradicts the replay, fit itself gallops and bisects (up to 8
#   more runs): the case's `verified` {fits, fails, largest} is recorded, and the table shows it.
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-fit-out}
TAG=${TAG:-fit}
W=$OUT/$TAG
YARD=${YARD:-1}
VERIFY=${VERIFY:-1}
KEEP=${KEEP:-table.md results.json log.txt probe.md}
verifyflag=(--verify)
[ "$VERIFY" = 0 ] && verifyflag=()
[ -n "${FROM:-}" ] && verifyflag+=(--from "$FROM")
mkdir -p "$W"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1
CASES=${CASES-train:16GiB conv:6GiB convamp:4GiB padded:40GiB ckpt:6GiB}
BUDGET=${BUDGET:-540}
WORK=$(mktemp -d /tmp/vramtrace-fit.XXXXXX)
LOG=$W/log.txt
: >"$LOG"
say() { printf '[%3ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,memory.free --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"cudnn", torch.backends.cudnn.version(), "transformers", transformers.__version__)'
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
} >"$W/gpu.txt" 2>&1
cat "$W/gpu.txt"

timed=" "
for spec in $CASES; do
    c=${spec%%:*}
    limit=${spec#*:}
    [ "$limit" = "$spec" ] && limit=device
    if ((SECONDS > BUDGET)); then
        say "$c ($limit): skipped, past the budget of $BUDGET s"
        echo "{\"case\": \"$c\", \"limit\": \"$limit\", \"skipped\": true}" >"$W/$c.$limit.case.json"
        continue
    fi
    # 1. The yardstick, once per program.
    if [ "$YARD" != 0 ] && [[ $timed != *" $c "* ]]; then
        timed="$timed$c "
        t0=$(now)
        timeout 300 python3 "$CASE" "$c" --batch 16 --steps 5 >"$W/$c.bare.out" 2>>"$LOG"
        echo "$? $(since "$t0")" >"$W/$c.bare.time"
        t0=$(now)
        timeout 300 "$VT" run -q --force -o "$WORK/$c.run.vtrace" -- \
            python3 "$CASE" "$c" --batch 16 --steps 5 >"$W/$c.run.out" 2>>"$LOG"
        echo "$? $(since "$t0")" >"$W/$c.run.time"
        rm -f "$WORK/$c.run.vtrace"*
        say "$c: a short run (batch 16, 5 steps) bare $(cut -d' ' -f2 "$W/$c.bare.time") s, under vramtrace run $(cut -d' ' -f2 "$W/$c.run.time") s"
    fi
    # 2. The fit.
    capflag=()
    [ "$limit" != device ] && capflag=(--cap "$limit")
    say "$c ($limit): vramtrace fit ${capflag[*]} ${verifyflag[*]}"
    t0=$(now)
    timeout $((BUDGET + 40 - SECONDS > 60 ? BUDGET + 40 - SECONDS : 60)) "$VT" fit "${capflag[@]}" "${verifyflag[@]}" --json \
        --bound 200 --dir "$WORK/$c.$limit" -- python3 "$CASE" "$c" --batch '{}' --steps 100000 \
        >"$W/$c.$limit.fit.json" 2>"$W/$c.$limit.fit.err"
    rc=$?
    wall=$(since "$t0")
    cat "$W/$c.$limit.fit.err" >>"$LOG"
    # The programs' own last lines (PyTorch's figures where a run got to print them) beside each run's log.
    for f in "$WORK/$c.$limit"/*.log; do
        [ -f "$f" ] && cp "$f" "$W/$c.$limit.$(basename "$f")"
    done
    python3 - "$W" "$c" "$limit" "$rc" "$wall" <<'PY' | tee -a "$LOG"
import json, os, sys
w, c, limit, rc, wall = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
def rd(n):
    try:
        return open(os.path.join(w, n)).read()
    except OSError:
        return ""
def tm(n):
    t = rd(n).split()
    return {"rc": int(t[0]), "seconds": float(t[1])} if len(t) == 2 else None
res = {"case": c, "limit": limit, "rc": rc, "wall": wall, "bare": tm(f"{c}.bare.time"), "run": tm(f"{c}.run.time")}
try:
    f = json.loads(rd(f"{c}.{limit}.fit.json"))
except ValueError:
    f = None
    res["error"] = rd(f"{c}.{limit}.fit.err").strip().splitlines()[-3:]
if f:
    lg = f.get("largest") or {}
    res.update(
        answer=lg.get("value"), at_least=lg.get("at_least"), range=lg.get("range"),
        limit_what=(f.get("limit") or {}).get("what"), limit_devices=(f.get("limit") or {}).get("devices"),
        seconds=f.get("seconds"), used=f.get("used"), notes=f.get("notes"),
        runs=[{k: r.get(k) for k in ("value", "role", "ending", "exit_code", "steps", "seconds")} for r in f.get("runs", [])],
        verify=[{k: v.get(k) for k in ("value", "fitted", "predicted")} for v in f.get("verify", [])],
        verified=f.get("verified"), next_failure=lg.get("next_failure"),
        settings=f.get("settings"),
    )
    v = res["verify"]
    res["answer_fitted"] = v[0]["fitted"] if len(v) > 0 else None
    res["next_failed"] = (not v[1]["fitted"]) if len(v) > 1 else None
vd = res.get("verified") or {}
print(f"{c} ({limit}): exit {rc}, {wall:.1f} s; answer {res.get('answer')} (range {res.get('range')}); verified {vd or '-'}; "
      + f"{len(res.get('runs', []))} runs: "
      + ", ".join(f"{r['value']} {r['role']} {r['ending']} {r['steps']} steps {r['seconds']:.1f} s" for r in res.get("runs", []))
      + (f"; ERROR {res['error']}" if "error" in res else "")
      + (("; notes: " + " | ".join(res.get("notes") or [])) if res.get("notes") else ""))
json.dump(res, open(os.path.join(w, f"{c}.{limit}.case.json"), "w"), indent=1)
PY
    rm -rf "$WORK/$c.$limit"
done

# Past the answer, where --verify found one past it fitting.
for spec in ${PROBE:-}; do
    IFS=: read -r c cap ans <<<"$spec"
    for pct in 2 5 10 20; do
        ((SECONDS > BUDGET + 40)) && break
        v=$(( (ans * (100 + pct) + 99) / 100 ))
        t0=$(now)
        timeout 200 "$VT" run -q --force --cap "$cap" --torch-history off --stop-after-steps 5 \
            -o "$WORK/probe.vtrace" -- python3 "$CASE" "$c" --batch "$v" --steps 100000 >"$W/$c.probe$v.out" 2>>"$LOG"
        rc=$?
        # PyTorch's own out-of-memory error (the program prints it); any other failure is said with its last
        # error line (a cap refusing cuBLAS's handle: CUBLAS_STATUS_ALLOC_FAILED, also out of memory).
        if grep -q '"oom": {' "$W/$c.probe$v.out"; then
            how="out of memory: $(grep -o '"oom": {[^}]*}' "$W/$c.probe$v.out")"
        elif [ "$rc" != 0 ]; then
            how="failed: $(grep -a 'Error' "$LOG" | tail -1 | cut -c1-120)"
        else how="fits (5 steps)"; fi
        printf '| %s | %s | %s | +%s%% (%s) | %s | exit %s, %s s |\n' "$c" "$cap" "$ans" "$pct" "$v" "$how" "$rc" \
            "$(since "$t0")" | tee -a "$W/probe.md"
        rm -f "$WORK/probe.vtrace"*
        [[ $how == fits* ]] || break
    done
done

if [ -z "$CASES" ]; then
    rm -rf "$WORK"
    tar czf "$OUT/$TAG.tgz" -C "$W" . 2>>"$LOG"
    find "$W" -type f ! -name probe.md ! -name log.txt -delete
    exit 0
fi
python3 - "$W" "$CASES" <<'PY' | tee "$W/table.md"
import json, os, sys
w = sys.argv[1]
rows = []
for spec in sys.argv[2].split():
    c, _, limit = spec.partition(":")
    limit = limit or "device"
    try:
        rows.append(json.load(open(os.path.join(w, f"{c}.{limit}.case.json"))))
    except (OSError, ValueError) as e:
        rows.append({"case": c, "limit": limit, "error": str(e)})
def yn(x):
    return "-" if x is None else ("yes" if x else "NO")
print("| case | limit | replay's answer (range) | verified fits / fails / largest | runs (values: role) | answer fitted | answer+1 failed | fit s | fit s less verify | short run bare s | under run s | fit / bare | less verify / bare | fit / run |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r.get("skipped") or "answer" not in r:
        print(f"| {r['case']} | {r['limit']} | {'skipped' if r.get('skipped') else 'no answer: ' + ' / '.join(r.get('error') or [])} |||||||||||")
        continue
    runs = r["runs"]
    fit = [x for x in runs if x["role"] != "verify"]
    b = (r.get("bare") or {}).get("seconds")
    u = (r.get("run") or {}).get("seconds")
    s = r["seconds"]
    nv = s - sum(x["seconds"] for x in runs if x["role"] == "verify")
    vals = ", ".join(f"{x['value']}{'' if x['role'] in ('first', 'verify') else ' ' + x['role']}" for x in fit)
    vr = [str(x["value"]) + ("" if x["ending"] in ("stopped", "finished") else " " + x["ending"]) for x in runs if x["role"] == "verify"]
    if vr:
        vals += "; verify " + ", ".join(vr)
    vd = r.get("verified")
    vds = "-" if not vd else f"{vd.get('fits')} / {vd.get('fails')} / **{vd.get('largest')}**"
    print(f"| {r['case']} | {r['limit']} | {r['answer']}{'+' if r.get('at_least') else ''} ({'-'.join(map(str, r.get('range') or []))}) | {vds} | {len(runs)} ({vals}) | "
          f"{yn(r.get('answer_fitted'))} | {yn(r.get('next_failed'))} | {s:.1f} | {nv:.1f} | {b or '-'} | {u or '-'} | "
          f"{s / b if b else 0:.1f} | {nv / b if b else 0:.1f} | {s / u if u else 0:.1f} |")
out = {"date": __import__("time").strftime("%Y-%m-%d"), "gpu": open(os.path.join(w, "gpu.txt")).read(), "cases": rows}
json.dump(out, open(os.path.join(w, "results.json"), "w"), indent=1)
PY
rm -rf "$WORK"
tar czf "$OUT/$TAG.tgz" -C "$W" . 2>>"$LOG"
# At most 8 files come back: what KEEP names and the tarball.
keep() { for f in "$W"/*; do [[ " $KEEP " == *" $(basename "$f") "* ]] || rm -f "$f"; done; }
keep
[ -f "$W/probe.md" ] && cat "$W/probe.md"
ls -la "$OUT" "$W"

#!/usr/bin/env bash
# Issue 49's step_need rule on training loops (a check for false positives): whatif_case.py's `train` (a fixed
# batch, the same need every step after the first) and `padded` (GPT-2 on padded batches of skewed lengths: the
# need follows the batch's longest sample) under `vramtrace run --cap`, all side by side, then `oom --json`, `oom`
# and `report` of each. Prints a table LAST (also $OUT/stepfp/table.md); everything else goes to $OUT/stepfp.tgz.
#   Usage: bash scripts/gpu/step_need_fp.sh DIR   (DIR: the carried build: vramtrace, libvramtrace.so)
#   RUNS="name:case:batch:steps:cap ..." (default below); TMO: seconds each run may take (default 150).
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-stepfp-out}
HERE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE_DIR/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1
RUNS=${RUNS:-train1400:train:1400:30:16GiB train137:train:137:30:16GiB train136:train:136:30:16GiB padded14:padded:14:60:6GiB padded12:padded:12:60:6GiB padded11:padded:11:60:6GiB}
TMO=${TMO:-150}
mkdir -p "$OUT/stepfp"
W=$(mktemp -d /tmp/vt-stepfp.XXXX)
cd "$W" || exit 1

# The padded batches' longest sample per step, as whatif_case.py draws them (CPU only): which step should fail.
python3 - >lengths.txt 2>&1 <<'PY'
import torch
gd = torch.Generator().manual_seed(2)
n = 4096
lengths = torch.empty(n).log_normal_(5.0, 0.7, generator=gd).clamp(16, 512).long()
order = torch.randperm(n, generator=gd)
for b in (11, 12, 14):
    print(b, [int(lengths[order[k * b:(k + 1) * b]].max()) for k in range(60)])
PY

one() {
    local name=$1 c=$2 b=$3 n=$4 cap=$5 t0=$SECONDS
    timeout "$TMO" "$VT" run -o "$name.vtrace" --force --cap "$cap" -- python3 "$CASE" "$c" --batch "$b" --steps "$n" \
        >"$name.out" 2>&1
    echo "rc=$? wall=$((SECONDS - t0))" >>"$name.out"
    "$VT" oom --json "$name.vtrace" >"$name.oom.json" 2>"$name.oom.err"
    "$VT" oom "$name.vtrace" >"$name.oom.txt" 2>>"$name.oom.err"
    "$VT" report "$name.vtrace" >"$name.report.txt" 2>&1
    echo "$name: $c --batch $b --steps $n --cap $cap"
}
NAMES=""
for spec in $RUNS; do
    IFS=: read -r name c b n cap <<<"$spec"
    NAMES="$NAMES $name"
    one "$name" "$c" "$b" "$n" "$cap" &
done
wait

for name in $NAMES; do
    { echo "=== $name"; tail -5 "$name.out"; echo "--- oom (text)"; cat "$name.oom.txt" "$name.oom.err"; } >>log.txt
done
python3 - "$W" "$NAMES" <<'PY' | tee "$OUT/stepfp/table.md"
import json, os, sys
w, names = sys.argv[1], sys.argv[2].split()
G = 1 << 30
print("| run | program | cause | findings | step_need (shape: first -> last) | advice 1 | advice 2 |")
print("|---|---|---|---|---|---|---|")
for n in names:
    prog = "-"
    try:
        last = [l for l in open(os.path.join(w, n + ".out"), errors="replace") if l.startswith("{")]
        if last:
            r = json.loads(last[-1])
            prog = ("oom at step %s line %s asked %s" % (r["oom"]["step"], r["oom"]["line"], r["oom"]["tried"])
                    if r.get("oom") else "finished %d steps" % len(r.get("steps_us") or [])) + \
                   ", max alloc %.2f GiB" % (r["max_allocated"] / G)
    except (OSError, ValueError, KeyError) as e:
        prog = "? %s" % e
    try:
        o = (json.load(open(os.path.join(w, n + ".oom.json"))).get("ooms") or [None])[0]
    except (OSError, ValueError) as e:
        print(f"| {n} | {prog} | no JSON: {e} |||||")
        continue
    if o is None:
        print(f"| {n} | {prog} | no oom |||||")
        continue
    fs = o.get("findings") or []
    kinds = [f.get("kind") for f in fs]
    sn = "-"
    for f in fs:
        if f.get("kind") == "step_need_rises":
            fig = f.get("figures") or f
            sn = "%s: %s %s %.2f GiB -> %s %.2f GiB" % (fig.get("shape"), fig.get("unit"), fig.get("first_step"),
                  (fig.get("first_peak_bytes") or 0) / G, fig.get("last_step"), (fig.get("last_peak_bytes") or 0) / G)
    adv = [a.replace("|", "/").replace("\n", " ") for a in (o.get("advice") or [])]
    cut = lambda a: a[:140] + ("..." if len(a) > 140 else "")
    print(f"| {n} | {prog} | {o.get('cause')} | {', '.join(map(str, kinds))} | {sn} | "
          f"{cut(adv[0]) if adv else '-'} | {cut(adv[1]) if len(adv) > 1 else '-'} |")
PY
cat lengths.txt
tar czf "$OUT/stepfp.tgz" -C "$W" . 2>/dev/null
if [ "$(stat -c %s "$OUT/stepfp.tgz")" -gt $((15 << 20)) ]; then
    tar czf "$OUT/stepfp.tgz" -C "$W" --exclude='*.vtrace*' --exclude='*.pickle' . 2>/dev/null
fi
rm -rf "$W"

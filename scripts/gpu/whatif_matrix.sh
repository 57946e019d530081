#!/usr/bin/env bash
# Issue 28: the what-if from every side. Each workload runs once under each setting with its whole history kept;
# each history is replayed under every setting and compared with the real run of that setting (PyTorch's
# max_memory_reserved). The diagonal is the model replaying a run's own settings; off it, the what-if proper. A
# second bare run of each setting measures how much the workload itself varies between runs.
#   Usage: bash scripts/gpu/whatif_matrix.sh DIR     CASES="train finetune", SETTINGS="defaults roundup_power2_divisions:4"
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-whatif-out}
W=$OUT/matrix
mkdir -p "$W"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CASE=$HERE/whatif_case.py
VT="$DIR/vramtrace"
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset PYTORCH_CUDA_ALLOC_CONF
CASES=${CASES:-train finetune}
SETTINGS=${SETTINGS:-defaults roundup_power2_divisions:4 expandable_segments:True max_split_size_mb:256}
conf() { [ "$1" = defaults ] && echo "" || echo "$1"; }
for c in $CASES; do
    args=()
    for s in $SETTINGS; do
        PYTORCH_CUDA_ALLOC_CONF=$(conf "$s") "$VT" run -q --force --torch-history 4000000 -o "$W/$c.$s.vtrace" -- \
            python3 "$CASE" "$c" 2>>"$W/log.txt" | tail -1 >"$W/$c.$s.json"
        PYTORCH_CUDA_ALLOC_CONF=$(conf "$s") python3 "$CASE" "$c" 2>>"$W/log.txt" | tail -1 >"$W/$c.$s.again.json"
        args+=(--alloc-conf "$(conf "$s")")
    done
    for s in $SETTINGS; do
        "$VT" whatif --json "${args[@]}" "$W/$c.$s.vtrace" >"$W/$c.$s.whatif.json" 2>>"$W/log.txt"
    done
    python3 - "$W" "$c" "$SETTINGS" <<'PY' | tee -a "$W/results.md"
import json, os, sys
w, c, settings = sys.argv[1], sys.argv[2], sys.argv[3].split()
conf = lambda s: "" if s == "defaults" else s
real = {s: json.load(open(os.path.join(w, f"{c}.{s}.json")))["max_reserved"] for s in settings}
again = {s: json.load(open(os.path.join(w, f"{c}.{s}.again.json")))["max_reserved"] for s in settings}
print(f"\n### {c}: rows, the run whose history is replayed; columns, the setting replayed (model against that setting's real run)")
print("| history of \\ replayed as | " + " | ".join(settings) + " |")
print("|---|" + "---|" * len(settings))
worst = 0.0
for h in settings:
    t = json.load(open(os.path.join(w, f"{c}.{h}.whatif.json")))["traces"][0]
    cells = []
    for s in settings:
        x = next((x for x in t["configs"] if x["as_run"] and s == h), None) or next(
            (x for x in t["configs"] if not x["as_run"] and x["conf"] == conf(s)), None)
        if x is None:  # the setting the run used is tried once, as run
            x = t["configs"][0]
        m = x["processes"][0]["reserved_peak"]
        e = (m - real[s]) / real[s] * 100
        worst = max(worst, abs(e))
        cells.append(f"{e:+.2f}%")
    print(f"| {h} | " + " | ".join(cells) + " |")
print("| real run, GiB | " + " | ".join(f"{real[s] / 2**30:.3f}" for s in settings) + " |")
print("| second real run, change | " + " | ".join(f"{(again[s] - real[s]) / real[s] * 100:+.2f}%" for s in settings) + " |")
print(f"\nworst: {worst:.2f}%")
PY
done
tar czf "$OUT/matrix.tgz" -C "$W" --exclude='*.pickle' . 2>>"$W/log.txt"

#!/usr/bin/env bash
# The Python bridge's cost per step, measured inside one process (scripts/gpu/bridge_inproc_case.py: the bridge's
# step hooks switched off and on between ABBA blocks of one process; see its docstring). One process per build
# under that build's `vramtrace run` (the bridge on by default; each `vramtrace` writes out the bridge it was built
# with, so BASE's binary runs BASE's bridge), the builds alternating: head, base, head, base ... for ROUNDS rounds
# while the time allows. Prints each process's table, then one table of both builds side by side, last.
#   Usage: bash scripts/gpu/bridge_inproc.sh HEAD_DIR [BASE_DIR]    (each: vramtrace, libvramtrace.so)
#   env: ROUNDS (2), STOP (seconds after which no new process starts; 300), CASES (default all), PAIRS (40),
#        BLOCK_MS (40), TRAIN_MIN_ITERS (200), THREADS (torch's CPU threads; default torch's own); OUT (where
#        inproc-*.out, each with its trace's report at the end, and inproc-table.md go)
set -u
HEAD_DIR=$(cd "$1" && pwd)
BASE_DIR=${2:+$(cd "$2" && pwd)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-inproc-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-inproc.XXXX)
ROUNDS=${ROUNDS:-2}
STOP=${STOP:-300}
export PAIRS=${PAIRS:-40} BLOCK_MS=${BLOCK_MS:-40} PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING
builds="head"
[ -n "$BASE_DIR" ] && builds="head base"
last=0
for r in $(seq "$ROUNDS"); do
    for b in $builds; do
        if ((SECONDS + last + 5 > STOP)); then
            echo "[$SECONDS s] inproc: $b round $r not started (a process took $last s, STOP $STOP)"
            continue
        fi
        d=$HEAD_DIR
        [ "$b" = base ] && d=$BASE_DIR
        t0=$SECONDS
        (cd "$W" && VRAMTRACE_SHIM="$d/libvramtrace.so" LABEL="$b-$r" timeout $((STOP - SECONDS + 60)) \
            "$d/vramtrace" run -q --force -o "inproc-$b-$r.vtrace" -- python3 "$HERE/bridge_inproc_case.py" ${CASES:-}) \
            >"$OUT/inproc-$b-$r.out" 2>&1
        rc=$?
        ((SECONDS - t0 > last)) && last=$((SECONDS - t0))
        echo "[$SECONDS s] inproc $b round $r: exit $rc, $((SECONDS - t0)) s"
        grep -E '^(HOOKS|NOBRIDGE|Traceback)' "$OUT/inproc-$b-$r.out"
        grep '^|' "$OUT/inproc-$b-$r.out"
        { echo "=== vramtrace report"; "$d/vramtrace" report "$W/inproc-$b-$r.vtrace"; } >>"$OUT/inproc-$b-$r.out" 2>&1
    done
done
python3 - "$OUT" <<'PY' | tee "$OUT/inproc-table.md"
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}  # (build, case) -> [result dicts]
for f in sorted(glob.glob(os.path.join(out, "inproc-*-*.out"))):
    b = os.path.basename(f).split("-")[1]
    for line in open(f, errors="replace"):
        if line.startswith("CASE "):
            d = json.loads(line[5:])
            rows.setdefault((b, d["case"]), []).append(d)
cases = list(dict.fromkeys(c for _, c in rows))
print()
print("### The bridge's step hooks, on - off inside one process: ns per iteration, median of the block pairs' differences")
print("(each process: [p10 .. p90 of its pairs], bootstrap 95% of its median; `off` the arm's median ns per iteration)")
print()
print("| case | head: on - off, each process | base: on - off, each process | off ns/iter (head / base) | head - base, ns (medians of processes) |")
print("|---|---|---|---|---|")
for c in cases:
    cells, med = [], {}
    for b in ("head", "base"):
        v = rows.get((b, c), [])
        cells.append("; ".join("**%+.0f** [%+.0f .. %+.0f] (%+.0f .. %+.0f)" % (
            d["diff_med_ns"], d["diff_p10_ns"], d["diff_p90_ns"], d["ci95_ns"][0], d["ci95_ns"][1]) for d in v) or "-")
        med[b] = statistics.median(d["diff_med_ns"] for d in v) if v else None
    offs = " / ".join("%.0f" % statistics.median(d["off_ns"] for d in rows[(b, c)]) if rows.get((b, c)) else "-"
                      for b in ("head", "base"))
    dd = "%+.0f" % (med["head"] - med["base"]) if None not in med.values() else "-"
    print("| %s | %s | %s | %s | %s |" % (c, cells[0], cells[1], offs, dd))
PY
rm -rf "$W"

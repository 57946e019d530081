#!/usr/bin/env bash
# Issue 50, item 4 on a real GPU: the cap's NVML check (collector/src/cap_check.rs) near the cap, and the job's
# allowance (1.5 GiB for the first process on a GPU, 768 MiB for each other). Under `vramtrace run --cap 1GiB`
# (enforce), processes started without the preload (scripts/gpu/escape.c) must be stopped and named:
#   a  3 GiB held 400 ms of every second, 10 times
#   b  3 GiB held 150 ms of every second, 10 times
#   c  six processes each holding 1 GiB beside their contexts
# and, under `--cap 4GiB`, where a process's context alone (518 MiB on an H200) is not half the cap, so the check
# reads at its slow pace (every 250-500 ms) until it first sees the job past:
#   g  6 GiB held 150 ms of every second, 10 times
#   h  6 GiB held 400 ms of every second, 10 times
# and well-behaved PyTorch jobs (scripts/gpu/cap_job.py) must never be flagged, and exit 0:
#   d  4 processes, a Linear + matmul training loop (cuBLAS), ~150 MiB of tensors each, --cap 2GiB, 15 s
#   e  1 process taking and freeing 1.4-1.9 GiB (empty_cache each step) under --cap 2GiB, 15 s
#   i  4 processes each taking and freeing 250-400 MiB (empty_cache each step) under --cap 2GiB, 15 s: together at
#      the cap, refused now and then (caught), their counts reaching the trace out of step with one another
#   f  4 processes as d with a convolution too (cuDNN and cuBLAS), 270 MiB of data each (482 MiB counted each:
#      94% of the cap), --cap 2GiB, 15 s (F=400 gives 612 MiB each: the fourth is refused by the cap)
# nvidia-smi is read every 0.5 s throughout: each well-behaved process's GPU figure less its reserve (PyTorch's
# memory_reserved, what its shim counts) is its context and libraries, set against the allowance.
#   Usage: bash scripts/gpu/cap_pulses.sh DIR     (DIR: the carried build: vramtrace, libvramtrace.so)
#   ONLY="a b c" picks cases. Writes $OUT/cap_pulses.tgz (every case's output) and prints a table last.
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-cappulses-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-cappulses.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
export PYTHONUNBUFFERED=1
VT="$DIR/vramtrace"
ONLY=${ONLY:-a b c g h d e i f}
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
gcc -O2 -o escape "$HERE/escape.c" -I"$CUDA_INC" -lcuda || { echo "cap_pulses: escape.c did not build"; exit 1; }
cp "$HERE/cap_job.py" .
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >gpu.txt
# nvidia-smi every 0.5 s: `T <epoch>` then `pid, MiB` lines.
(
    while :; do
        echo "T $(date +%s.%N)"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits
        sleep 0.5
    done
) >smi.log 2>&1 &
sampler=$!
# case_ NAME CAP AGENT COMMAND...: `run --cap CAP` (enforce) on COMMAND; its stderr lines stamped with the time.
case_() {
    local name=$1 cap=$2 agent=$3
    shift 3
    [[ " $ONLY " == *" $name "* ]] || return 0
    echo "$(date +%s.%N)" >"$name.t0"
    timeout 120 "$VT" run --cap "$cap" --cap-mode enforce --python-agent "$agent" --out "$name.vtrace" -- "$@" \
        >"$name.out" 2> >(while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done >"$name.err")
    echo "rc=$?" >>"$name.rc"
    echo "$(date +%s.%N)" >"$name.t1"
    sleep 1
    echo "case $name done: $(cat "$name.rc")"
}
G=1073741824
case_ a 1GiB off env -u LD_PRELOAD ./escape pulse 10 $((3 * G)) 400 600
case_ b 1GiB off env -u LD_PRELOAD ./escape pulse 10 $((3 * G)) 150 850
case_ c 1GiB off bash -c "for i in 1 2 3 4 5 6; do env -u LD_PRELOAD ./escape hold $G 20000 & done; wait"
case_ g 4GiB off env -u LD_PRELOAD ./escape pulse 10 $((6 * G)) 150 850
case_ h 4GiB off env -u LD_PRELOAD ./escape pulse 10 $((6 * G)) 400 600
case_ d 2GiB on bash -c "for i in 1 2 3 4; do python3 cap_job.py train 150 15 & done; wait"
case_ e 2GiB on python3 cap_job.py churn 1400 1900 15
case_ i 2GiB on bash -c "for i in 1 2 3 4; do python3 cap_job.py churn 250 400 15 & done; wait"
case_ f 2GiB on bash -c "for i in 1 2 3 4; do python3 cap_job.py conv ${F:-270} 15 & done; wait"
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
for n in $ONLY; do [ -f "$n.vtrace" ] && "$VT" report "$n.vtrace" >"$n.report.txt" 2>&1; done
python3 - "$ONLY" <<'PY' | tee summary.md
import os, re, statistics, sys
names = sys.argv[1].split()
print("GPU:", open("gpu.txt").read().strip())
# nvidia-smi samples: [(t, {pid: MiB})]
smi, cur = [], None
for l in open("smi.log"):
    if l.startswith("T "):
        cur = (float(l.split()[1]), {}); smi.append(cur)
    elif cur and "," in l:
        try:
            p, m = [int(x) for x in l.split(",")]
            cur[1][p] = m
        except ValueError:
            pass
want = {"a": "stop", "b": "stop", "c": "stop", "g": "stop", "h": "stop", "i": "quiet", "d": "quiet", "e": "quiet", "f": "quiet"}
rows, ctx = [], []
for n in names:
    if not os.path.exists(f"{n}.rc"):
        continue
    rc = int(open(f"{n}.rc").read().split("=")[1])
    t0, t1 = float(open(f"{n}.t0").read()), float(open(f"{n}.t1").read())
    err = [l.split(" ", 1) for l in open(f"{n}.err").read().splitlines()]
    out = open(f"{n}.out").read()
    past = [l for t, l in err if "past its cap" in l]
    stop_at = next((float(t) - t0 for t, l in err if "stopping the job" in l), None)
    named = sum("it ran without the shim" in l for _, l in err)
    stopped = re.findall(r"stopped after (\d+) ms, (\d+) pulses begun", out)
    if want[n] == "stop":
        ok = bool(past) and stop_at is not None and rc != 0 and named >= (6 if n == "c" else 1)
        how = (f"stopped {stop_at:.2f} s after run began; escape saw SIGTERM "
               + ", ".join(f"{ms} ms after its first allocation ({k} pulses begun)" for ms, k in stopped)
               + f"; named 'it ran without the shim' {named}x")
        # What nvidia-smi showed for each escape process while the case ran (its context alone at the least).
        for p in sorted({int(x) for x in re.findall(r"ready pid=(\d+)", out)}):
            seen = [d[p] for t, d in smi if p in d and t0 <= t <= t1]
            if seen:
                how += f"; pid {p} nvidia-smi {min(seen)}-{max(seen)} MiB ({len(seen)} samples)"
    else:
        done = re.findall(r"done pid=(\d+) steps=(\d+) reserved_max=(\d+) oom=(\d+)", out)
        # Every process ran to its end (bash's wait says 0 whatever its children did).
        ok = not past and rc == 0 and not any("exited with code" in l for _, l in err)
        # What each shim counted, from the report (LIVE AT END, in MiB; steady after warm-up in d and f).
        counted = {}
        try:
            rep = open(f"{n}.report.txt").read()
            for m in re.finditer(r"^\s+(\d+)\s+-\s+\S.*?\s([\d.]+) (MiB|GiB)\s+([\d.]+) (MiB|GiB)\s", rep, re.M):
                counted[int(m.group(1))] = float(m.group(4)) * (1024 if m.group(5) == "GiB" else 1)
        except OSError:
            pass
        how = (f"{'not flagged' if not past else 'FLAGGED: ' + past[0][:200]}; "
               + ", ".join(f"pid {p}: {s} steps, reserved max {int(r) / 2**20:.0f} MiB, {o} OOM" for p, s, r, o in done))
        # Each process's GPU figure less its reserve, over the samples between its ready and its done.
        samples = {}
        for m in re.finditer(r"(ready|sample) pid=(\d+) reserved=(\d+) t=([\d.]+)", out):
            samples.setdefault(int(m.group(2)), []).append((float(m.group(4)), int(m.group(3))))
        for p, ss in samples.items():
            lo, hi = ss[0][0], ss[-1][0]
            over = []
            for t, used in ((t, d[p]) for t, d in smi if p in d and lo <= t <= hi):
                r = min(ss, key=lambda s: abs(s[0] - t))[1]
                over.append(used - r / 2**20)
            if over:
                used = statistics.median([d[p] for t, d in smi if p in d and lo <= t <= hi])
                ctx.append((n, p, statistics.median(over), min(over), max(over), len(over), used,
                            counted.get(p) if n in ("d", "f") else None))
    rows.append((n, "yes" if ok else "NO", rc, f"{t1 - t0:.1f}", how))
    print(f"--- {n}: what run printed")
    for t, l in err:
        print(f"  [{float(t) - t0:6.2f} s] {l[:400]}")
print("| case | ok | rc | wall s | what happened |")
print("|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
if ctx:
    print("| case | pid | nvidia-smi less reserved, MiB: median (min-max, samples) | nvidia-smi median MiB | counted at end MiB | nvidia-smi less counted MiB |")
    print("|---|---|---|---|---|---|")
    for n, p, med, lo, hi, k, used, c in ctx:
        print(f"| {n} | {p} | {med:.0f} ({lo:.0f}-{hi:.0f}, {k}) | {used:.0f} | {c if c is not None else '-'} | {used - c if c is not None else '-'} |")
# Escape processes' own context, from the samples (what the GPU holds for a process of escape.c with nothing held).
PY
cp summary.md "$OUT/cap_pulses.md"
tar czf "$OUT/cap_pulses.tgz" --exclude='*.vtrace*' --exclude=escape . 2>/dev/null

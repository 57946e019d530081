#!/usr/bin/env bash
# The mission's headline on a machine of several GPUs: `vramtrace run --cap ... -- torchrun --nproc-per-node N`
# (DDP over NCCL, one process a GPU). Checks, per rank and device: the trace's per-device peak equals the
# rank's own torch.cuda.max_memory_reserved() plus what libraries hold outside it (reported, not hidden), the
# cap is the device size torch sees on every GPU, no device passes its cap, ranks are named in the report,
# and a rank driven past its cap is named in the post-mortem with cause `cap`.
# Usage (on the GPU machine): bash scripts/gpu/multi.sh DIR   (DIR: the carried build, see prepare.sh)
# Keeps NVLink multicast off (NCCL_NVLS_ENABLE=0), as the machine requires. Table last; always exits 0.
set -u
DIR=${1:-.gpu}
VT="$DIR/vramtrace"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vramtrace-multi-out}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/vramtrace-multi.XXXXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
CAP_GIB=8
CAP=$((CAP_GIB << 30))
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 | $4 |"); }
{
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$OUT/multi-log.txt"

run_job() { # name, extra args to the training script
    local name=$1
    shift
    timeout -k 10 240 "$VT" run --out "$WORK/$name.vtrace" --cap "${CAP_GIB}GiB" -- \
        python3 -m torch.distributed.run --standalone --nproc-per-node "$N" "$HERE/multi_train.py" "$@" >"$WORK/$name.out" 2>&1
    echo $? >"$WORK/$name.rc"
    "$VT" report --json "$WORK/$name.vtrace" >"$WORK/$name.json" 2>>"$WORK/$name.out"
    "$VT" oom --json "$WORK/$name.vtrace" >"$WORK/$name.oom.json" 2>>"$WORK/$name.out"
    "$VT" report "$WORK/$name.vtrace" >"$WORK/$name.report.txt" 2>&1
    cat "$WORK/$name.out" "$WORK/$name.report.txt" >>"$OUT/multi-log.txt"
}

run_job train
run_job oom --oom-rank 1

python3 - "$WORK" "$N" "$CAP" >"$WORK/rows.txt" 2>>"$OUT/multi-log.txt" <<'PY'
import json, re, sys
work, n, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(*r): print("\t".join(str(x) for x in r))
for name in ("train", "oom"):
    out = open(f"{work}/{name}.out").read()
    rc = open(f"{work}/{name}.rc").read().strip()
    rep = json.load(open(f"{work}/{name}.json"))
    res = {int(m[0]): dict(zip(("device", "reserved", "allocated", "total", "free"), map(int, m[1:])))
           for m in re.findall(r"RESULT rank=(\d+) device=(\d+) reserved=(\d+) allocated=(\d+) total=(\d+) free=(\d+)", out)}
    rows(name, "every rank reported, torchrun exit 0", f"{n} ranks, rc 0", f"{len(res)} ranks, rc {rc}",
         "yes" if len(res) == n and rc == "0" else "NO")
    devs = {d["device"]: d for d in rep["devices"]}
    procs = [p for p in rep["processes"] if p.get("rank") is not None]
    rows(name, "processes named by rank", f"ranks 0..{n-1}", sorted(p["rank"] for p in procs),
         "yes" if sorted(p["rank"] for p in procs) == list(range(n)) else "NO")
    # The rank driven past the cap reports its reservation again after its OOM phase: compare with that one.
    after = re.search(r"OOM rank=(\d+) held=\d+ reserved=(\d+)", out)
    if after and int(after.group(1)) in res:
        res[int(after.group(1))]["reserved"] = int(after.group(2))
    for r, x in sorted(res.items()):
        d = devs.get(x["device"], {})
        peak = d.get("peak_bytes", -1)
        rows(name, f"rank {r}: torch sees the cap as GPU {x['device']}'s size", cap, x["total"],
             "yes" if x["total"] == cap else "NO")
        rows(name, f"GPU {x['device']}: trace peak <= cap", f"<= {cap}", peak, "yes" if 0 < peak <= cap else "NO")
        lib = peak - x["reserved"]
        ok = lib >= 0
        rows(name, f"GPU {x['device']}: trace peak vs rank {r}'s max_memory_reserved", x["reserved"],
             f"{peak} (+{lib} outside PyTorch's allocator: libraries, NCCL)", "yes" if ok else "NO")
    if name == "oom":
        ooms = json.load(open(f"{work}/{name}.oom.json")).get("ooms", [])
        m = re.search(r"OOM rank=(\d+) held=(\d+)", out)
        rows(name, "rank 1 met torch.OutOfMemoryError under the cap", "OOM rank=1", m.group(0) if m else "none",
             "yes" if m and m.group(1) == "1" else "NO")
        pids = {p["pid"]: p.get("rank") for p in rep["processes"]}
        causes = sorted({(o["cause"], pids.get(o["pid"])) for o in ooms})
        rows(name, "oom: every OOM is the cap's, on rank 1", "[('cap', 1)]", causes,
             "yes" if causes == [("cap", 1)] else "NO")
PY
echo
echo "| job | checked | expected | got | pass |" | tee "$OUT/multi-table.md"
echo "|---|---|---|---|---|" | tee -a "$OUT/multi-table.md"
while IFS=$'\t' read -r a b c d e; do echo "| $a | $b | $c | $d | $e |"; done <"$WORK/rows.txt" | tee -a "$OUT/multi-table.md"
printf '\nyes: %s, NO: %s\n' "$(grep -c $'\tyes$' "$WORK/rows.txt")" "$(grep -c $'\tNO$' "$WORK/rows.txt")" | tee -a "$OUT/multi-table.md"
exit 0

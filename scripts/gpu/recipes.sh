#!/usr/bin/env bash
# The fleet recipes of docs/FLEETS.md, as far as one machine allows (issue 12). Needs 2 GPUs.
#  1. torchrun across nodes: two "nodes" as two UTS namespaces (hostnames node-a, node-b), each GPU its own node,
#     each running the recipe's command: `vramtrace run --metrics PORT --job-name recipe --out trace-$(hostname)
#     -- torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT ...` (DDP
#     over NCCL between the nodes; `--local-addr 127.0.0.1`: the namespaces' hostnames resolve nowhere, where
#     real nodes' do). Checks: both traces name the job; each node's metrics, scraped while it
#     trains, carry its host, job and rank; `vramtrace report --json` of both gives one device per host, ranks 0
#     and 1 on their hosts, each host's peak at least that rank's torch.cuda.max_memory_reserved(); `vramtrace
#     oom --json` of both finds no out-of-memory record on either host.
#  2. Kubernetes without `vramtrace run`: two "containers" of one pod preload the shim with VRAMTRACE_CAP=12GiB
#     and one VRAMTRACE_LEDGER on a shared tmpfs: the first holds 8 GiB, the second asks for 8 GiB more and gets
#     torch.OutOfMemoryError (the pod's cap, shared), a third with a ledger of its own gets its 8 GiB.
# Usage: bash scripts/gpu/recipes.sh DIR   (DIR: the carried build, prepare.sh). Table last; always exits 0.
set -u
DIR=$(cd "${1:-.gpu}" && pwd)
VT="$DIR/vramtrace"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/vramtrace-recipes-out}"
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vramtrace-recipes.XXXXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUT/recipes-log.txt"
: >"$LOG"
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 | $4 | $5 |"); }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >>"$LOG" 2>&1

# ---- 1. torchrun across two nodes ----
uts=yes
unshare --uts true 2>>"$LOG" || uts=no
node() { # name, gpu, node rank, metrics port
    local name=$1 gpu=$2 nr=$3 port=$4
    local cmd="exec env CUDA_VISIBLE_DEVICES=$gpu \"$VT\" run --metrics $port --job-name recipe --out \"$W/trace-\$(hostname).vtrace\" -- \
        python3 -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $nr --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29517 --rdzv-id recipe --local-addr 127.0.0.1 \"$HERE/multi_train.py\" --steps 200"
    if [ "$uts" = yes ]; then
        timeout -k 10 300 unshare --uts sh -c "hostname $name && $cmd" >"$W/$name.out" 2>&1
    else
        timeout -k 10 300 sh -c "$cmd" >"$W/$name.out" 2>&1
    fi
    echo $? >"$W/$name.rc"
}
# A scrape of each node while it trains: the first answer that names a rank.
scrape() { # port, file
    for _ in $(seq 120); do
        if curl -s "http://127.0.0.1:$1/metrics" >"$2.tmp" 2>/dev/null && grep -q 'vramtrace_memory_used_bytes{.*rank=' "$2.tmp"; then
            mv "$2.tmp" "$2"
            return
        fi
        sleep 0.5
    done
}
node node-a 0 0 9461 &
a=$!
node node-b 1 1 9462 &
b=$!
scrape 9461 "$W/metrics-a.txt" &
scrape 9462 "$W/metrics-b.txt" &
wait $a $b
wait
for n in node-a node-b; do
    { echo "== $n (rc $(cat "$W/$n.rc"))"; cat "$W/$n.out"; } >>"$LOG"
done
ls "$W" >>"$LOG"
traces=$(ls "$W"/trace-*.vtrace 2>/dev/null | sort)
"$VT" report $traces >>"$LOG" 2>&1
"$VT" report --json $traces >"$W/job.json" 2>>"$LOG"
"$VT" oom --json $traces >"$W/oom.json" 2>>"$LOG"
echo $? >"$W/oom.rc"
cat "$W/oom.json" "$W"/metrics-*.txt >>"$LOG" 2>/dev/null
python3 - "$W" "$uts" >"$W/rows.txt" 2>>"$LOG" <<'PY'
import json, os, re, sys
w, uts = sys.argv[1], sys.argv[2]
def rows(*r): print("\t".join(str(x) for x in r))
hosts = ["node-a", "node-b"] if uts == "yes" else [os.uname().nodename]
outs = {n: open(f"{w}/{n}.out").read() for n in ("node-a", "node-b")}
rcs = {n: open(f"{w}/{n}.rc").read().strip() for n in outs}
res = {}
for n, o in outs.items():
    for m in re.findall(r"RESULT rank=(\d+) device=(\d+) reserved=(\d+)", o):
        res[int(m[0])] = (n, int(m[2]))
rows("torchrun", "both nodes trained (RESULT from ranks 0 and 1, exit 0)", "ranks [0, 1], rc 0 0",
     f"ranks {sorted(res)}, rc {rcs['node-a']} {rcs['node-b']}",
     "yes" if sorted(res) == [0, 1] and set(rcs.values()) == {"0"} else "NO")
try:
    j = json.load(open(f"{w}/job.json"))
except Exception as e:
    j = {}
    rows("torchrun", "report --json of both traces", "one job", f"failed: {e}", "NO")
if j:
    key = j["job"]["key"]
    rows("torchrun", "both traces name the job", "job recipe", key, "yes" if key == "job recipe" else "NO")
    # GPUs only: a device of null is memory on no GPU (NCCL's host buffers from cuMemCreate).
    dh = sorted((d.get("host"), d["device"]) for d in j["devices"] if d["device"] is not None)
    rows("torchrun", "devices per host", [(h, 0) for h in hosts] if uts == "yes" else "2 devices",
         dh, "yes" if (uts == "yes" and dh == [(h, 0) for h in hosts]) or (uts != "yes" and len(dh) == 2) else "NO")
    ranks = sorted((r["rank"], r["host"]) for r in j["job"]["ranks"])
    want = [(0, hosts[0]), (1, hosts[-1])]
    rows("torchrun", "ranks across hosts", want, ranks, "yes" if ranks == want else "NO")
    for r, (n, reserved) in sorted(res.items()):
        host = n if uts == "yes" else hosts[0]
        peaks = [d["peak_bytes"] for d in j["devices"] if d.get("host") == host and d["device"] is not None]
        peak = max(peaks) if peaks else -1
        rows("torchrun", f"{host}: device peak vs rank {r}'s max_memory_reserved", f">= {reserved}",
             f"{peak} (+{peak - reserved} outside PyTorch's allocator: NCCL, cuBLAS)", "yes" if peak >= reserved else "NO")
    try:
        o = json.load(open(f"{w}/oom.json"))
        recs = [(h["host"], h["oom_records"]) for h in o["hosts"]]
    except Exception as e:
        recs = f"failed: {e}"
    want = [(h, 0) for h in hosts] if uts == "yes" else "2 hosts, 0 records"
    rows("torchrun", "vramtrace oom --json of both: no out-of-memory on either host", want, recs,
         "yes" if isinstance(recs, list) and len(recs) == 2 and all(r == 0 for _, r in recs) else "NO")
for tag, n in (("a", "node-a"), ("b", "node-b")):
    p = f"{w}/metrics-{tag}.txt"
    body = open(p).read() if os.path.exists(p) else ""
    lines = [l for l in body.splitlines() if l.startswith("vramtrace_memory_used_bytes{")]
    host = n if uts == "yes" else hosts[0]
    ok = bool(lines) and all('job="recipe"' in l and f'host="{host}"' in l for l in lines) and \
        any('rank="0"' in l or 'rank="1"' in l for l in lines)
    rows("torchrun", f"{n}'s metrics while it trains: job, host, rank labels", f'job="recipe" host="{host}" rank',
         lines[0][:160] if lines else "no scrape", "yes" if ok else "NO")
PY

# ---- 2. Kubernetes: one pod's containers share one cap through the ledger ----
mkdir -p /dev/shm/vt-pod "$W/own"
pod() { # name, ledger dir, hold seconds
    env LD_PRELOAD="$DIR/libvramtrace.so" VRAMTRACE_CAP=12GiB VRAMTRACE_LEDGER="$2/cap" CUDA_VISIBLE_DEVICES=0 \
        python3 -c '
import sys, time, torch
try:
    x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print(f"{sys.argv[1]} HELD total={torch.cuda.mem_get_info()[1]}", flush=True)
    time.sleep(float(sys.argv[2]))
except torch.OutOfMemoryError as e:
    print(f"{sys.argv[1]} OOM {str(e).splitlines()[0][:120]}", flush=True)
' "$1" "$3" >"$W/$1.out" 2>&1
}
pod first /dev/shm/vt-pod 8 &
p1=$!
sleep 4
pod second /dev/shm/vt-pod 0
pod third "$W/own" 0
wait $p1
cat "$W"/first.out "$W"/second.out "$W"/third.out >>"$LOG"
f=$(cat "$W/first.out") s=$(cat "$W/second.out") t=$(cat "$W/third.out")
cap=$((12 << 30))
[[ "$f" == *"HELD total=$cap"* ]] && ok=yes || ok=NO
row k8s "container 1 holds 8 GiB; torch sees the pod's cap as the GPU's size" "HELD total=$cap" "${f:0:80}" $ok
[[ "$s" == *OOM* ]] && ok=yes || ok=NO
row k8s "container 2 (same ledger) asks for 8 GiB more: refused by the pod's cap" "OOM" "${s:0:100}" $ok
[[ "$t" == *HELD* ]] && ok=yes || ok=NO
row k8s "a container with a ledger of its own gets its 8 GiB" "HELD" "${t:0:80}" $ok
rm -rf /dev/shm/vt-pod

echo
echo "| recipe | checked | expected | got | pass |" | tee "$OUT/recipes-table.md"
echo "|---|---|---|---|---|" | tee -a "$OUT/recipes-table.md"
while IFS=$'\t' read -r a b c d e; do echo "| $a | $b | $c | $d | $e |"; done <"$W/rows.txt" | tee -a "$OUT/recipes-table.md"
printf '%s\n' "${ROWS[@]}" | tee -a "$OUT/recipes-table.md"
[ "$uts" = yes ] || echo "(unshare --uts was refused: both nodes ran with this machine's hostname)" | tee -a "$OUT/recipes-table.md"
printf '\nyes: %s, NO: %s\n' "$(grep -c '| yes |' "$OUT/recipes-table.md")" "$(grep -c '| NO |' "$OUT/recipes-table.md")" | tee -a "$OUT/recipes-table.md"
exit 0

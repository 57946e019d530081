#!/usr/bin/env bash
# Issue 27 on a real GPU: the GPUs are named as NVIDIA's tools name them. A PyTorch process and the Rust workload
# (the driver API alone) run under `vramtrace run --metrics`; while the PyTorch one holds its memory, the status
# file `top` reads (the owner's, in $XDG_RUNTIME_DIR/vramtrace) and every /metrics series must carry the UUID `nvidia-smi` gives for its GPU, and afterwards `report --json`
# must name each device by it. Prints one line a check, then `uuid: N yes, M NO`.
#   Usage: bash scripts/gpu/uuid.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so, vramtrace-workload)
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-uuid-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-uuid.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
unset CUDA_VISIBLE_DEVICES
nvidia-smi --query-gpu=index,uuid --format=csv,noheader >smi.csv
nvidia-smi -L >smi-L.txt
PORT=$((20000 + RANDOM % 20000))
export XDG_RUNTIME_DIR="$W/rt"
mkdir -m 700 "$XDG_RUNTIME_DIR"
cat >hold.py <<'PY'
import sys, time, torch
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
PY
"$DIR/vramtrace" run --metrics "127.0.0.1:$PORT" --out torch.vtrace -- python3 hold.py 6 >torch.out 2>torch.err &
RUN=$!
for _ in $(seq 1 100); do grep -q holding torch.out 2>/dev/null && break; sleep 0.1; done
sleep 1.5
python3 - "$PORT" "$XDG_RUNTIME_DIR/vramtrace/$RUN.status.json" <<'PY' >scrape.txt 2>&1
import sys, urllib.request
port, status = sys.argv[1], sys.argv[2]
print("== /status.json")
print(open(status).read())
with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
    print("== /metrics")
    print(r.read().decode())
PY
wait $RUN
echo "run rc $?" >>torch.out
"$DIR/vramtrace" run --out rust.vtrace -- "$DIR/vramtrace-workload" --steps 5 >rust.out 2>rust.err
"$DIR/vramtrace" report --json torch.vtrace >torch.report.json 2>>torch.err
"$DIR/vramtrace" report --json rust.vtrace >rust.report.json 2>>rust.err
python3 - <<'PY' | tee "$OUT/uuid.txt"
import csv, json, re
smi = {int(i): u.strip() for i, u in csv.reader(open("smi.csv"))}
print("nvidia-smi:", smi)
yes = no = 0
def check(what, got, want):
    global yes, no
    ok = got == want
    yes += ok; no += not ok
    print(f"{'yes' if ok else 'NO '}  {what}: {got!r} (nvidia-smi {want!r})")
text = open("scrape.txt").read()
status = json.loads(text.split("== /status.json\n")[1].split("== /metrics\n")[0])
for g in status["gpus"]:
    check(f"status file GPU {g['gpu']}", g["uuid"], smi.get(g["gpu"]))
metrics = text.split("== /metrics\n")[1]
series = [l for l in metrics.splitlines() if l.startswith("vramtrace_") and 'gpu="' in l and 'gpu=""' not in l]
for l in series[:64]:
    gpu = int(re.search(r'gpu="(\d+)"', l).group(1))
    uuid = re.search(r'uuid="([^"]*)"', l).group(1)
    check("/metrics " + l.split("{")[0] + f" gpu {gpu}", uuid, smi.get(gpu))
print(f"({len(series)} series with a gpu label)")
for name in ("torch", "rust"):
    r = json.load(open(f"{name}.report.json"))
    for d in r["devices"]:
        if d["device"] is not None:
            check(f"{name} report --json device {d['device']}", d.get("uuid"), smi.get(d["device"]))
print(f"uuid: {yes} yes, {no} NO")
PY
tar czf "$OUT/uuid.tgz" ./*.vtrace ./*.out ./*.err ./*.json ./*.txt ./*.csv 2>/dev/null

#!/usr/bin/env bash
# Issue 37 on a real GPU: the live metrics count out-of-memory errors as the report does, because they are an
# observer of the report's own replay. A PyTorch process, under `vramtrace run --metrics`, asks for more than the
# GPU has four times (each PyTorch's OutOfMemoryError, caught: the driver's refusals behind each fold into it),
# recovers in between, then waits; /metrics is scraped while it waits and again just before it ends, and after
# the job `report --json` is read. Prints one line a check, then `live_errors: N yes, M NO`.
#   Usage: bash scripts/gpu/live_errors.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
W=$(mktemp -d /tmp/vt-liveerr.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
PORT=$((20000 + RANDOM % 20000))
cat >job.py <<'PY'
import time, torch
total = torch.cuda.get_device_properties(0).total_memory
keep = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda")]
for i in range(4):
    try:
        torch.empty(total + (i << 30), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    keep.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))   # goes on: recovered
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(6)
PY
cat >scrape.py <<'PY'
import sys, time, urllib.request
url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
def total(body, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in body.splitlines() if l.startswith(name + "{"))
for _ in range(200):
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        break
    except Exception:
        time.sleep(0.05)
print(int(total(body, "vramtrace_oom_total")), int(total(body, "vramtrace_oom_refusals_total")))
PY
"$DIR/vramtrace" run -q --metrics "127.0.0.1:$PORT" -o job.vtrace --force -- python3 job.py >job.out 2>&1 &
RUN=$!
for _ in $(seq 1 600); do grep -q ready job.out 2>/dev/null && break; sleep 0.1; done
sleep 1
read -r live_err live_ref < <(python3 scrape.py "$PORT")
wait $RUN
rep=$("$DIR/vramtrace" report --json job.vtrace | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['oom_records'])")
yes=0; no=0
check() { if [ "$2" = "$3" ]; then echo "yes  $1: live $2, report $3"; yes=$((yes+1)); else echo "NO   $1: live $2, report $3"; no=$((no+1)); fi; }
check "errors (PyTorch's four, caught)" "$live_err" "$rep"
check "errors are PyTorch's own count" "$live_err" "4"
[ "$live_ref" -ge "$live_err" ] && { echo "yes  the driver's refusals behind them: $live_ref"; yes=$((yes+1)); } || { echo "NO   refusals $live_ref < errors $live_err"; no=$((no+1)); }
echo "live_errors: $yes yes, $no NO"

#!/usr/bin/env bash
# Session 59: the live metrics after they became a reading of the report's own replay (64fde90: /metrics reads the
# replay's observers at each scrape; a GPU's cap and total follow the report's rule). On a real PyTorch job:
#   1. scripts/gpu/live_errors.sh as it is (out-of-memory counts live against the report);
#   2. a job under `vramtrace run --cap 8GiB --metrics`: PyTorch tensors of several sizes, some freed, the cache
#      emptied, a child process that allocates 512 MiB and ends, then more tensors; it prints `ready` and waits.
#      /metrics is scraped while it waits (after its last allocation, so at the job's end as far as allocations
#      go), and `report --json` of the trace is read after the job. Per GPU: vramtrace_device_peak,
#      vramtrace_allocations, vramtrace_cap and vramtrace_device_total against the report's device peak_bytes,
#      allocations, cap_bytes and total_bytes; PyTorch's own max_memory_reserved and mem_get_info total (under
#      the cap, the cap: the shim's answer) beside them.
# Prints one line a check, then `s59_live: N yes, M NO` last. The job's files go to $OUT/s59-live.tgz.
#   Usage: bash scripts/gpu/s59_live.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so)
set -u
DIR=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/vramtrace-s59-live-out}
mkdir -p "$OUT"
echo "=== live_errors.sh"
bash "$HERE/live_errors.sh" "$DIR" 2>&1 | tee "$OUT/live_errors.txt"
W=$(mktemp -d /tmp/vt-s59live.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so" PYTHONUNBUFFERED=1
PORT=$((20000 + RANDOM % 20000))
cat >job.py <<'PY'
import json, subprocess, sys, time, torch
MiB = 1 << 20
a = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (64, 256, 1024, 3, 700)]
a[2].fill_(1)
del a[1:3]
torch.cuda.empty_cache()                      # the 256 and 1024 MiB segments go back to the driver
subprocess.run([sys.executable, "-c",
                "import torch; t = torch.empty(512 << 20, dtype=torch.uint8, device='cuda'); "
                "torch.cuda.synchronize()"], check=True)
b = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (2048, 128, 16)]
torch.cuda.synchronize()
print("torch", json.dumps({"max_reserved": torch.cuda.max_memory_reserved(), "reserved": torch.cuda.memory_reserved(),
                           "segments": torch.cuda.memory_stats()["segment.all.allocated"],
                           "total": torch.cuda.mem_get_info()[1]}), flush=True)
print("ready", flush=True)
time.sleep(6)
PY
cat >scrape.py <<'PY'
import json, re, sys, time, urllib.request
url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
body = ""
for _ in range(200):
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        break
    except Exception:
        time.sleep(0.05)
open("metrics.txt", "w").write(body)
got = {}
pat = re.compile(r'^(vramtrace_[a-z_]+)\{([^}]*)\} (\S+)$')
for line in body.splitlines():
    m = pat.match(line)
    if not m:
        continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
    got.setdefault(m.group(1), {})[labels.get("gpu", "")] = int(float(m.group(3)))
print(json.dumps(got))
PY
"$DIR/vramtrace" run -q --cap 8GiB --metrics "127.0.0.1:$PORT" -o job.vtrace --force -- python3 job.py >job.out 2>&1 &
RUN=$!
for _ in $(seq 1 900); do grep -q ready job.out 2>/dev/null && break; sleep 0.1; done
sleep 1.5
python3 scrape.py "$PORT" >live.json
wait $RUN
echo "run's exit: $?" >>job.out
"$DIR/vramtrace" report --json job.vtrace >report.json 2>report.err
"$DIR/vramtrace" report job.vtrace >report.txt 2>&1
cat job.out
python3 - <<'PY'
import json
live = json.load(open("live.json"))
rep = json.load(open("report.json"))
pt = json.loads(next(l for l in open("job.out") if l.startswith("torch ")).split(" ", 1)[1])
yes = no = 0
def fam(name):
    for k in (name, name + "_bytes", name + "_total"):  # OpenMetrics adds the unit, or _total to a counter
        if k in live:
            return live[k]
    return {}
print("live families:", sorted(live))
print("PyTorch's own (parent):", pt)
for d in rep["devices"]:
    g = str(d["device"]) if d["device"] is not None else ""
    pairs = [("vramtrace_device_peak", "peak_bytes"), ("vramtrace_allocations", "allocations"),
             ("vramtrace_cap", "cap_bytes"), ("vramtrace_device_total", "total_bytes")]
    for m, k in pairs:
        lv = fam(m).get(g)
        rv = d.get(k)
        ok = lv == rv and rv is not None
        print("%s  gpu %s %s: live %s, report %s %s" % ("yes" if ok else "NO ", g, m, lv, k, rv))
        yes, no = (yes + 1, no) if ok else (yes, no + 1)
    print("     gpu %s report: driver_total_bytes %s, driver_free_bytes %s, live_bytes_at_end %s, processes %d"
          % (g, d.get("driver_total_bytes"), d.get("driver_free_bytes"), d.get("live_bytes_at_end"),
             len(rep.get("processes") or [])))
    if g == "0":
        ok = d.get("cap_bytes") == 8 << 30
        print("%s  gpu 0 cap is the 8 GiB asked: %s" % ("yes" if ok else "NO ", d.get("cap_bytes")))
        yes, no = (yes + 1, no) if ok else (yes, no + 1)
        # Under --cap the shim answers cuMemGetInfo with the cap as the total (PyTorch's mem_get_info total is the
        # cap), while the report's total is the GPU's own, as the driver gave it to the shim (session 59's run
        # first wanted the two equal: the script's mistake, mended here).
        ok = pt["total"] == 8 << 30 and (d.get("total_bytes") or 0) > pt["total"]
        print("%s  gpu 0: PyTorch's mem_get_info total is the cap (%s), the report's total the GPU's own (%s)"
              % ("yes" if ok else "NO ", pt["total"], d.get("total_bytes")))
        yes, no = (yes + 1, no) if ok else (yes, no + 1)
        ok = d["peak_bytes"] >= pt["max_reserved"]
        print("%s  gpu 0 peak %s >= the parent's own max_memory_reserved %s (the child's 512 MiB beside)"
              % ("yes" if ok else "NO ", d["peak_bytes"], pt["max_reserved"]))
        yes, no = (yes + 1, no) if ok else (yes, no + 1)
print("s59_live: %d yes, %d NO" % (yes, no))
PY
tar czf "$OUT/s59-live.tgz" job.py job.out metrics.txt live.json report.json report.txt job.vtrace 2>/dev/null
rm -rf "$W"

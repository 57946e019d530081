#!/usr/bin/env bash
# Issue 25 on a real GPU: exits of processes their own parents reap (torchrun's agent, a shell), reported by the
# parent's shim, checked by the collector against the kernel's word, named in the summary; and a hostile
# process of the job (forger) refused. A Python parent that never touches CUDA starts two PyTorch workers with
# subprocess and reaps them itself: one dies of a CUDA out-of-memory error (exit 1), one is SIGKILLed after
# allocating. The parent ends 0.
#   Usage: bash scripts/gpu/reaped.sh DIR      (DIR: the carried build: vramtrace, libvramtrace.so, forger)
set -u
DIR=$(cd "$1" && pwd)
OUT=${OUT:-/tmp/vramtrace-reaped-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/vt-reaped.XXXX)
cd "$W" || exit 1
export VRAMTRACE_SHIM="$DIR/libvramtrace.so"
cat >worker.py <<'PY'
import os, signal, sys, torch
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
if sys.argv[1] == "oom":
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
os.kill(os.getpid(), signal.SIGKILL)
PY
cat >agent.py <<'PY'
import subprocess, sys
ps = [subprocess.Popen([sys.executable, "worker.py", w]) for w in ("oom", "kill")]
print("workers", " ".join(str(p.pid) for p in ps), flush=True)
print("codes", " ".join(str(p.wait()) for p in ps), flush=True)
PY
"$DIR/vramtrace" run --out agent.vtrace -- python3 agent.py >agent.out 2>agent.err
echo "run rc $?" >>agent.out
"$DIR/vramtrace" report --json agent.vtrace >agent.report.json 2>>agent.err
"$DIR/vramtrace" run --out forger.vtrace -- "$DIR/forger" speak 1 2 >forger.out 2>forger.err
echo "run rc $?" >>forger.out
{
  echo "== agent (stdout)"; cat agent.out
  echo "== agent (vramtrace's summary)"; grep '^vramtrace:' agent.err
  echo "== agent: exits in report --json"
  python3 - <<'PY'
import json
r = json.load(open("agent.report.json"))
for p in r.get("processes", []):
    print(p.get("pid"), " ".join(p.get("cmdline", [])[:2]), p.get("exit"))
PY
  echo "== forger"; cat forger.out; grep '^vramtrace:' forger.err
} | tee "$OUT/reaped.txt"
tar czf "$OUT/reaped.tgz" ./*.vtrace ./*.out ./*.err ./*.json 2>/dev/null

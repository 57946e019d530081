#!/usr/bin/env bash
# Portable traces (issue 53) on a real GPU: a small PyTorch program (caching off, so each tensor is its own
# cudaMalloc and its own call site) runs under `DIR/vramtrace run`; the trace, the run's stderr (with
# VRAMTRACE_DEBUG: how many native frames `run` named and how long that took) and `report --json` as read there
# come back in $OUT. Read on the development machine, where neither libc10_cuda.so nor libtorch_cuda.so exists,
# the report must name those libraries' frames by function as it did there.
#
# Usage (on the GPU machine, from the repository root):  bash scripts/gpu/portable.sh DIR
#   DIR holds the carried build: vramtrace, libvramtrace.so (scripts/gpu/prepare.sh makes .gpu).
# Also times `report` there on the trace with and without its names (kind 20 taken out), 3 runs each.

set -u
DIR="${1:-.gpu}"
OUT="${OUT:-/tmp/vramtrace-gpu-out}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/vramtrace-portable.XXXXXX)"
cat >"$WORK/portable_case.py" <<'EOF'
import torch

x = torch.randn(4096, 4096, device="cuda")
layers = [torch.randn(2048, 2048, device="cuda") for _ in range(4)]
y = x @ x
z = torch.nn.functional.relu(y).sum()
torch.cuda.synchronize()
print("ok", float(z) != 0, torch.cuda.max_memory_allocated())
EOF
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$OUT/gpu.txt"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
TIMEFORMAT=%R
took=$({ time VRAMTRACE_DEBUG=1 timeout 240 "$DIR/vramtrace" run --out "$OUT/portable.vtrace" -- \
    python3 "$WORK/portable_case.py" >"$OUT/run-stdout.txt" 2>"$OUT/run-stderr.txt"; } 2>&1)
echo "run: $took s" | tee -a "$OUT/gpu.txt"
grep -a "named .* native frames" "$OUT/run-stderr.txt" | tee -a "$OUT/gpu.txt"
cat "$OUT/run-stdout.txt"
"$DIR/vramtrace" report --json "$OUT/portable.vtrace" >"$OUT/there.json"
python3 - "$OUT/portable.vtrace" "$WORK/unnamed.vtrace" <<'EOF'
import struct, sys
b = open(sys.argv[1], 'rb').read()
pos = 14 + struct.unpack_from('<I', b, 10)[0]
out = bytearray(b[:pos])
while pos + 5 <= len(b):
    n = struct.unpack_from('<I', b, pos)[0]
    if b[pos + 4] != 20:
        out += b[pos:pos + 4 + n]
    pos += 4 + n
open(sys.argv[2], 'wb').write(out)
print("trace", len(b), "bytes;", len(b) - len(out), "of names")
EOF
for i in 1 2 3; do
    for f in "$OUT/portable.vtrace" "$WORK/unnamed.vtrace"; do
        took=$({ time "$DIR/vramtrace" report "$f" >/dev/null 2>&1; } 2>&1)
        echo "report $(basename "$f") $took s"
    done
done | tee -a "$OUT/gpu.txt"
rm -rf "$WORK"
exit 0

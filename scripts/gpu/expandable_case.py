#!/usr/bin/env python3
"""PyTorch's expandable segments (cuMemCreate + cuMemMap chunks) under `vramtrace run --cap`, for
scripts/gpu/expandable.sh (issue 10): 256 MiB tensors held until the cap refuses, then everything freed and the
cache emptied (the handles unmapped and released), then 3/4 of the cap again. Prints one RESULT line."""
import os
import subprocess

import torch

MiB = 1 << 20
assert "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
free, total = torch.cuda.mem_get_info()
held, reserved_max, err = [], 0, ""
try:
    while True:
        held.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
        reserved_max = max(reserved_max, torch.cuda.memory_reserved())
except torch.OutOfMemoryError as e:
    err = type(e).__name__
held_bytes = len(held) * 256 * MiB
smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout
mine = [int(l.split(",")[1]) for l in smi.splitlines() if l.split(",")[0].strip() == str(os.getpid())]
held.clear()
torch.cuda.empty_cache()
after_release = torch.cuda.memory_reserved()
again = torch.empty(3 * total // 4, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"RESULT total_seen={total} held_at_oom={held_bytes} reserved_max={reserved_max} error={err} "
      f"nvidia_smi_used_mib={mine[0] if mine else -1} reserved_after_release={after_release} "
      f"again_bytes={again.numel()}", flush=True)

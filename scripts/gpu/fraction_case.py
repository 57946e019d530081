#!/usr/bin/env python3
"""PyTorch under its own limit, torch.cuda.set_per_process_memory_fraction (session 58's final build, the
framework_limit rule of commit 2d27ab8; scripts/gpu/s58_final.sh runs it under `vramtrace run`).

    python3 fraction_case.py [FRACTION] [MiB]      (defaults 0.03 and 512)

Sets the fraction (0.03 of an H200 is about 4.2 GiB), then keeps tensors of MiB each until PyTorch raises
OutOfMemoryError. PyTorch's allocator refuses such a request itself, before any driver call, once its bytes
plus the request pass fraction x the device's total (the total cudaMemGetInfo gives: the same as
torch.cuda.mem_get_info()[1]). Prints PyTorch's own figures at the error on one line (`RESULT k=v ...`): the
fraction, the device's total, the allowed bytes as PyTorch computes them (int(fraction * total)), the request,
memory_allocated, memory_reserved, max_memory_reserved, memory_stats' num_ooms and num_alloc_retries, the tensors
kept; then the error's own words (`ERROR ...`), then raises the error again, uncaught (the program dies of it, as
a real one would: exit 1).
"""
import sys

import torch

fraction = float(sys.argv[1]) if len(sys.argv) > 1 else 0.03
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 512
dev = torch.device("cuda", 0)
torch.cuda.init()
torch.cuda.set_per_process_memory_fraction(fraction, 0)
free, total = torch.cuda.mem_get_info(0)
allowed = int(fraction * float(total))  # c10's allowed_memory_maximum: static_cast<size_t>(fraction * total)
req = mib << 20
kept = []
try:
    while True:
        t = torch.empty(req // 4, dtype=torch.float32, device=dev)
        t.fill_(1.0)  # touched, not only reserved
        kept.append(t)
except torch.OutOfMemoryError as e:
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats(0)
    print(
        "RESULT "
        + " ".join(
            "%s=%s" % kv
            for kv in (
                ("fraction", fraction),
                ("get_fraction", getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: None)(0)),
                ("total", total),
                ("free_at_start", free),
                ("allowed", allowed),
                ("requested", req),
                ("kept", len(kept)),
                ("allocated", torch.cuda.memory_allocated(0)),
                ("reserved", torch.cuda.memory_reserved(0)),
                ("max_reserved", torch.cuda.max_memory_reserved(0)),
                ("num_ooms", st.get("num_ooms", 0)),
                ("retries", st.get("num_alloc_retries", 0)),
            )
        ),
        flush=True,
    )
    print("ERROR " + " ".join(str(e).split()), flush=True)
    raise

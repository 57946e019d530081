"""One run for scripts/gpu/peaks.sh (issue 53): GPT-2 small built from its config (12 layers, 768 wide, random
weights: no download), batch 8 x 512 tokens, AdamW, STEPS steps, each synchronised. Prints one line last,
`TORCH {json}`: PyTorch's own max_memory_allocated() and max_memory_reserved() at the end, or at the
out-of-memory error (then exits 1), with the allocator it ran with.
    python3 peaks_case.py STEPS [--reset] [--cost]
--reset: the program resets its peak counters after every step (as benchmarks and per-epoch reports do); the
figures printed are then the most it read over the steps, the run's own peak.
--cost: after the steps, the cost of reading the stats: the nested dict the bridge reads
(torch._C._cuda_memoryStats, which holds the peaks too) against torch.cuda.memory_stats()."""
import json
import os
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

steps = int(sys.argv[1])
reset = "--reset" in sys.argv
out = {
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
    "torch": torch.__version__,
}
best = [0, 0]  # with --reset: the most read before each reset
done = 0
outcome = "finished"
torch.manual_seed(0)
try:
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda()
    out["backend"] = torch.cuda.get_allocator_backend()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
    for i in range(steps):
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        done += 1
        if reset:
            best = [max(best[0], torch.cuda.max_memory_allocated()), max(best[1], torch.cuda.max_memory_reserved())]
            torch.cuda.reset_peak_memory_stats()
except Exception as e:  # torch.OutOfMemoryError; with caching off, C10_CUDA_CHECK's error
    if "out of memory" not in str(e):
        raise
    outcome = "oom"
    out["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:160])
out.update(
    outcome=outcome,
    steps=done,
    max_allocated=max(best[0], torch.cuda.max_memory_allocated()),
    max_reserved=max(best[1], torch.cuda.max_memory_reserved()),
    allocated_now=torch.cuda.memory_allocated(),
)
if "--cost" in sys.argv and outcome == "finished":
    def median_us(fn, n=400):
        ts = []
        for _ in range(n):
            t = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t)
        return round(statistics.median(ts) / 1000.0, 2)

    raw = torch._C._cuda_memoryStats
    out["cost_us"] = {
        "raw_nested_stats": median_us(lambda: raw(0)),
        "raw_plus_peaks": median_us(lambda: (raw(0)["allocated_bytes"]["all"]["peak"])),
        "memory_stats": median_us(lambda: torch.cuda.memory_stats(0)),
    }
print("TORCH " + json.dumps(out), flush=True)
sys.exit(0 if outcome == "finished" else 1)

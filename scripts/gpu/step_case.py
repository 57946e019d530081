"""One training run for scripts/gpu/step_cost.sh: GPT-2 small (12 layers, 768 wide, random weights: no download),
batch 8 x 512 tokens, AdamW, WARM steps then STEPS timed ones, each step synchronised. Prints one JSON line:
the timed steps' milliseconds and the CUDA memory calls' count is left to the trace.
    python3 step_case.py STEPS WARM"""
import json
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

steps, warm = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
ms = []
for i in range(warm + steps):
    torch.cuda.synchronize()
    t = time.perf_counter()
    loss = model(x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if i >= warm:
        ms.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"step_ms": ms}), flush=True)

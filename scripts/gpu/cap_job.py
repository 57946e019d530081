"""A well-behaved process of a capped job, for scripts/gpu/cap_pulses.sh (issue 50, item 4: no false positive).

    python3 cap_job.py train MIB SECS     a Linear + matmul training loop (cuBLAS loaded) over about MIB of tensors,
                                          SECS seconds; the caching allocator's reserve stays steady
    python3 cap_job.py conv MIB SECS      the same with a convolution too (cuDNN and cuBLAS loaded)
    python3 cap_job.py churn LO HI SECS   near its cap: each step takes a tensor of LO..HI MiB, a matmul on it, frees
                                          it and empties the cache (the driver sees every allocation and free)

Prints `ready pid=P reserved=R t=T` once warm, then `sample pid=P reserved=R t=T` every 0.5 s, and `done pid=P
steps=N reserved_max=R oom=K` at the end; exit 0 unless something other than an out-of-memory error was raised.
"""
import os
import random
import sys
import time

import torch

mode = sys.argv[1]
pid = os.getpid()
dev = "cuda"
oom = 0
steps = 0
rmax = 0


def say(what):
    global rmax
    r = torch.cuda.memory_reserved()
    rmax = max(rmax, r)
    print(f"{what} pid={pid} reserved={r} t={time.time():.3f}", flush=True)


if mode in ("train", "conv"):
    mib, secs = int(sys.argv[2]), float(sys.argv[3])
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(dev)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).to(dev) if mode == "conv" else None
    opt = torch.optim.SGD(list(model.parameters()) + (list(conv.parameters()) if conv else []), lr=1e-3)
    # The rest of the MIB as data held through the run (float32, 4 bytes each).
    data = torch.randn(max(mib - 24, 1) << 18, device=dev)
    x = torch.randn(512, 1024, device=dev)
    img = torch.randn(8, 16, 64, 64, device=dev) if conv else None
    t_end = time.time() + secs
    t_say = 0.0
    while time.time() < t_end:
        loss = model(x).square().mean() + (x @ x.T).mean() * 1e-6
        if conv is not None:
            loss = loss + conv(img).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        data.mul_(0.999)
        steps += 1
        if steps == 5:
            torch.cuda.synchronize()
            say("ready")
        if time.time() >= t_say:
            torch.cuda.synchronize()
            say("sample")
            t_say = time.time() + 0.5
        time.sleep(0.005)
elif mode == "churn":
    lo, hi, secs = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    a = torch.randn(1024, 1024, device=dev)
    (a @ a).sum().item()
    say("ready")
    t_end = time.time() + secs
    t_say = 0.0
    rng = random.Random(pid)
    while time.time() < t_end:
        try:
            t = torch.empty(rng.randint(lo, hi) << 20, dtype=torch.uint8, device=dev)
            t.fill_(1)
            (a @ a).sum().item()
            if time.time() >= t_say:
                say("sample")
                t_say = time.time() + 0.5
            del t
        except torch.OutOfMemoryError:
            oom += 1
        torch.cuda.empty_cache()
        steps += 1
torch.cuda.synchronize()
print(f"done pid={pid} steps={steps} reserved_max={rmax} oom={oom}", flush=True)

"""The Python bridge's GPU cases (scripts/gpu/bridge.sh runs each under `vramtrace run`). Each prints one line
`RESULT key=value ...` with PyTorch's own figures at the moment that matters, for the script to compare with what
vramtrace recorded.

    frag      one large cached segment carved into tensors, every other freed, then a request no free block
              can serve: PyTorch's figures at the error (reserved, allocated, inactive split, largest free block)
    keep      a training loop that keeps every step's output, under a cap: allocated rises step by step
    backward  a graph whose backward pass needs more than the forward: the OOM happens on autograd's thread
    huge      a request larger than the whole device
    step      training-step timing (for the overhead comparison): prints the median step time
    jax       JAX arrays held to the end: XLA's bytes_in_use, as the bridge's exit figures should say
    forked    multiprocessing children started with fork, each allocating 256 MiB through torch and ending in
              os._exit (as multiprocessing's children do): their allocations must be in the trace
    osexit    256 MiB allocated through torch, then os._exit(0) at once
    sampler   the bridge's steady cost inside one process: one sample's cost, and training steps with its
              sampler running against paused, in interleaved blocks (run-to-run noise between processes, about
              0.7% on an H100, is larger than the effect)
"""
import os
import sys
import time

import torch

import bridge_parts  # scripts/gpu: the bridge's parts, wherever its build keeps them

GiB = 1 << 30
MiB = 1 << 20


def result(**kw):
    print("RESULT " + " ".join("%s=%s" % (k, v) for k, v in kw.items()), flush=True)


def snapshot_figures(dev=0):
    largest = 0
    stuck = 0
    for seg in torch.cuda.memory._snapshot()["segments"]:
        if seg["device"] != dev:
            continue
        live = any(b["state"] != "inactive" for b in seg["blocks"])
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                largest = max(largest, b["size"])
                if live:
                    stuck += b["size"]
    return largest, stuck


def frag():
    free, total = torch.cuda.mem_get_info()
    n = int(free * 0.68) // GiB  # GiB in the one segment
    x = torch.empty(n * GiB, dtype=torch.uint8, device="cuda")
    del x  # cached, not freed
    parts = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    for i in range(0, n, 2):
        parts[i] = None
    ask = int(n * 0.64) * GiB
    try:
        torch.empty(ask, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        s = torch.cuda.memory_stats()
        largest, stuck = snapshot_figures()
        result(
            case="frag",
            oom=1,
            asked=ask,
            allocated=s["allocated_bytes.all.current"],
            reserved=s["reserved_bytes.all.current"],
            inactive_split=s["inactive_split_bytes.all.current"],
            retries=s["num_alloc_retries"],
            largest_free=largest,
            stuck_free=stuck,
        )
        sys.exit(3)
    result(case="frag", oom=0)


def keep():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = []
    step = 0
    try:
        while True:
            x = torch.randn(2048, 4096, device="cuda")
            out = model(x)  # the line whose tensors are kept
            loss = out.float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(out)  # the bug: keeps the output (and its graph) alive
            step += 1
            torch.cuda.synchronize()
            time.sleep(0.05)
    except torch.OutOfMemoryError:
        s = torch.cuda.memory_stats()
        result(case="keep", oom=1, steps=step, allocated=s["allocated_bytes.all.current"],
               reserved=s["reserved_bytes.all.current"])
        sys.exit(3)


def backward():
    n = 16384
    a = torch.randn(n, n, device="cuda", requires_grad=True)
    b = torch.randn(n, n, device="cuda", requires_grad=True)
    loss = (a @ b).sum()
    torch.cuda.synchronize()
    try:
        loss.backward()
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        s = torch.cuda.memory_stats()
        result(case="backward", oom=1, allocated=s["allocated_bytes.all.current"])
        sys.exit(3)
    result(case="backward", oom=0)


def huge():
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        result(case="huge", oom=1, asked=1 << 40, total=torch.cuda.mem_get_info()[1])
        sys.exit(3)
    result(case="huge", oom=0)


def _model():
    torch.manual_seed(0)
    d = 2048
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * d, d)) for _ in range(4)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, d, device="cuda")
    return model, opt, x


def _one(model, opt, x):
    torch.cuda.synchronize()
    t = time.perf_counter()
    loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def step():
    model, opt, x = _model()
    times = []
    for i in range(int(os.environ.get("STEPS", "80"))):
        dt = _one(model, opt, x)
        if i >= 20:
            times.append(dt)
    times.sort()
    result(case="step", median_ms="%.4f" % (times[len(times) // 2] * 1e3), steps=len(times))


def sampler():
    sample_device, start_sampler = bridge_parts.get("sample_device"), bridge_parts.get("start_sampler")
    state, interval_ms = bridge_parts.state(), bridge_parts.get("interval_ms")

    model, opt, x = _model()
    for _ in range(20):
        _one(model, opt, x)
    # One sample: read the stats and send them (force: as if they changed).
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        sample_device(0, force=True)
    sample_us = (time.perf_counter() - t) / n * 1e6
    on, off = [], []
    for block in range(40):
        running = block % 2 == 0
        if running:
            start_sampler()
        else:
            state["thread"] = None  # the sampler stops at its next wake-up
            time.sleep(0.05)
        for _ in range(12):
            (on if running else off).append(_one(model, opt, x))
    on.sort()
    off.sort()
    m_on, m_off = on[len(on) // 2], off[len(off) // 2]
    result(case="sampler", sample_us="%.1f" % sample_us, interval_ms=interval_ms(),
           on_ms="%.4f" % (m_on * 1e3), off_ms="%.4f" % (m_off * 1e3),
           pct="%+.3f" % ((m_on / m_off - 1) * 100))


def jax_case():
    import jax
    import jax.numpy as jnp

    xs = [jnp.ones((64, 1024, 1024), dtype=jnp.float32) for _ in range(3)]
    for x in xs:
        x.block_until_ready()
    stats = jax.devices()[0].memory_stats()
    result(case="jax", bytes_in_use=stats["bytes_in_use"])
    globals()["kept"] = xs


def _child(q):
    t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    q.put(os.getpid())
    del t


def forked():
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(q,)) for _ in range(3)]
    for p in procs:
        p.start()
    pids = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(120)
    result(case="forked", pids=",".join(str(p) for p in pids))


def osexit():
    t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    result(case="osexit", pid=os.getpid())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    {"frag": frag, "keep": keep, "backward": backward, "huge": huge, "step": step,
     "sampler": sampler, "jax": jax_case, "forked": forked, "osexit": osexit}[sys.argv[1]]()

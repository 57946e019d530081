"""One process of scripts/gpu/bridge_cost.sh (issue 49): the wall time per iteration of small loops, each counted by
a different hook of the Python bridge. Each case warms up for WARM seconds, then times iterations for RUN seconds;
every timed sample ends with torch.cuda.synchronize(). Prints one JSON line: per case the median microseconds per
iteration, the samples' count and spread, and whether the bridge's hooks are in this process.
    python3 bridge_cost_case.py CASES WARM RUN       (CASES: a comma-separated list of the names below)

Cases (fp32 256x256 unless said; the order matters under the bridge: scopes count and read a boundary only while
no optimizer step and no DataLoader batch has been seen, so the no_grad cases run first and train last):
  with       `with torch.no_grad(): y = x @ w`, synchronised every iteration (the worst case: tens of us a step)
  deco       the same through a function decorated `@torch.no_grad()`
  inf        `with torch.inference_mode(): y = x @ w`, synchronised every iteration
  with_async `with torch.no_grad(): y = x @ w`, 100 iterations a sample, synchronised at its end (the CPU's cost)
  big        `with torch.no_grad(): y = a @ b`, bf16 4096x4096 (a realistic inference step)
  loader     one batch of 32 x 256 from a DataLoader over a CPU TensorDataset, moved to the GPU, `@ w`
  train      Linear(256, 256) on 64 x 256, loss, backward, AdamW step, zero_grad
"""
import json
import statistics
import sys
import time

import torch

names = sys.argv[1].split(",")
warm_s, run_s = float(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
dev = "cuda"
x = torch.randn(256, 256, device=dev)
w = torch.randn(256, 256, device=dev)
a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)


def with_step():
    with torch.no_grad():
        y = x @ w
    return y


@torch.no_grad()
def deco_step():
    return x @ w


def inf_step():
    with torch.inference_mode():
        y = x @ w
    return y


def big_step():
    with torch.no_grad():
        y = a @ b
    return y


def make_loader():
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(4096, 256))
    dl = DataLoader(ds, batch_size=32, shuffle=False)
    state = {"it": iter(dl)}

    def step():
        try:
            (batch,) = next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            (batch,) = next(state["it"])
        return batch.to(dev) @ w

    return step


def make_train():
    model = torch.nn.Linear(256, 256).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    xt = torch.randn(64, 256, device=dev)

    def step():
        loss = model(xt).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(step, chunk):
    sync = torch.cuda.synchronize
    pc = time.perf_counter_ns
    end = pc() + int(warm_s * 1e9)
    while pc() < end:
        for _ in range(chunk):
            step()
        sync()
    us = []
    end = pc() + int(run_s * 1e9)
    while True:
        t0 = pc()
        for _ in range(chunk):
            step()
        sync()
        t1 = pc()
        us.append((t1 - t0) / chunk / 1e3)
        if t1 > end:
            break
    us.sort()
    n = len(us)
    return {"med": statistics.median(us), "p10": us[n // 10], "p90": us[(9 * n) // 10], "n": n * chunk}


makers = {
    "with": lambda: (with_step, 1),
    "deco": lambda: (deco_step, 1),
    "inf": lambda: (inf_step, 1),
    "with_async": lambda: (with_step, 100),
    "big": lambda: (big_step, 1),
    "loader": lambda: (make_loader(), 1),
    "train": lambda: (make_train(), 1),
}
out = {}
for name in names:
    step, chunk = makers[name]()
    out[name] = measure(step, chunk)


def hooked():
    """Whether the bridge's three step hooks are in this process (they are installed on import, so after the
    cases ran every module is loaded)."""
    h = {"no_grad": bool(getattr(torch.no_grad.__enter__, "_vramtrace", False))}
    h["inference_mode"] = bool(getattr(torch.inference_mode.__enter__, "_vramtrace", False))
    try:
        import torch.utils.data.dataloader as dl

        h["dataloader"] = bool(getattr(dl._BaseDataLoaderIter.__next__, "_vramtrace", False))
    except Exception:
        h["dataloader"] = None
    try:
        import torch.optim.optimizer as om

        h["optimizer_post_hooks"] = len(om._global_optimizer_post_hooks)
    except Exception:
        h["optimizer_post_hooks"] = None
    try:
        try:  # the step counters' home since 2026-11-29 (before: _torch._steps)
            from vramtrace_bridge import _steps as vs

            s = vs.counters
        except ImportError:
            from vramtrace_bridge import _torch as vt

            s = vt._steps
        h["counts"] = [s.optimizer, s.batches, s.scopes, s.reads]
    except Exception:
        h["counts"] = None
    return h


print(json.dumps({"cases": out, "hooks": hooked()}), flush=True)

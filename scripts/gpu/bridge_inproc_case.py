#!/usr/bin/env python3
"""The Python bridge's cost per step, inside ONE process (scripts/gpu/bridge_inproc.sh runs it under `vramtrace
run`, the bridge on by default). Cross-process measures (bridge_cost.sh) resolve a few us at best: each process
lands in one of two speed modes of the machine. Here the bridge's step hooks are switched off and on between
blocks of one process, so both arms share the process, its allocator, its clocks and its caches.

What the bridge installs for the step counting (bridge/vramtrace_bridge/_steps.py, the same file in c6bf344 and
after the split of _torch.py), and how this script switches each without touching the product's code:
  - a global optimizer post-step hook, `_steps.on_optimizer_step`, in
    torch.optim.optimizer._global_optimizer_post_hooks: off = popped from that dict, on = put back (same key);
  - a wrapped `torch.utils.data.dataloader._BaseDataLoaderIter.__next__` (marked `_vramtrace`, the real one its
    `__wrapped__`): off = the real one set back on the class, on = the wrapper;
  - wrapped `__enter__` of torch.no_grad and torch.inference_mode (likewise): off / on the same way.
Everything else of the bridge (its sampler thread, the shim below it) runs in both arms: "on - off" is what the
step hooks add to a step, boundary readings included (a hook's step boundary reads the allocator's figures, at
most BOUNDARY_SHARE of the program's time, after the first 64).

Cases, in this order (the order matters: scopes are the step count only while no optimizer step and no batch was
seen, batches only while no optimizer step was; so each case counts as a program of that kind would):
  no_grad    `with torch.no_grad(): y = x @ w`  (16x16 fp32 on the GPU)
  inference  `with torch.inference_mode(): y = x @ w`
  loader     one batch of 8 x 16 from a DataLoader over an in-memory TensorDataset (restarted when exhausted)
  optimizer  `opt.step()` of SGD (momentum 0.9) on a Linear(16, 16) on the GPU, its gradients set once
  aa         the optimizer case again with the hooks ON in both arms: the method's own zero (an A/A control)
  train      a realistic step: a DataLoader batch (64 x 512, CPU) to the GPU, MLP 512-1024-1024-10, cross
             entropy, backward, AdamW step, zero_grad
Between cases the previous case's optimizer and dataset are released, so the next one is "the first seen" (the
bridge counts the first optimizer and the first dataset only).

Each case: a warm-up (hooks on, then off; past the bridge's 64 free boundary readings), a calibration that sets
the iterations per block (at least MIN_ITERS, 2,000, or 200 for train; about BLOCK_MS of work), then PAIRS block
pairs in ABBA order (on off, off on, on off, ...). Per block (what the case built frozen out of the collector: gc.freeze()): gc.collect(), gc off, perf_counter_ns around the
iterations and a torch.cuda.synchronize() at the block's end, gc back on. Per pair: (on - off) / iterations, ns.
Prints a JSON line per case (`CASE {...}`), then a table: the median per-iteration difference, the 10th-90th
percentile of the pairs' differences, a bootstrap 95% interval of the median, the arms' median ns per iteration,
and the step counters' movement in each arm (on > 0 and off = 0 proves the switch).
    python3 bridge_inproc_case.py [CASES]      (comma-separated; default all, in the order above)
    env: PAIRS (40), BLOCK_MS (40), MIN_ITERS (2000), TRAIN_MIN_ITERS (200), LABEL (a name for the output),
         THREADS (torch.set_num_threads; default torch's own)
"""
import gc
import json
import os
import random
import statistics
import sys
import time

import torch

PAIRS = int(os.environ.get("PAIRS", "40"))
BLOCK_MS = float(os.environ.get("BLOCK_MS", "40"))
MIN_ITERS = int(os.environ.get("MIN_ITERS", "2000"))
TRAIN_MIN_ITERS = int(os.environ.get("TRAIN_MIN_ITERS", "200"))
LABEL = os.environ.get("LABEL", "")
THREADS = int(os.environ.get("THREADS", "0"))  # torch's intra-op CPU threads (0: torch's default)
ALL = ["no_grad", "inference", "loader", "optimizer", "aa", "train"]
dev = "cuda"
if THREADS > 0:
    torch.set_num_threads(THREADS)
torch.manual_seed(0)
torch.cuda.init()
torch.zeros(1, device=dev)  # CUDA initialised: the bridge attaches and installs its step hooks

import torch.optim.optimizer as om  # noqa: E402
import torch.utils.data.dataloader as dlm  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Switch(object):
    """The bridge's step hooks, as installed, and the originals beneath them."""

    def __init__(self):
        self.steps = sys.modules.get("vramtrace_bridge._steps")
        if self.steps is None:
            raise SystemExit("NOBRIDGE vramtrace_bridge._steps is not loaded: run this under `vramtrace run`")
        hook = self.steps.on_optimizer_step
        self.opt_hooks = [(k, v) for k, v in om._global_optimizer_post_hooks.items() if v is hook]
        self.patched = []  # (class, attribute, wrapper, original)
        for cls, attr in ((dlm._BaseDataLoaderIter, "__next__"), (torch.no_grad, "__enter__"),
                          (torch.inference_mode, "__enter__")):
            w = cls.__dict__.get(attr)
            if w is not None and getattr(w, "_vramtrace", False):
                self.patched.append((cls, attr, w, w.__wrapped__))
        self.found = {"optimizer_hooks": len(self.opt_hooks),
                      "patched": ["%s.%s" % (c.__name__, a) for c, a, _, _ in self.patched]}
        if not self.opt_hooks or len(self.patched) != 3:
            raise SystemExit("NOBRIDGE the bridge's hooks are not all installed: %s" % json.dumps(self.found))
        self.on = True

    def set(self, on):
        if on == self.on:
            return
        d = om._global_optimizer_post_hooks
        for k, v in self.opt_hooks:
            if on:
                d[k] = v
            else:
                d.pop(k, None)
        for cls, attr, w, real in self.patched:
            setattr(cls, attr, w if on else real)
        self.on = on

    def counts(self):
        c = self.steps.counters
        return (c.optimizer, c.batches, c.scopes, c.reads)


def make_no_grad():
    x = torch.randn(16, 16, device=dev)
    w = torch.randn(16, 16, device=dev)

    def step():
        with torch.no_grad():
            y = x @ w
        return y

    return step, {}


def make_inference():
    x = torch.randn(16, 16, device=dev)
    w = torch.randn(16, 16, device=dev)

    def step():
        with torch.inference_mode():
            y = x @ w
        return y

    return step, {}


def _cycling(dl):
    state = {"it": iter(dl)}

    def batch():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            return next(state["it"])

    return batch, state


def make_loader():
    ds = TensorDataset(torch.randn(8192, 16))
    dl = DataLoader(ds, batch_size=8, shuffle=False)
    batch, state = _cycling(dl)

    def step():
        return batch()

    return step, {"ds": ds, "dl": dl, "state": state}


def make_optimizer():
    model = torch.nn.Linear(16, 16).to(dev)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def step():
        opt.step()

    return step, {"model": model, "opt": opt}


def make_train():
    ds = TensorDataset(torch.randn(8192, 512), torch.randint(0, 10, (8192,)))
    dl = DataLoader(ds, batch_size=64, shuffle=True)
    batch, state = _cycling(dl)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        xb, yb = batch()
        xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
        loss = lossf(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, {"ds": ds, "dl": dl, "state": state, "model": model, "opt": opt}


def block(step, n):
    """ns for n iterations of step, the GPU synchronised at the end."""
    gc.collect()
    gc.disable()
    try:
        pc = time.perf_counter_ns
        t0 = pc()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        return pc() - t0
    finally:
        gc.enable()


def pct(sorted_xs, q):
    if not sorted_xs:
        return float("nan")
    i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[i]


def bootstrap_median(xs, reps=4000, seed=0):
    rnd = random.Random(seed)
    n = len(xs)
    meds = sorted(statistics.median(rnd.choice(xs) for _ in range(n)) for _ in range(reps))
    return pct(meds, 0.025), pct(meds, 0.975)


def run_case(name, sw):
    maker = {"no_grad": make_no_grad, "inference": make_inference, "loader": make_loader,
             "optimizer": make_optimizer, "aa": make_optimizer, "train": make_train}[name]
    step, keep = maker()
    aa = name == "aa"
    # Warm-up: the hooks on, then off (the bridge's first 64 boundary readings are free: spent here or earlier).
    for on in (True, False):
        sw.set(on)
        t_end = time.perf_counter() + 0.3
        while time.perf_counter() < t_end:
            for _ in range(50):
                step()
        torch.cuda.synchronize()
    sw.set(True)
    gc.collect()
    gc.freeze()  # what exists now is left out of the blocks' collections: each block's gc.collect() stays short
    lo = TRAIN_MIN_ITERS if name == "train" else MIN_ITERS
    probe = max(50, lo // 10)
    per_ns = block(step, probe) / probe
    n = max(lo, int(BLOCK_MS * 1e6 / per_ns))
    diffs, ons, offs = [], [], []
    moved = {"on": [0, 0, 0, 0], "off": [0, 0, 0, 0]}
    t_case = time.perf_counter()
    for k in range(PAIRS):
        order = (True, False) if k % 2 == 0 else (False, True)
        got = {}
        for on in order:
            sw.set(True if aa else on)
            c0 = sw.counts()
            got[on] = block(step, n) / n
            c1 = sw.counts()
            arm = moved["on" if on else "off"]
            for i in range(4):
                arm[i] += c1[i] - c0[i]
        sw.set(True)
        ons.append(got[True])
        offs.append(got[False])
        diffs.append(got[True] - got[False])
    sd = sorted(diffs)
    ci = bootstrap_median(diffs)
    res = {"case": name, "label": LABEL, "iters": n, "pairs": PAIRS, "seconds": round(time.perf_counter() - t_case, 2),
           "on_ns": statistics.median(ons), "off_ns": statistics.median(offs),
           "diff_med_ns": statistics.median(diffs), "diff_mean_ns": statistics.mean(diffs),
           "diff_p10_ns": pct(sd, 0.1), "diff_p90_ns": pct(sd, 0.9), "ci95_ns": ci,
           "diffs_ns": [round(d, 1) for d in diffs],
           "counts_moved": moved}  # (optimizer, batches, scopes, reads) summed over each arm's blocks
    print("CASE " + json.dumps(res), flush=True)
    keep.clear()
    del step, keep
    gc.unfreeze()
    gc.collect()
    return res


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else ALL
    sw = Switch()
    print("HOOKS " + json.dumps(sw.found), flush=True)
    print("ENV " + json.dumps({"torch": torch.__version__, "python": sys.version.split()[0], "label": LABEL,
                               "gpu": torch.cuda.get_device_name(0), "pid": os.getpid(), "threads": torch.get_num_threads(),
                               "affinity": sorted(os.sched_getaffinity(0))}), flush=True)
    rows = [run_case(nm, sw) for nm in names]
    sw.set(True)
    print("COUNTS " + json.dumps(sw.counts()), flush=True)
    print()
    print("| case | iters/block | on ns/iter | off ns/iter | on - off ns (median of %d pairs) | p10 .. p90 | bootstrap 95%% | counts moved on / off (opt, batches, scopes, reads) |" % PAIRS)
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %.0f | %.0f | **%+.0f** | %+.0f .. %+.0f | %+.0f .. %+.0f | %s / %s |" % (
            r["case"], r["iters"], r["on_ns"], r["off_ns"], r["diff_med_ns"], r["diff_p10_ns"], r["diff_p90_ns"],
            r["ci95_ns"][0], r["ci95_ns"][1], r["counts_moved"]["on"], r["counts_moved"]["off"]))


if __name__ == "__main__":
    main()

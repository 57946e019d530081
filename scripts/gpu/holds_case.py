"""Issue 35 on a real GPU: verdicts in the program's own terms (scripts/gpu/holds.sh runs each case under
`vramtrace run`). Growth is counted in the program's steps (optimizer steps, else DataLoader batches), and at an
out-of-memory error the bridge names what holds the CUDA tensors. Each case prints `RESULT key=value ...` lines
with what the program itself measured: its steps, the bytes it kept a step (torch.cuda.memory_allocated() at the
same point of every step, from step 2 to the last), its wall time; the judge holds vramtrace's figures to them.

    keep_cap         Adam MLP (~150 MB of weights) keeping each step's output, 256 MiB, in a global `kept`;
                     --cap 6GiB: fails within 20 steps and 3 s. Expected: growth, ~256 MiB a step, `kept` first
    keep_free        the same at 32 MiB a step, 300 steps, no cap, no error: report's growth, exit walk names kept
    eval_graph       evaluation without no_grad(), `total = total + loss` over DataLoader batches, --cap 6GiB:
                     growth, holder the graph behind `total`
    losses_list      training that keeps every step's scalar loss tensor, 300 steps: no error, no (real) growth
    losses_then_big  100 such steps, then one tensor larger than --cap 4GiB: request_too_large/cap/pressure
    ddp_keep         torchrun DDP on every GPU (>= 2, else skipped), rank 1 keeps 128 MiB a step, --cap 6GiB:
                     growth on rank 1, the asymmetry against its peers named
    serve_double     GPT-2 (random weights) generate() with the batch doubling until --cap 6GiB: cap/pressure
    warmup_steady    a ~1 GiB model, Adam (state at step 1), torch.compile if it works, 200 steady steps: no growth
    steady_cap       a step whose activations reach 3.5 GiB under --cap 3GiB: cap/pressure, honest advice
    batch_too_large  GPT-2 LM with labels, AdamW, a batch too large for --cap 10GiB from step 1: cap/pressure,
                     advice "at least"
    cycle            64 MiB tensors kept by reference cycles with gc disabled, --cap 4GiB: holder kind cycle first
    cost_cpu         the bridge's cost on a CPU-bound step (8 Linear+GELU+LayerNorm blocks, batch 16, SGD), ms/step
    cost_gpu         the same on GPT-2 small forward+backward+AdamW, batch 8, seq 512
    walk_cost        the holders walk timed in a GPT-2-sized program with ~500,000 extra objects
    judge DIR [MD]   reads the cases' outputs and JSON in DIR, prints the markdown table (no torch needed),
                     also written to MD; notes go to DIR/judge-notes.txt
(frag is bridge_case.py's.)
"""
import json
import os
import re
import statistics
import sys
import time

GiB = 1 << 30
MiB = 1 << 20

# The cases' leaks live in globals of __main__, as a program's would: the holders walk must name them.
kept = []  # keep_cap, keep_free, ddp_keep: the outputs kept
losses = []  # losses_list, losses_then_big: every step's loss tensor
total = 0.0  # eval_graph: the running sum, a tensor carrying every batch's graph once the loop ran
extra = None  # walk_cost: ~500,000 extra Python objects
small = None  # walk_cost: 2,000 small CUDA tensors


def result(**kw):
    """One `RESULT key=value ...` line; values never contain spaces (the judge splits on them)."""
    parts = []
    for k, v in kw.items():
        if isinstance(v, float):
            v = "%.6g" % v
        v = str(v).replace(" ", "_") or "-"
        parts.append("%s=%s" % (k, v))
    print("RESULT " + " ".join(parts), flush=True)


class Meter(object):
    """The program's own figures: allocated bytes at the same point of every step (memory_allocated() reads the
    allocator's counters: no device sync), and the loop's wall time."""

    def __init__(self, torch):
        self.torch = torch
        self.alloc = []
        self.t0 = time.monotonic()

    def mark(self):
        self.alloc.append(self.torch.cuda.memory_allocated())

    def per_step(self):
        """Bytes kept a step from step 2 to the last (steps 1 and 2 create optimizer state, warm caches)."""
        a = self.alloc
        if len(a) < 3:
            return None
        return (a[-1] - a[1]) // (len(a) - 2)

    def figures(self):
        ps = self.per_step()
        return {"steps": len(self.alloc), "per_step_bytes": "?" if ps is None else ps,
                "seconds": "%.3f" % (time.monotonic() - self.t0),
                "allocated": self.alloc[-1] if self.alloc else 0}


def _oom_figures(torch):
    s = torch.cuda.memory_stats()
    return {"allocated_at_error": s.get("allocated_bytes.all.current", 0),
            "reserved_at_error": s.get("reserved_bytes.all.current", 0),
            "retries": s.get("num_alloc_retries", 0)}


def _mlp(torch, sizes):
    """Linear layers of `sizes` with a GELU between each two."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        if i:
            layers.append(torch.nn.GELU())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers).cuda()


def _params_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---- growth: kept outputs --------------------------------------------------------------------------------


def _keep_loop(name, batch, out_dim, steps):
    """An Adam MLP 1024 -> 4096 -> 4096 -> out_dim (~150 MB of weights) whose training loop keeps every step's
    output (batch x out_dim fp32) in the global `kept`."""
    import torch

    torch.manual_seed(0)
    model = _mlp(torch, [1024, 4096, 4096, out_dim])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    step_bytes = batch * out_dim * 4
    print("%s: weights %d B, %d B kept a step" % (name, _params_bytes(model), step_bytes), flush=True)
    m = Meter(torch)
    try:
        for _ in range(steps):
            x = torch.randn(batch, 1024, device="cuda")
            out = model(x)  # LINE-KEEP: the output kept below
            loss = out.pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            kept.append(out.detach())  # the bug: every step's output kept in a global list
            m.mark()
    except torch.OutOfMemoryError:
        result(case=name, oom=1, failed_in_step=len(m.alloc) + 1, kept=len(kept), nominal_step_bytes=step_bytes,
               pid=os.getpid(), **m.figures(), **_oom_figures(torch))
        sys.exit(3)
    torch.cuda.synchronize()
    result(case=name, oom=0, kept=len(kept), nominal_step_bytes=step_bytes, pid=os.getpid(), **m.figures())


def keep_cap():
    # 16384 x 4096 fp32 = 256 MiB a step; under a 6 GiB cap the fixed ~0.6 GiB (weights, grads, Adam) and the
    # step's ~1.5-2 GiB of activations leave room for ~16 kept outputs.
    _keep_loop("keep_cap", 16384, 4096, 60)


def keep_free():
    # 2048 x 4096 fp32 = 32 MiB a step, 300 steps: 9.4 GiB kept, no error on an 80 GB GPU.
    _keep_loop("keep_free", 2048, 4096, 300)


# ---- growth: an evaluation loop's graph ------------------------------------------------------------------


def eval_graph():
    """Evaluation without torch.no_grad(): `total = total + loss` keeps every batch's graph, and with it the
    activations autograd saved for a backward pass that never comes (~272 MiB a batch)."""
    global total
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = _mlp(torch, [1024, 4096, 4096, 10]).eval()  # parameters still require grad
    data = TensorDataset(torch.randn(8 * 4096, 1024), torch.randint(0, 10, (8 * 4096,)))
    loader = DataLoader(data, batch_size=4096, shuffle=False)
    m = Meter(torch)
    try:
        for _epoch in range(20):
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                loss = F.cross_entropy(model(x), y)
                total = total + loss  # the bug: a tensor with grad, summed across batches
                m.mark()
    except torch.OutOfMemoryError:
        result(case="eval_graph", oom=1, failed_in_batch=len(m.alloc) + 1, pid=os.getpid(), **m.figures(),
               **_oom_figures(torch))
        sys.exit(3)
    result(case="eval_graph", oom=0, pid=os.getpid(), **m.figures())


# ---- no growth: scalar losses kept ------------------------------------------------------------------------


def _losses_loop(torch, m, steps):
    torch.manual_seed(0)
    model = _mlp(torch, [1024, 4096, 4096, 1024])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(steps):
        x = torch.randn(1024, 1024, device="cuda")
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss)  # a scalar tensor (a 512-byte block), not .item(): tiny
        m.mark()
    return model, opt


def losses_list():
    import torch

    m = Meter(torch)
    _losses_loop(torch, m, 300)
    torch.cuda.synchronize()
    result(case="losses_list", oom=0, losses=len(losses), pid=os.getpid(), **m.figures())


def losses_then_big():
    import torch

    m = Meter(torch)
    model, opt = _losses_loop(torch, m, 100)
    ask = 5 * GiB  # more than the whole --cap 4GiB
    try:
        big = torch.empty(ask, dtype=torch.uint8, device="cuda")  # LINE-BIG
        big.fill_(0)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        result(case="losses_then_big", oom=1, asked=ask, pid=os.getpid(), **m.figures(), **_oom_figures(torch))
        sys.exit(3)
    result(case="losses_then_big", oom=0, asked=ask, pid=os.getpid(), **m.figures())


# ---- DDP: one rank keeps ----------------------------------------------------------------------------------


def _exit_now(code):
    """Exit without Python's teardown (a communicator left mid-collective can hang it): atexit's handlers first
    (the bridge's exit record and walk are among them), then os._exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import atexit

        atexit._run_exitfuncs()
    except Exception:
        pass
    sys.stdout.flush()
    os._exit(code)


def ddp_keep():
    """torchrun's workers: the same model on every rank; rank 1 only keeps each step's output (128 MiB). Rank 1
    runs out under the cap, exits at once (its peers are left waiting in an all-reduce: torchrun ends them when
    it sees rank 1 fail, the 60 s NCCL timeout if it does not, `timeout` around the run last); the other ranks
    stop after a fixed number of steps if nothing fails."""
    import datetime

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" not in os.environ or world < 2 or torch.cuda.device_count() < 2:
        result(case="ddp_keep", skipped=1, gpus=torch.cuda.device_count(), world=world)
        return
    local = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(local)
    timeout = datetime.timedelta(seconds=60)
    try:
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
    except TypeError:  # an older torch without device_id
        dist.init_process_group("nccl", timeout=timeout)
    torch.manual_seed(0)
    model = _mlp(torch, [1024, 4096, 8192])  # 4096 x 8192 fp32 output: 128 MiB
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    print("RANK rank=%d pid=%d world=%d device=%d" % (rank, os.getpid(), world, local), flush=True)
    m = Meter(torch)
    try:
        for step in range(150):
            x = torch.randn(4096, 1024, device="cuda")
            out = ddp(x)  # LINE-DDP
            loss = out.pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if rank == 1:
                kept.append(out.detach())  # the bug, on rank 1 only
            loss.item()  # a training loop's logging: one sync a step
            m.mark()
            if step % 10 == 9:
                print("PROGRESS rank=%d step=%d allocated=%d" % (rank, step + 1, m.alloc[-1]), flush=True)
    except torch.OutOfMemoryError:
        result(case="ddp_keep", rank=rank, oom=1, failed_in_step=len(m.alloc) + 1, kept=len(kept), world=world,
               pid=os.getpid(), nominal_step_bytes=4096 * 8192 * 4 if rank == 1 else 0, **m.figures(),
               **_oom_figures(torch))
        _exit_now(3)
    result(case="ddp_keep", rank=rank, oom=0, kept=len(kept), world=world, pid=os.getpid(), **m.figures())
    dist.destroy_process_group()


# ---- cap, pressure: no growth -----------------------------------------------------------------------------


def serve_double():
    """GPT-2 (GPT2Config(), random weights), eval, no_grad, generate() with the batch doubling every round
    (1, 2, 4, ...) until it no longer fits under the cap: each round needs more, nothing is kept."""
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().eval()
    prompt, new = 128, 128
    print("transformers %s torch %s prompt %d new %d" % (transformers.__version__, torch.__version__, prompt, new),
          flush=True)
    t0 = time.monotonic()
    batch, rounds, peaks = 1, 0, []
    try:
        while batch <= 4096:
            ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
            torch.cuda.reset_peak_memory_stats()
            t = time.monotonic()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=50256)
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
            print("ROUND batch=%d ok seconds=%.2f peak_allocated=%d tokens=%d" % (
                batch, time.monotonic() - t, peaks[-1], out.shape[1]), flush=True)
            del out, ids
            rounds += 1
            batch *= 2
    except torch.OutOfMemoryError:
        result(case="serve_double", oom=1, failed_batch=batch, rounds_ok=rounds,
               last_ok_peak=peaks[-1] if peaks else 0, seconds="%.2f" % (time.monotonic() - t0), pid=os.getpid(),
               **_oom_figures(torch))
        sys.exit(3)
    result(case="serve_double", oom=0, rounds_ok=rounds, seconds="%.2f" % (time.monotonic() - t0))


def warmup_steady():
    """A ~1 GiB model (16 Linear(4096, 4096)+GELU), Adam (its 2 GiB of state made at the first step), the model
    compiled with torch.compile when that works (else eager), then 200 steady steps keeping nothing: the rise of
    the first steps is warm-up, not growth."""
    import torch

    torch.manual_seed(0)
    d = 4096
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU())
                                  for _ in range(16)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)
    x = torch.randn(64, d, device="cuda")
    print("warmup_steady: weights %d B" % _params_bytes(model), flush=True)

    def step(fwd):
        loss = fwd(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    compiled = "off"
    fwd = model
    t = time.monotonic()
    if os.environ.get("VT_COMPILE", "1") != "0":
        try:
            fwd = torch.compile(model)
            step(fwd)  # compiles here
            torch.cuda.synchronize()
            compiled = "yes"
        except Exception as e:
            print("torch.compile failed, eager instead: %r" % (e,), flush=True)
            fwd = model
            compiled = "failed"
    compile_s = time.monotonic() - t
    m = Meter(torch)
    if compiled == "yes":
        m.mark()  # the compiled first step was step 1
    while len(m.alloc) < 200:
        step(fwd)
        m.mark()
    torch.cuda.synchronize()
    result(case="warmup_steady", oom=0, compiled=compiled, compile_seconds="%.1f" % compile_s, pid=os.getpid(),
           **m.figures())


def steady_cap():
    """A steady loop too big for the cap from its first step: seven Linear(2048, 2048) with six GELUs, batch
    32768: fourteen 256 MiB activations saved (3.5 GiB) against --cap 3GiB."""
    import torch

    torch.manual_seed(0)
    model = _mlp(torch, [2048] * 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(32768, 2048, device="cuda")
    m = Meter(torch)
    try:
        for _ in range(20):
            loss = model(x).pow(2).mean()  # LINE-STEADY
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            m.mark()
    except torch.OutOfMemoryError:
        result(case="steady_cap", oom=1, failed_in_step=len(m.alloc) + 1, pid=os.getpid(), **m.figures(),
               **_oom_figures(torch))
        sys.exit(3)
    result(case="steady_cap", oom=0, pid=os.getpid(), **m.figures())


def batch_too_large():
    """A Hugging Face-style loop: GPT-2 LM (GPT2Config(), random weights) with labels, AdamW, batches of 8
    sequences of 1024 tokens from a DataLoader: about 2 GB of activations a sequence, too large for --cap 10GiB
    from the first step."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    data = TensorDataset(torch.randint(0, 50257, (64, 1024)))

    def collate(rows):
        ids = torch.stack([r[0] for r in rows])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    loader = DataLoader(data, batch_size=8, shuffle=True, collate_fn=collate)
    m = Meter(torch)
    try:
        for batch in loader:
            batch = {k: v.cuda() for k, v in batch.items()}
            out = model(**batch)  # LINE-HF
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            m.mark()
    except torch.OutOfMemoryError:
        result(case="batch_too_large", oom=1, failed_in_step=len(m.alloc) + 1, batch=8, seq=1024,
               pid=os.getpid(), **m.figures(), **_oom_figures(torch))
        sys.exit(3)
    result(case="batch_too_large", oom=0, pid=os.getpid(), **m.figures())


def cycle():
    """64 MiB tensors kept by reference cycles (a dict holding itself) with the garbage collector off: nothing
    names them, only gc.get_referrers finds the dicts."""
    import gc

    import torch

    gc.disable()
    m = Meter(torch)
    try:
        for _ in range(200):
            a = {}
            a["self"] = a
            a["t"] = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")  # LINE-CYCLE
            del a  # the dict and its tensor stay, awaiting a collection that never runs
            m.mark()
            time.sleep(0.005)
    except torch.OutOfMemoryError:
        result(case="cycle", oom=1, failed_in_step=len(m.alloc) + 1, gc_enabled=int(gc.isenabled()),
               pid=os.getpid(), **m.figures(), **_oom_figures(torch))
        sys.exit(3)
    result(case="cycle", oom=0, pid=os.getpid(), **m.figures())


# ---- cost ------------------------------------------------------------------------------------------------


def _bridge_steps():
    """The bridge's own count of optimizer steps (proof its hook ran), or '-' without the bridge."""
    import bridge_parts  # scripts/gpu: the bridge's parts, wherever its build keeps them

    try:
        return bridge_parts.optimizer_steps()
    except Exception:
        return "?"


def _cpu_step(torch):
    """The CPU-bound training step of the cost cases: 8 small Linear+GELU+LayerNorm blocks, batch 16, SGD (so the
    bridge's optimizer hook runs every step)."""
    torch.manual_seed(0)
    d = 256
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.LayerNorm(d))
                                  for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(16, d, device="cuda")

    def step():
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def cost_cpu():
    import torch

    step = _cpu_step(torch)
    for _ in range(200):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):  # 2,000 timed steps in blocks of 100
        t = time.perf_counter()
        for _ in range(100):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / 100)
    result(case="cost_cpu", median_ms="%.5f" % (statistics.median(times) * 1e3),
           mean_ms="%.5f" % (statistics.mean(times) * 1e3), steps=2000, bridge_steps=_bridge_steps())


def cost_inproc():
    """The bridge's steady-state cost inside one traced process (run under `vramtrace run`): blocks of 100 steps of
    cost_cpu's CPU-bound loop, alternating the bridge on (its optimizer hook and boundary readings, its sampler)
    and paused (the hook taken out of PyTorch's global hooks, the sampler stopped), in ABBA order; each round's
    pair compared. Processes on a shared host differ by far more than 1% from run to run; blocks a few hundred
    milliseconds apart in one process do not."""
    import torch

    import bridge_parts

    if bridge_parts.module("_torch") is None:
        result(case="cost_inproc", skipped=1, why="no_bridge")
        return
    start_sampler, state = bridge_parts.get("start_sampler"), bridge_parts.state()
    from torch.optim import optimizer as O

    mine = {k: v for k, v in O._global_optimizer_post_hooks.items()
            if getattr(v, "__module__", "").startswith("vramtrace_bridge")}

    def bridge(on):
        if on:
            O._global_optimizer_post_hooks.update(mine)
            start_sampler()
        else:
            for k in mine:
                O._global_optimizer_post_hooks.pop(k, None)
            state["thread"] = None  # the sampler stops at its next look
        time.sleep(0.05)

    step = _cpu_step(torch)
    for _ in range(300):
        step()
    torch.cuda.synchronize()
    on, off = [], []
    rounds = int(os.environ.get("INPROC_ROUNDS", "24"))
    for r in range(rounds):
        for mode in ((True, False) if r % 2 == 0 else (False, True)):
            bridge(mode)
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(100):
                step()
            torch.cuda.synchronize()
            (on if mode else off).append((time.perf_counter() - t) / 100)
    bridge(True)
    pairs = [(a - b) / b * 100 for a, b in zip(on, off)]
    se = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else 0.0
    result(case="cost_inproc", rounds=rounds, on_ms="%.5f" % (statistics.median(on) * 1e3),
           off_ms="%.5f" % (statistics.median(off) * 1e3), median_pct="%.3f" % statistics.median(pairs),
           mean_pct="%.3f" % statistics.mean(pairs), se_pct="%.3f" % se, bridge_steps=_bridge_steps(),
           readings=bridge_parts.boundary_reads())


def cost_gpu():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 50257, (8, 512), device="cuda")

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    result(case="cost_gpu", median_ms="%.4f" % (statistics.median(times) * 1e3),
           mean_ms="%.4f" % (statistics.mean(times) * 1e3), steps=50, bridge_steps=_bridge_steps())


def walk_cost():
    """The holders walk's bound in a GPT-2-sized program: GPT-2 with AdamW after 3 steps, transformers imported
    widely, ~500,000 extra objects the walk must cross (a global), 2,000 small CUDA tensors in a dict; then the
    bridge's walk called directly, timed."""
    global extra, small
    import gc
    import importlib

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 50257, (4, 256), device="cuda")
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    # transformers imported widely (its lazy modules resolved), within 25 s.
    t = time.monotonic()
    imported = 0
    for mod in ("transformers.models.gpt2.modeling_gpt2", "transformers.generation", "transformers.pipelines",
                "transformers.trainer", "transformers.models.llama.modeling_llama",
                "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5",
                "transformers.models.mistral.modeling_mistral", "transformers.models.qwen2.modeling_qwen2",
                "transformers.models.vit.modeling_vit", "transformers.models.whisper.modeling_whisper",
                "transformers.models.clip.modeling_clip", "transformers.models.bart.modeling_bart",
                "transformers.models.roberta.modeling_roberta", "transformers.models.gemma.modeling_gemma"):
        if time.monotonic() - t > 25:
            break
        try:
            importlib.import_module(mod)
            imported += 1
        except Exception as e:
            print("import %s: %r" % (mod, e), flush=True)
    import_s = time.monotonic() - t
    # Up to 500,000 gc-tracked objects in all (WALK_OBJECTS: the program size; transformers alone brings
    # about 440,000): lists and dicts holding a list (a dict of atoms alone is not tracked).
    extra = []
    for i in range(max(0, int(os.environ.get("WALK_OBJECTS", "500000")) - len(gc.get_objects())) // 2):
        lst = [i]
        extra.append(lst)
        extra.append({"i": i, "l": lst})
    small = {i: torch.empty(256, device="cuda") for i in range(2000)}
    torch.cuda.synchronize()
    n_objects = len(gc.get_objects())
    try:
        import vramtrace_bridge._holders as H
    except Exception as e:
        result(case="walk_cost", error="import", gc_objects=n_objects)
        print("WALK import failed: %r" % (e,), flush=True)
        return
    runs = []
    for _ in range(2):  # the first walk is the one an error gets; the second for comparison
        t = time.perf_counter()
        r = H.walk(torch, deadline_s=1.0)
        dt = time.perf_counter() - t
        runs.append((dt, _walk_fields(r)))
        print("WALK seconds=%.4f raw=%s" % (dt, _short_repr(r)), flush=True)
    (dt, f), (dt2, f2) = runs
    holders = f.get("holders") if isinstance(f.get("holders"), list) else []
    first = holders[0] if holders and isinstance(holders[0], dict) else {}
    print("WALK partial_reason=%r" % (f.get("partial"),), flush=True)
    result(case="walk_cost", gc_objects=n_objects, seconds="%.4f" % dt, second_seconds="%.4f" % dt2,
           partial=int(bool(f.get("partial"))), tensors=f.get("tensors", "?"), objects=f.get("objects", "?"),
           elapsed_ms=f.get("elapsed_ms", "?"), holders=len(holders),
           first="%s:%s:%s" % (first.get("kind"), first.get("name"), first.get("bytes")),
           imported=imported, import_seconds="%.1f" % import_s, pid=os.getpid())


def _walk_fields(r):
    """The walk's result as a dict, whether it returned a dict, (key, value) pairs or an object."""
    if isinstance(r, dict):
        return r
    if isinstance(r, (list, tuple)):
        try:
            out = {}
            hs = {}
            for k, v in r:
                m = re.match(r"h\.(\d+)\.(\w+)$", str(k))
                if m:
                    hs.setdefault(int(m.group(1)), {})[m.group(2)] = v
                else:
                    out[k] = v
            if hs:
                out["holders"] = [hs[i] for i in sorted(hs)]
            if out.get("partial") in ("1", 1, True):
                out["partial"] = out.get("partial_reason") or "1"
            return out
        except Exception:
            pass
    return {k: getattr(r, k) for k in ("partial", "tensors", "objects", "elapsed_ms", "holders") if hasattr(r, k)}


def _short_repr(r):
    try:
        if isinstance(r, dict):
            return json.dumps(r, default=str)[:400]
    except Exception:
        pass
    return repr(r)[:400]


# ---- judging (no torch) ------------------------------------------------------------------------------------

NOTES = []


def note(s):
    NOTES.append(str(s))


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _load_json(path):
    text = _read(path)
    if text is None:
        return None, "missing"
    try:
        return json.loads(text), None
    except Exception as e:
        return None, "unreadable (%s)" % type(e).__name__


def _results(text):
    """The RESULT lines of a case's output, each a dict."""
    out = []
    for line in (text or "").splitlines():
        if line.startswith("RESULT "):
            d = {}
            for tok in line[7:].split():
                k, _, v = tok.partition("=")
                d[k] = v
            out.append(d)
    return out


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _b(n):
    """Bytes in words: 256.0 MiB."""
    n = _num(n)
    if n is None:
        return "?"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


def _short(s, n=120):
    s = str(s)
    return s if len(s) <= n else s[: n - 3] + "..."


def _cell(s, n=200):
    return _short(s, n).replace("|", "/").replace("\n", " ")


def _find_growths(obj, path="$"):
    """Every growth-like object in a JSON tree: a dict under a key `growth` or `leak` (or a finding of a leak
    kind) holding per_step_bytes, steps or rise_bytes. [(path, dict)]."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = "%s.%s" % (path, k)
            if isinstance(v, dict) and (k in ("growth", "leak") or k.endswith("_leak") or "leak" in str(v.get("kind", ""))) and \
                    any(x in v for x in ("per_step_bytes", "steps", "rise_bytes")):
                found.append((p, v))
            found.extend(_find_growths(v, p))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, dict) and "leak" in str(v.get("kind", "")) and \
                    any(x in v for x in ("per_step_bytes", "steps", "rise_bytes")):
                found.append(("%s[%d]" % (path, i), v))
            found.extend(_find_growths(v, "%s[%d]" % (path, i)))
    # one entry per object (a finding can be both under a key and a leak kind)
    seen, out = set(), []
    for p, v in found:
        if id(v) not in seen:
            seen.add(id(v))
            out.append((p, v))
    return out


def _find_key(obj, key, path="$"):
    """Every value under `key` anywhere in a JSON tree: [(path, value)]."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = "%s.%s" % (path, k)
            if k == key:
                found.append((p, v))
            found.extend(_find_key(v, key, p))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.extend(_find_key(v, key, "%s[%d]" % (path, i)))
    return found


def _per_step(g):
    """A growth's bytes a step: per_step_bytes, else rise_bytes / steps."""
    if not isinstance(g, dict):
        return None
    p = _num(g.get("per_step_bytes"))
    if p is None:
        r, s = _num(g.get("rise_bytes")), _num(g.get("steps"))
        if r is not None and s:
            p = r / s
    return p


def _holder_list(h):
    """A `holders` value (an object with a `holders` list, or the list itself) as a list of dicts, or None."""
    if isinstance(h, dict):
        h = h.get("holders")
    if isinstance(h, list):
        return [x for x in h if isinstance(x, dict)]
    return None


def _holder_str(x):
    if not x:
        return "none"
    return "%s %s %s" % (x.get("kind", "?"), _short(x.get("name", "?"), 60), _b(x.get("bytes")))


def _bad_advice(advice):
    """Advice that claims a size gets past or fits without saying 'at least'."""
    return [a for a in advice if re.search(r"gets past|\bfits\b", str(a)) and "at least" not in str(a)]


class Case(object):
    """What one case left in DIR: its output, RESULT lines, the four analyses."""

    def __init__(self, d, name):
        self.name = name
        self.d = d
        self.text = _read(os.path.join(d, name + ".out"))
        self.skipped = _read(os.path.join(d, name + ".skipped"))
        self.ran = self.text is not None
        self.res = _results(self.text)
        self.oj, self.oj_err = _load_json(os.path.join(d, name + ".oom.json"))
        self.rj, self.rj_err = _load_json(os.path.join(d, name + ".report.json"))
        self.oom_txt = _read(os.path.join(d, name + ".oom.txt")) or ""
        self.report_txt = _read(os.path.join(d, name + ".report.txt")) or ""
        m = re.search(r"^rc=(\d+)", self.text or "", re.M)
        self.rc = m.group(1) if m else "?"
        self.errors, self.errors_key = self._errors()
        self.e = self.errors[0] if self.errors else {}

    def _errors(self):
        oj = self.oj
        if not isinstance(oj, dict):
            return [], None
        for key in ("errors", "ooms"):
            v = oj.get(key)
            if isinstance(v, list):
                return [e for e in v if isinstance(e, dict)], key
        note("%s: oom --json has neither `errors` nor `ooms`; top-level keys: %s" % (self.name, sorted(oj)))
        return [], None

    def r(self, key, **match):
        """The last RESULT value of `key` (in lines matching `match`), or None."""
        val = None
        for d in self.res:
            if all(d.get(k) == str(v) for k, v in match.items()) and key in d:
                val = d[key]
        return val

    def nerrors(self):
        """Errors the program did not recover from: oom_records, else the length of the errors list."""
        if isinstance(self.oj, dict) and isinstance(self.oj.get("oom_records"), int):
            return self.oj["oom_records"]
        return len(self.errors) if self.oj is not None else None

    def cause(self, e=None):
        e = self.e if e is None else e
        c = e.get("cause")
        if c is None:
            m = re.search(r"CAUSE:\s*(\S+)", self.oom_txt)
            if m:
                return m.group(1) + " (text)"
        return c

    def advice(self, e=None):
        a = (self.e if e is None else e).get("advice")
        return [str(x) for x in a] if isinstance(a, list) else []

    def growth(self, e=None):
        g = (self.e if e is None else e).get("growth")
        return g if isinstance(g, dict) else None

    def holders(self, e=None):
        return _holder_list((self.e if e is None else e).get("holders"))

    def report_growths(self):
        return _find_growths(self.rj) if self.rj is not None else []

    def walks(self):
        """The report's walks (bridge.walks, else any `walks` list anywhere)."""
        rj = self.rj
        if not isinstance(rj, dict):
            return []
        b = rj.get("bridge")
        if isinstance(b, dict) and isinstance(b.get("walks"), list):
            return [w for w in b["walks"] if isinstance(w, dict)]
        out = []
        for _, v in _find_key(rj, "walks"):
            if isinstance(v, list):
                out.extend(w for w in v if isinstance(w, dict))
        return out

    def held_by_text(self):
        """The oom text's HELD BY section: its first lines."""
        lines = self.oom_txt.splitlines()
        for i, line in enumerate(lines):
            if "HELD BY" in line:
                return [x.strip() for x in lines[i:i + 4] if x.strip()]
        return []

    def dump(self):
        """The case's vramtrace figures into the notes (so a wrong judge can be fixed from the log)."""
        n = self.name
        if self.oj_err or self.rj_err:
            note("%s: oom.json %s, report.json %s" % (n, self.oj_err or "ok", self.rj_err or "ok"))
        if self.errors:
            e = self.e
            note("%s: %d error(s) under `%s`; errors[0] keys: %s" % (n, len(self.errors), self.errors_key, sorted(e)))
            g = self.growth()
            note("%s: cause %s (%s); growth %s" % (n, e.get("cause"), e.get("cause_rule"),
                                                   _short(json.dumps({k: g.get(k) for k in ("per_step_bytes", "steps",
                                                                                            "unit", "rise_bytes")})
                                                          if g else None, 200)))
            hs = self.holders()
            if hs is None:
                note("%s: errors[0].holders: %s" % (n, _short(repr(e.get("holders")), 200)))
            else:
                note("%s: holders: %s" % (n, "; ".join(_holder_str(h) for h in hs[:5])))
                if hs:
                    note("%s: holders[0] keys: %s; label: %s" % (n, sorted(hs[0]), _short(hs[0].get("label"), 150)))
            for i, a in enumerate(self.advice()[:3]):
                note("%s: advice[%d]: %s" % (n, i, _short(a, 300)))
        cause_line = re.search(r"^.*CAUSE:.*$", self.oom_txt, re.M)
        if cause_line:
            note("%s: text %s" % (n, cause_line.group(0).strip()))
        for line in self.held_by_text():
            note("%s: text %s" % (n, _short(line, 200)))
        for p, g in self.report_growths()[:3]:
            note("%s: report growth at %s: per_step %s, steps %s, unit %s, rise %s" % (
                n, p, _b(_per_step(g)), g.get("steps"), g.get("unit"), _b(g.get("rise_bytes"))))
        for w in self.walks()[:2]:
            note("%s: report walk at %s: %s ms, partial %s; %s" % (
                n, w.get("at"), w.get("elapsed_ms"), w.get("partial"),
                "; ".join(_holder_str(h) for h in (_holder_list(w) or [])[:3])))


def _err_pct(vt, ref):
    if vt is None or not ref:
        return None
    return (vt - ref) / ref * 100.0


def _per_step_cell(vt, ref, unit=None, steps=None):
    if vt is None:
        return "none"
    pct = _err_pct(vt, ref)
    s = "%s/step" % _b(vt)
    if steps is not None:
        s += " over %s" % steps
    if unit:
        s += " %s" % unit
    if pct is not None:
        s += " (%+.1f%%)" % pct
    return s


def _prog_cell(c, case=None, extra_keys=()):
    match = {"case": case} if case else {}
    steps = c.r("steps", **match)
    ps = c.r("per_step_bytes", **match)
    parts = []
    if steps is not None:
        parts.append("%s steps" % steps)
    if ps is not None:
        parts.append("%s/step" % _b(ps))
    sec = c.r("seconds", **match)
    if sec is not None:
        parts.append("%s s" % sec)
    for k in extra_keys:
        v = c.r(k, **match)
        if v is not None:
            parts.append("%s=%s" % (k, v))
    oom = c.r("oom", **match)
    if oom is not None:
        parts.append("oom" if oom == "1" else "no oom")
    return ", ".join(parts) or "no RESULT (rc %s)" % c.rc


class Row(object):
    def __init__(self, case, expected):
        self.case = case
        self.expected = expected
        self.program = ""
        self.cause = ""
        self.per_step = ""
        self.holder = ""
        self.verdict = None  # True, False, or a word (SKIP, not run)
        self.reasons = []

    def fail(self, why):
        self.verdict = False
        self.reasons.append(why)

    def check(self, ok, why_not):
        if not ok:
            self.fail(why_not)
        return ok

    def done(self):
        if self.verdict is None:
            self.verdict = True
        return self


def _start(c, expected):
    """A row for case `c`; not run (or no output) settles it at once."""
    row = Row(c.name, expected)
    if not c.ran:
        row.verdict = "not run"
        row.reasons.append(("skipped: " + c.skipped.strip()) if c.skipped else "no output")
        return row, False
    return row, True


def _cause_row(row, c, e=None):
    e = c.e if e is None else e
    row.cause = "%s (%d error%s)" % (c.cause(e), c.nerrors() or 0, "" if c.nerrors() == 1 else "s")
    hs = c.holders(e)
    row.holder = _holder_str(hs[0]) if hs else ("none" if hs is not None else "?")


def j_keep_cap(c):
    row, ok = _start(c, "growth; optimizer_steps; per step within 5% of the program's (256 MiB); holder "
                        "`kept` first; workload <= 20 steps, <= 3 s")
    if not ok:
        return row
    row.program = _prog_cell(c, "keep_cap")
    _cause_row(row, c)
    prog = _num(c.r("per_step_bytes"))
    g = c.growth() or {}
    vt = _per_step(g)
    row.per_step = _per_step_cell(vt, prog, g.get("unit"), g.get("steps"))
    row.check(c.r("oom") == "1", "the program saw no out-of-memory error")
    steps, secs = _num(c.r("steps")), _num(c.r("seconds"))
    row.check(steps is not None and steps + 1 <= 20, "workload: failed after %s steps (> 20)" % c.r("steps"))
    row.check(secs is not None and secs <= 3.0, "workload: loop took %s s (> 3)" % c.r("seconds"))
    row.check(c.cause() == "growth", "cause %s" % c.cause())
    row.check(g.get("unit") == "optimizer_steps", "unit %s" % g.get("unit"))
    pct = _err_pct(vt, prog)
    row.check(pct is not None and abs(pct) <= 5, "per step %s vs the program's %s" % (_b(vt), _b(prog)))
    nominal = _err_pct(vt, 256 * MiB)
    row.check(nominal is not None and abs(nominal) <= 5, "per step %s vs 256 MiB" % _b(vt))
    hs = c.holders() or []
    row.check(bool(hs) and hs[0].get("name") == "kept", "first holder %s" % (_holder_str(hs[0]) if hs else None))
    return row.done()


def j_keep_free(c):
    row, ok = _start(c, "no error; report growth ~32 MiB/step (10%), optimizer_steps; exit walk names `kept`")
    if not ok:
        return row
    row.program = _prog_cell(c, "keep_free")
    row.cause = "%s error(s)" % c.nerrors()
    row.check(c.r("oom") == "0" and c.r("steps") == "300", "the program did not run its 300 steps cleanly")
    row.check(c.nerrors() == 0, "%s error(s) claimed" % c.nerrors())
    prog = _num(c.r("per_step_bytes"))
    gs = c.report_growths()
    g = max((v for _, v in gs), key=lambda v: _num(v.get("rise_bytes")) or 0, default=None)
    vt = _per_step(g)
    row.per_step = _per_step_cell(vt, prog, (g or {}).get("unit"), (g or {}).get("steps")) if g else "no growth"
    if row.check(g is not None, "report names no growth"):
        pct = _err_pct(vt, prog)
        row.check(pct is not None and abs(pct) <= 10, "per step %s vs the program's %s" % (_b(vt), _b(prog)))
        row.check(g.get("unit") == "optimizer_steps", "unit %s" % g.get("unit"))
    walks = c.walks()
    exits = [w for w in walks if w.get("at") == "exit"] or walks
    names = [h.get("name") for w in exits for h in (_holder_list(w) or [])]
    first = (_holder_list(exits[0]) or [None])[0] if exits else None
    row.holder = "exit walk: %s" % (_holder_str(first) if first else ("no holders" if walks else "no walks"))
    row.check("kept" in names, "exit walk does not name kept (%d walk(s))" % len(walks))
    return row.done()


def j_eval_graph(c):
    row, ok = _start(c, "growth; dataloader_batches; per batch within 10%; first holder graph `total`")
    if not ok:
        return row
    row.program = _prog_cell(c, "eval_graph")
    _cause_row(row, c)
    prog = _num(c.r("per_step_bytes"))
    g = c.growth() or {}
    vt = _per_step(g)
    row.per_step = _per_step_cell(vt, prog, g.get("unit"), g.get("steps"))
    row.check(c.r("oom") == "1", "the program saw no out-of-memory error")
    row.check(c.cause() == "growth", "cause %s" % c.cause())
    row.check(g.get("unit") == "dataloader_batches", "unit %s" % g.get("unit"))
    pct = _err_pct(vt, prog)
    row.check(pct is not None and abs(pct) <= 10, "per batch %s vs the program's %s" % (_b(vt), _b(prog)))
    hs = c.holders() or []
    row.check(bool(hs) and hs[0].get("kind") == "graph" and hs[0].get("name") == "total",
              "first holder %s" % (_holder_str(hs[0]) if hs else None))
    return row.done()


def _small_growth(g):
    """A growth too small to matter: under 1 MiB a step (or 64 MiB in all when no step figure)."""
    p = _per_step(g)
    if p is not None:
        return p < MiB
    r = _num(g.get("rise_bytes"))
    return r is not None and r < 64 * MiB


def j_losses_list(c):
    row, ok = _start(c, "no error; no growth (or one under 1 MiB a step)")
    if not ok:
        return row
    row.program = _prog_cell(c, "losses_list")
    row.cause = "%s error(s)" % c.nerrors()
    row.check(c.r("oom") == "0", "the program did not end cleanly")
    row.check(c.nerrors() == 0, "%s error(s) claimed (cause %s)" % (c.nerrors(), c.cause()))
    gs = [v for _, v in c.report_growths()]
    big = [g for g in gs if not _small_growth(g)]
    row.per_step = "; ".join(_per_step_cell(_per_step(g), _num(c.r("per_step_bytes")), g.get("unit"),
                                            g.get("steps")) for g in gs[:2]) or "no growth"
    row.check(not big, "growth claimed: %s/step" % _b(_per_step(big[0]) if big else None))
    if gs and not big:
        row.reasons.append("a small growth named")
    return row.done()


def j_losses_then_big(c):
    row, ok = _start(c, "request_too_large, cap or pressure; NOT growth")
    if not ok:
        return row
    row.program = _prog_cell(c, "losses_then_big", ("asked",))
    _cause_row(row, c)
    g = c.growth()
    row.per_step = _per_step_cell(_per_step(g), None, g.get("unit")) if g else "-"
    row.check(c.r("oom") == "1", "the program saw no out-of-memory error")
    row.check(c.cause() in ("request_too_large", "cap", "pressure"), "cause %s" % c.cause())
    return row.done()


def j_ddp_keep(c):
    row, ok = _start(c, "growth on rank 1 (~128 MiB/step); the asymmetry with its peers named")
    if not ok:
        return row
    if c.r("skipped") == "1":
        row.verdict = "SKIP"
        row.program = "skipped: %s GPU(s)" % c.r("gpus")
        return row
    row.program = _prog_cell(c, None, ("rank", "world"))
    prog = None
    for d in c.res:
        if d.get("rank") == "1":
            prog = _num(d.get("per_step_bytes"))
            row.program = "rank 1: %s steps, %s/step, %s s, oom=%s" % (d.get("steps"), _b(d.get("per_step_bytes")),
                                                                     d.get("seconds"), d.get("oom"))
    rank1_pid = c.r("pid", rank=1)
    e = next((x for x in c.errors if rank1_pid is not None and str(x.get("pid")) == rank1_pid), None) or \
        next((x for x in c.errors if x.get("cause") == "growth"), c.e)
    _cause_row(row, c, e)
    g = c.growth(e) or {}
    vt = _per_step(g)
    row.per_step = _per_step_cell(vt, prog, g.get("unit"), g.get("steps"))
    row.check(c.cause(e) == "growth", "cause %s" % c.cause(e))
    pct = _err_pct(vt, prog)
    row.check(pct is not None and abs(pct) <= 10, "per step %s vs rank 1's %s" % (_b(vt), _b(prog)))
    finding = any(isinstance(f, dict) and "rank" in str(f.get("kind", ""))
                  for x in c.errors for f in (x.get("findings") or []))
    lines = [line.strip() for line in (c.oom_txt + "\n" + c.report_txt).splitlines()
             if re.search(r"\brank", line, re.I) and re.search(r"more than|peers?\b", line, re.I)]
    if lines:
        note("ddp_keep: asymmetry text: %s" % _short(lines[0], 300))
    row.check(finding or lines, "no rank asymmetry named (finding or text)")
    return row.done()


def _cap_row(c, name, expected, at_least=False):
    row, ok = _start(c, expected)
    if not ok:
        return row
    row.program = _prog_cell(c, name, ("failed_batch", "rounds_ok", "failed_in_step"))
    _cause_row(row, c)
    g = c.growth()
    row.per_step = _per_step_cell(_per_step(g), None, g.get("unit")) if g else "-"
    row.check(c.r("oom") == "1", "the program saw no out-of-memory error")
    row.check(c.cause() in ("cap", "pressure"), "cause %s" % c.cause())
    adv = c.advice()
    bad = _bad_advice(adv)
    row.check(not bad, "advice without 'at least': %s" % _short(bad[0] if bad else "", 100))
    if at_least:
        row.check(any("at least" in a for a in adv), "no advice says 'at least' (%d advice)" % len(adv))
    return row.done()


def j_serve_double(c):
    return _cap_row(c, "serve_double", "cap or pressure; NOT growth (the KV cache in advice is fine)")


def j_steady_cap(c):
    return _cap_row(c, "steady_cap", "cap or pressure; NOT growth; no 'gets past'/'fits' without 'at least'")


def j_batch_too_large(c):
    return _cap_row(c, "batch_too_large", "cap or pressure; advice says 'at least'", at_least=True)


def j_warmup_steady(c):
    row, ok = _start(c, "no error; no growth in the report")
    if not ok:
        return row
    row.program = _prog_cell(c, "warmup_steady", ("compiled", "compile_seconds"))
    row.cause = "%s error(s)" % c.nerrors()
    row.check(c.r("oom") == "0", "the program did not end cleanly")
    row.check(c.nerrors() == 0, "%s error(s) claimed (cause %s)" % (c.nerrors(), c.cause()))
    gs = [v for _, v in c.report_growths()]
    row.per_step = "; ".join(_per_step_cell(_per_step(g), None, g.get("unit"), g.get("steps")) for g in gs[:2]) \
        or "no growth"
    row.check(not gs, "growth claimed")
    walks = c.walks()
    row.holder = "%d walk(s)" % len(walks)
    return row.done()


def j_cycle(c):
    row, ok = _start(c, "first holder kind cycle")
    if not ok:
        return row
    row.program = _prog_cell(c, "cycle")
    _cause_row(row, c)
    g = c.growth()
    row.per_step = _per_step_cell(_per_step(g), _num(c.r("per_step_bytes")), g.get("unit"), g.get("steps")) \
        if g else "-"
    row.check(c.r("oom") == "1", "the program saw no out-of-memory error")
    hs = c.holders() or []
    row.check(bool(hs) and hs[0].get("kind") == "cycle", "first holder %s" % (_holder_str(hs[0]) if hs else None))
    return row.done()


def j_frag(c):
    row, ok = _start(c, "fragmentation_cache")
    if not ok:
        return row
    row.program = "asked %s, largest free %s, reserved %s, allocated %s" % (
        _b(c.r("asked")), _b(c.r("largest_free")), _b(c.r("reserved")), _b(c.r("allocated")))
    _cause_row(row, c)
    row.per_step = "-"
    row.check(c.cause() == "fragmentation_cache", "cause %s" % c.cause())
    return row.done()


def j_walk_cost(c):
    row, ok = _start(c, "walk <= 1 s (1.05 s with the clock's slack); partial only when it stopped at the bound")
    if not ok:
        return row
    dt = _num(c.r("seconds"))
    partial = c.r("partial")
    row.program = "%s gc objects, %s CUDA tensors, walk %s s (again %s s), %s ms by its own clock" % (
        c.r("gc_objects"), c.r("tensors"), c.r("seconds"), c.r("second_seconds"), c.r("elapsed_ms"))
    row.cause = "-"
    row.per_step = "partial=%s, objects %s" % (partial, c.r("objects"))
    kind, _, rest = (c.r("first") or "?").partition(":")
    hname, _, hbytes = rest.rpartition(":")
    row.holder = "%s %s %s" % (kind, _short(hname, 60), _b(hbytes)) if hname else kind
    if c.r("error"):
        row.fail("the bridge's walk could not be imported")
        return row
    row.check(dt is not None and dt <= 1.05, "walk took %s s" % c.r("seconds"))
    row.check(partial != "1" or (dt is not None and dt >= 0.95), "partial at %s s: before the bound" % dt)
    return row.done()


def j_cost(d):
    rows = []
    for case, target in (("cost_cpu", 1.0), ("cost_gpu", 1.0)):
        row = Row(case, "traced median ms/step <= bare %+.1f%%" % target)
        vals = {}
        steps = None
        for mode in ("bare", "traced"):
            vals[mode] = []
            for i in range(1, 20):
                text = _read(os.path.join(d, "%s-%s-%d.out" % (case, mode, i)))
                if text is None:
                    continue
                res = _results(text)
                v = _num(res[-1].get("median_ms")) if res else None
                if v is not None:
                    vals[mode].append(v)
                if mode == "traced" and res:
                    steps = res[-1].get("bridge_steps")
        if case == "cost_cpu":
            vals["noagent"] = []
            for i in range(1, 20):
                res = _results(_read(os.path.join(d, "%s-noagent-%d.out" % (case, i))) or "")
                v = _num(res[-1].get("median_ms")) if res else None
                if v is not None:
                    vals["noagent"].append(v)
        b, t = vals["bare"], vals["traced"]
        if not b or not t:
            row.verdict = "not run"
            row.reasons.append("runs: bare %d, traced %d" % (len(b), len(t)))
            rows.append(row)
            continue
        mb, mt = statistics.median(b), statistics.median(t)
        pct = (mt / mb - 1) * 100
        row.program = "bare %s ms; traced %s ms" % (",".join("%.4g" % x for x in b), ",".join("%.4g" % x for x in t))
        na = vals.get("noagent") or []
        if na:
            row.program += "; traced without the bridge %s ms (median %+.2f%%)" % (
                ",".join("%.4g" % x for x in na), (statistics.median(na) / mb - 1) * 100)
        row.cause = "-"
        row.per_step = "%.4g vs %.4g ms/step (%+.2f%%)" % (mb, mt, pct)
        row.holder = "bridge counted %s optimizer steps" % steps
        row.check(pct <= target, "%+.2f%% slower" % pct)
        row.check(steps not in (None, "-", "?", "0"), "the bridge's optimizer hook did not count (%s)" % steps)
        rows.append(row.done())
    return rows


def j_cost_inproc(c):
    row, ok = _start(c, "bridge on vs paused in one process, paired ABBA blocks: median <= +1.0%")
    if not ok:
        return row
    if c.r("skipped"):
        row.verdict = "SKIP"
        row.reasons.append("no bridge in the process")
        return row
    med, mean, se = _num(c.r("median_pct")), c.r("mean_pct"), c.r("se_pct")
    row.program = "on %s ms, paused %s ms a step over %s rounds" % (c.r("on_ms"), c.r("off_ms"), c.r("rounds"))
    row.cause = "-"
    row.per_step = "median %s%%, mean %s%% (se %s)" % (c.r("median_pct"), mean, se)
    row.holder = "bridge counted %s steps, %s boundary readings" % (c.r("bridge_steps"), c.r("readings"))
    row.check(med is not None and med <= 1.0, "%s%% slower" % c.r("median_pct"))
    return row.done()


JUDGES = [
    ("keep_cap", j_keep_cap), ("keep_free", j_keep_free), ("eval_graph", j_eval_graph),
    ("losses_list", j_losses_list), ("losses_then_big", j_losses_then_big), ("ddp_keep", j_ddp_keep),
    ("serve_double", j_serve_double), ("warmup_steady", j_warmup_steady), ("steady_cap", j_steady_cap),
    ("batch_too_large", j_batch_too_large), ("cycle", j_cycle), ("frag", j_frag), ("walk_cost", j_walk_cost),
    ("cost_inproc", j_cost_inproc),
]


def _gpu(d):
    lines = [x.strip() for x in (_read(os.path.join(d, "gpu.txt")) or "").splitlines() if x.strip()]
    if not lines:
        return "?"
    name = lines[0].split(",")[0].replace("NVIDIA ", "")
    return name if len(lines) == 1 else "%dx %s" % (len(lines), name)


def judge(d, md=None):
    gpu = _gpu(d)
    rows = []
    keys_noted = False
    for name, fn in JUDGES:
        try:
            c = Case(d, name)
            if c.ran:
                c.dump()
                if not keys_noted and isinstance(c.oj, dict) and c.errors:
                    keys_noted = True
                    note("oom --json top-level keys (%s): %s" % (name, sorted(c.oj)))
                    if isinstance(c.rj, dict):
                        note("report --json top-level keys: %s; bridge keys: %s" % (
                            sorted(c.rj), sorted(c.rj["bridge"]) if isinstance(c.rj.get("bridge"), dict) else None))
            row = fn(c)
        except Exception as e:  # a judge's bug must not hide the other rows
            row = Row(name, "?")
            row.fail("judge error: %r" % (e,))
        rows.append(row)
    try:
        rows.extend(j_cost(d))
    except Exception as e:
        row = Row("cost", "?")
        row.fail("judge error: %r" % (e,))
        rows.append(row)
    try:
        with open(os.path.join(d, "judge-notes.txt"), "w") as f:
            for n in NOTES:
                f.write("- " + n + "\n")
    except OSError:
        pass
    out = ["| case | GPU | program's own figure | vramtrace's cause | per step (error %) | first holder | "
           "expected | verdict |", "|---|---|---|---|---|---|---|---|"]
    passed = failed = 0
    for r in rows:
        if r.verdict is True:
            v = "PASS"
            passed += 1
        elif r.verdict is False:
            v = "FAIL"
            failed += 1
        else:
            v = str(r.verdict)
        if r.reasons:
            v += ": " + "; ".join(r.reasons)
        out.append("| %s |" % " | ".join(_cell(x, n) for x, n in (
            (r.case, 30), (gpu, 30), (r.program or "-", 130), (r.cause or "-", 70), (r.per_step or "-", 100),
            (r.holder or "-", 80), (r.expected, 110), (v, 220))))
    out.append("")
    out.append("%d PASS, %d FAIL, %d other (not run / skipped)" % (passed, failed, len(rows) - passed - failed))
    table = "\n".join(out)
    if md:
        try:
            with open(md, "w") as f:
                f.write(table + "\n")
        except OSError as e:
            print("cannot write %s: %r" % (md, e))
    print(table)


CASES = {
    "keep_cap": keep_cap, "keep_free": keep_free, "eval_graph": eval_graph, "losses_list": losses_list,
    "losses_then_big": losses_then_big, "ddp_keep": ddp_keep, "serve_double": serve_double,
    "warmup_steady": warmup_steady, "steady_cap": steady_cap, "batch_too_large": batch_too_large, "cycle": cycle,
    "cost_cpu": cost_cpu, "cost_gpu": cost_gpu, "walk_cost": walk_cost, "cost_inproc": cost_inproc,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or (sys.argv[1] not in CASES and sys.argv[1] != "judge"):
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "judge":
        judge(sys.argv[2] if len(sys.argv) > 2 else ".", sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        CASES[sys.argv[1]]()

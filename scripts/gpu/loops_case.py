"""Issue 49 on a real GPU: loops with neither an optimizer nor a DataLoader (scripts/gpu/loops.sh runs each case
under `vramtrace run --cap 4GiB`, then `vramtrace oom --json`). Each case runs until PyTorch raises
out-of-memory, prints one `RESULT key=value ...` line and exits 3 (0 if it somehow finished, which it should not).

    serve        a serving loop: a small Linear stack (d=2048, eval), `@torch.no_grad()` per request; each request
                 (2048 tokens) computes its key/value tensor, 2 x 2048 x 2048 fp32 = exactly 32 MiB, and keeps it
                 in the global dict `prefix_cache`, never evicted (a prefix cache without a bound). Expected: cause
                 growth, unit no_grad_iterations, 32 MiB per iteration, held by prefix_cache.
    longer       length-sorted work, nothing kept: each iteration's input (batch 32, d=1024) is 128 tokens longer
                 than the last, through Linear(1024, 4096), GELU, Linear(4096, 1024) under `torch.no_grad()`.
                 Expected: cause cap, finding step_need_rises, first advice "Bound what each ...", never "fix what
                 is kept".
    longer_opt   the same growing input in a training step (AdamW, forward + backward): the step's need rises with
                 its input, counted by optimizer steps. Expected as `longer`.
    longer_in    `longer` with the input made inside the no_grad scope (as the stand-in tests do): nothing of the
                 iteration is live at its boundary.
    probe        where `run --stop-after-steps N` stops a program that builds a model before its loop: prints
                 a marker after each phase (nn.Linear's construction, .cuda(), the optimizer, one step).
    plain        `serve` without any no_grad scope (gradients on, nothing counts the iterations; the kv tensors
                 are computed under `.detach()`): the dict alone is the evidence (unit held_entries).

Every request/iteration sleeps GAP seconds (default 0.02, env LOOPS_GAP): a request's arrival, and time for the
bridge's boundary reads (which it rate-limits).
"""
import os
import sys
import time

MiB = 1 << 20
GAP = float(os.environ.get("LOOPS_GAP", "0.02"))


def result(**kw):
    print("RESULT " + " ".join("%s=%s" % (k, v) for k, v in kw.items()), flush=True)


def figures(torch):
    return dict(
        allocated=torch.cuda.memory_allocated(),
        reserved=torch.cuda.memory_reserved(),
        max_allocated=torch.cuda.max_memory_allocated(),
        max_reserved=torch.cuda.max_memory_reserved(),
        retries=torch.cuda.memory_stats().get("num_alloc_retries", 0),
    )


prefix_cache = {}


def serve(mode):
    import torch

    torch.manual_seed(0)
    d = 2048
    model = torch.nn.Sequential(
        torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d)
    ).cuda().eval()
    wk = torch.nn.Linear(d, d, bias=False).cuda()
    wv = torch.nn.Linear(d, d, bias=False).cuda()
    torch.cuda.synchronize()
    setup = figures(torch)
    print("SETUP allocated=%d (weights)" % setup["allocated"], flush=True)

    def work(i):
        x = torch.randn(2048, d, device="cuda")  # the request: 2048 tokens, 16 MiB
        h = model(x)
        if mode == "plain":
            h = h.detach()
        kv = torch.stack([wk(h), wv(h)])  # 2 x 2048 x 2048 fp32: 32 MiB exactly
        if mode == "plain":
            kv = kv.detach()
        prefix_cache[i] = kv  # never evicted
        return float(h[-1, 0].item())

    @torch.no_grad()
    def handle(i):
        return work(i)

    i = 0
    t0 = time.monotonic()
    try:
        while True:
            if mode == "plain":
                work(i)
            else:
                handle(i)
            i += 1
            time.sleep(GAP)
    except torch.OutOfMemoryError as e:
        f = figures(torch)
        result(case=mode, oom_at=i, cached=len(prefix_cache), kept_bytes=sum(t.nbytes for t in prefix_cache.values()),
               seconds="%.2f" % (time.monotonic() - t0), weights=setup["allocated"],
               error=repr(str(e).splitlines()[0][:160]), **f)
        sys.exit(3)


def longer(mode):
    import torch

    torch.manual_seed(0)
    d, batch, grow = 1024, 32, 128
    model = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if mode == "longer_opt" else None
    torch.cuda.synchronize()
    setup = figures(torch)
    peaks = []
    i = 0
    t0 = time.monotonic()
    try:
        while True:
            tokens = grow * (i + 1)
            if mode == "longer_in":
                # The input made inside the scope: nothing of this iteration is live when the next one begins.
                with torch.no_grad():
                    x = torch.randn(batch, tokens, d, device="cuda")
                    y = model(x)
                    s = float(y[0, 0, 0].item())
                    del x, y
            elif opt is None:
                # The usual layout: the batch made, then the model run under no_grad.
                x = torch.randn(batch, tokens, d, device="cuda")
                with torch.no_grad():
                    y = model(x)
                    s = float(y[0, 0, 0].item())
                del x, y
            else:
                x = torch.randn(batch, tokens, d, device="cuda")
                y = model(x)
                loss = y.float().pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s = float(loss.item())
                del x, y
            peaks.append(torch.cuda.max_memory_allocated())  # the running peak: the program never resets it
            i += 1
            time.sleep(GAP)
    except torch.OutOfMemoryError as e:
        f = figures(torch)
        rises = [b - a for a, b in zip(peaks, peaks[1:])]
        result(case=mode, oom_at=i, tokens=grow * (i + 1), seconds="%.2f" % (time.monotonic() - t0),
               weights=setup["allocated"], last_peak=peaks[-1] if peaks else 0,
               peak_rise_per_iter=(sum(rises) // len(rises)) if rises else 0,
               error=repr(str(e).splitlines()[0][:160]), **f)
        sys.exit(3)


def probe():
    import torch

    print("PROBE imported torch", flush=True)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    print("PROBE built 2 nn.Linear on the CPU", flush=True)
    m = m.cuda()
    print("PROBE moved to the GPU", flush=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    print("PROBE made the optimizer", flush=True)
    for i in range(3):
        m(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        print("PROBE optimizer step", i + 1, flush=True)


def main():
    mode = sys.argv[1]
    if mode in ("serve", "plain"):
        serve(mode)
    elif mode in ("longer", "longer_opt", "longer_in"):
        longer(mode)
    elif mode == "probe":
        probe()
    else:
        sys.exit("unknown case %r" % mode)
    print("finished without running out of memory", flush=True)


if __name__ == "__main__":
    main()

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
    gen          a generation loop (issue 49, added 2026-11-29): a 4-layer fp16 decoder (d=2048, 16 heads, 256 MiB of
                 weights) answers 16 requests of 32 sequences, 192 to 512 tokens each (seeded); each request runs
                 under `with torch.no_grad():` and grows its key/value cache by torch.cat every token (1 MiB a token:
                 4 layers x K,V x 32 x 2048 fp16), dropped when the request ends. Finishes (exit 0): steady across
                 requests, so no growth and no leak may be said at exit.
    gen_long     `gen`, 6 requests, then one of 2048 tokens: its cache (2 GiB, and an eighth more while torch.cat
                 copies a layer's) is more than a 2 GiB cap holds (`loops.sh` with ONLY="gen_long:2GiB"; a 4096-token
                 request under 4 GiB took over 100 s to get there). Expected: cause cap (the step too large, its
                 need rising), never growth.
    gen_step     `gen` with the no_grad scope on the per-token decode function (`@torch.no_grad()`), as hand-written
                 decoding loops do: every token is one of the program's iterations, the cache rises token by token
                 and falls at each request's end. Finishes: no growth at exit.
    gen_step_long  `gen_step`'s requests, then the 2048-token one, under the 2 GiB cap.
    eval_cpu     an evaluation loop: model.eval(), `with torch.no_grad():`, a DataLoader over a CPU dataset (200
                 batches of 256 x 1024), each batch's logits (256 x 32768 fp32, 32 MiB) appended to a list with
                 `.cpu()`. Finishes: steady, no growth.
    eval_gpu     the same appending the GPU tensors to the list `outputs` (32 MiB a batch, kept): under a 4 GiB
                 cap it runs out of memory; expected growth, 32 MiB per dataloader batch, held by `outputs`.
    eval_gpu_exit  `eval_gpu` for 60 batches, to its end (1.88 GiB kept): the exit's verdict names the growth and
                 `outputs`.
    steady       a serving loop without a leak: `serve`'s model, `@torch.no_grad()` per request, nothing kept
                 past the request (200 requests, then exit 0): no growth.
    steady_lru   `steady` keeping each request's 32 MiB key/value tensor in a bounded cache (an OrderedDict, the
                 oldest evicted past 8 entries): rises for 8 requests, then flat. No growth.

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


def decoder(torch, d=2048, layers=4, heads=16):
    """A small fp16 decoder: per layer a fused qkv projection, an output projection and a 2-layer MLP."""
    torch.manual_seed(0)
    mk = lambda i, o: torch.nn.Linear(i, o, bias=False)
    ls = torch.nn.ModuleList(
        torch.nn.ModuleDict(dict(qkv=mk(d, 3 * d), out=mk(d, d), up=mk(d, 2 * d), down=mk(2 * d, d)))
        for _ in range(layers)
    )
    return ls.cuda().half().eval(), d, heads


def gen(mode):
    import torch

    F = torch.nn.functional
    layers, d, heads = decoder(torch)
    hd = d // heads
    B = 32
    g = torch.Generator().manual_seed(3)
    per_token = mode.startswith("gen_step")
    n = 6 if mode.endswith("_long") else 16
    lengths = [int(torch.randint(192, 513, (1,), generator=g)) for _ in range(n)]
    if mode.endswith("_long"):
        lengths.append(2048)
    torch.cuda.synchronize()
    setup = figures(torch)
    print("SETUP allocated=%d (weights) lengths=%s" % (setup["allocated"], lengths), flush=True)

    def step(x, cache):
        # One token through every layer; each layer's K and V grow by one position (torch.cat: a new tensor).
        for i, l in enumerate(layers):
            q, k, v = l["qkv"](x).view(B, 1, 3, heads, hd).permute(2, 0, 3, 1, 4)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, 1, d)
            x = x + l["out"](a)
            x = x + l["down"](F.gelu(l["up"](x)))
        return x / x.norm(dim=-1, keepdim=True)

    step_ng = torch.no_grad()(step)

    def request(tokens):
        cache = [None] * len(layers)
        x = torch.randn(B, 1, d, device="cuda", dtype=torch.half)
        for _ in range(tokens):
            x = step_ng(x, cache) if per_token else step(x, cache)
        return float(x[0, 0, 0].item())  # the cache goes with this frame

    done = 0
    t0 = time.monotonic()
    try:
        for tokens in lengths:
            if per_token:
                request(tokens)
            else:
                with torch.no_grad():
                    request(tokens)
            done += 1
            time.sleep(GAP)
    except torch.OutOfMemoryError as e:
        f = figures(torch)
        result(case=mode, oom_at=done, tokens=lengths[done], seconds="%.2f" % (time.monotonic() - t0),
               weights=setup["allocated"], error=repr(str(e).splitlines()[0][:160]), **f)
        sys.exit(3)
    f = figures(torch)
    result(case=mode, requests=done, tokens=sum(lengths), seconds="%.2f" % (time.monotonic() - t0),
           weights=setup["allocated"], **f)


outputs = []


def evaluate(mode):
    import torch

    torch.manual_seed(0)
    d, vocab, bs = 1024, 32768, 256
    nb = 60 if mode == "eval_gpu_exit" else 200
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, vocab)).cuda()
    data = torch.utils.data.TensorDataset(torch.randn(nb * bs, d), torch.randint(0, vocab, (nb * bs,)))
    loader = torch.utils.data.DataLoader(data, batch_size=bs, shuffle=False)
    torch.cuda.synchronize()
    setup = figures(torch)
    model.eval()
    correct = 0
    i = 0
    t0 = time.monotonic()
    try:
        with torch.no_grad():
            for x, y in loader:
                logits = model(x.cuda(non_blocking=True))  # 256 x 32768 fp32: 32 MiB
                correct += int((logits.argmax(-1).cpu() == y).sum())
                outputs.append(logits.cpu() if mode == "eval_cpu" else logits)
                i += 1
                time.sleep(GAP)
    except torch.OutOfMemoryError as e:
        f = figures(torch)
        result(case=mode, oom_at=i, cached=len(outputs),
               kept_bytes=sum(t.nbytes for t in outputs if t.is_cuda), seconds="%.2f" % (time.monotonic() - t0),
               weights=setup["allocated"], error=repr(str(e).splitlines()[0][:160]), **f)
        sys.exit(3)
    f = figures(torch)
    result(case=mode, batches=i, kept_gpu_bytes=sum(t.nbytes for t in outputs if t.is_cuda),
           seconds="%.2f" % (time.monotonic() - t0), weights=setup["allocated"], **f)


def steady(mode):
    import collections

    import torch

    torch.manual_seed(0)
    d = 2048
    model = torch.nn.Sequential(
        torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d)
    ).cuda().eval()
    wk = torch.nn.Linear(d, d, bias=False).cuda()
    wv = torch.nn.Linear(d, d, bias=False).cuda()
    lru = collections.OrderedDict()
    torch.cuda.synchronize()
    setup = figures(torch)

    @torch.no_grad()
    def handle(i):
        x = torch.randn(2048, d, device="cuda")
        h = model(x)
        if mode == "steady_lru":
            lru[i] = torch.stack([wk(h), wv(h)])  # 32 MiB, at most 8 kept
            while len(lru) > 8:
                lru.popitem(last=False)
        return float(h[-1, 0].item())

    t0 = time.monotonic()
    for i in range(200):
        handle(i)
        time.sleep(GAP)
    f = figures(torch)
    result(case=mode, requests=200, cached=len(lru), seconds="%.2f" % (time.monotonic() - t0),
           weights=setup["allocated"], **f)


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
    elif mode.startswith("gen"):
        gen(mode)
    elif mode.startswith("eval_"):
        evaluate(mode)
    elif mode.startswith("steady"):
        steady(mode)
    else:
        sys.exit("unknown case %r" % mode)
    print("finished without running out of memory", flush=True)


if __name__ == "__main__":
    main()

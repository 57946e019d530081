"""Issue 28's workloads: the same allocations whatever the allocator settings (seeded), so one run's history can be
replayed under the settings of another run and the model's reserve compared with PyTorch's own.

    python3 whatif_case.py CASE        CASE: train | finetune | serve | frag

Prints one JSON line last: PyTorch's max_memory_reserved / max_memory_allocated, num_alloc_retries, each step's
start (Unix us), and, if the run ran out of memory, the step and the line of this file that asked.
"""

import json
import sys
import time
import traceback

import torch

CASE = sys.argv[1]
dev = torch.device("cuda")
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
steps_us = []


def ri(lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=g).item())


def step_mark():
    steps_us.append(int(time.time() * 1e6))


def model(width=1024, layers=6, vocab=8192):
    m = torch.nn.ModuleDict(
        dict(
            emb=torch.nn.Embedding(vocab, width),
            body=torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(width, 16, 4 * width, batch_first=True, dropout=0.0), layers
            ),
            head=torch.nn.Linear(width, vocab),
        )
    ).to(dev)
    return m


def forward(m, x):
    return m["head"](m["body"](m["emb"](x)))


def train(varying, freeze):
    m = model()
    if freeze:
        for p in m["emb"].parameters():
            p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(24):
        step_mark()
        b, s = (ri(2, 12), ri(64, 512)) if varying else (8, 256)
        x = torch.randint(0, 8192, (b, s), device=dev)
        loss = torch.nn.functional.cross_entropy(forward(m, x).flatten(0, 1), x.flatten())  # line: loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def serve():
    m = model(layers=4).eval()
    with torch.no_grad():
        for _ in range(40):
            step_mark()
            b, s = ri(1, 16), ri(32, 768)
            x = torch.randint(0, 8192, (b, s), device=dev)
            h = m["emb"](x)
            cache = [h.clone() for _ in range(4)]
            for t in range(24):
                nxt = torch.randint(0, 8192, (b, 1), device=dev)
                e = m["emb"](nxt)
                cache = [torch.cat([c, e], dim=1) for c in cache]  # the KV cache grows a token a step
                y = m["head"](m["body"](cache[-1][:, -64:]))
            del cache, y


def frag():
    keep = []
    size = 3 << 20
    for _ in range(60):
        step_mark()
        batch = [torch.empty(int(size * (1 + ri(0, 40) / 100)), dtype=torch.uint8, device=dev) for _ in range(12)]
        keep.extend(batch[::3])  # a third stays: holes between them
        del batch
        size = int(size * 1.07)
        if len(keep) > 150:
            keep = keep[40:]


out = {"case": CASE, "oom": None}
try:
    {"train": lambda: train(False, False), "finetune": lambda: train(True, True), "serve": serve, "frag": frag}[
        CASE
    ]()
except torch.OutOfMemoryError as e:
    tb = traceback.extract_tb(sys.exc_info()[2])
    mine = [f for f in tb if f.filename == __file__]
    tried = __import__("re").search(r"Tried to allocate ([0-9.]+ [KMG]iB)", str(e))
    out["oom"] = {"step": len(steps_us) - 1, "line": mine[-1].lineno if mine else None,
                  "tried": tried.group(1) if tried else None}
torch.cuda.synchronize()
st = torch.cuda.memory_stats()
out.update(
    max_reserved=torch.cuda.max_memory_reserved(),
    max_allocated=torch.cuda.max_memory_allocated(),
    retries=st.get("num_alloc_retries", 0),
    steps_us=steps_us,
    conf=__import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
)
print(json.dumps(out))

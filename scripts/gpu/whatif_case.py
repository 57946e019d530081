"""Issue 28's workloads: the same allocations whatever the allocator settings (seeded), so one run's history can be
replayed under the settings of another run and the model's reserve compared with PyTorch's own.

    python3 whatif_case.py CASE [--batch B] [--steps N]
    CASE: train | finetune | serve | frag | conv, or the unseen: padded | convamp | ckpt | lstm | lstm2

Issue 39 (whatif --knob batch): --batch sets the batch of train (a transformer language model, sequence 256),
finetune (the same model, its embedding frozen, sequence lengths varying step to step, the same lengths at every
batch: they are drawn as before) and conv (a small ResNet-like network on 64x64 images, torch only); --steps the
number of steps (default: 24 for train and finetune, 8 for conv).

Prints one JSON line last: PyTorch's max_memory_reserved / max_memory_allocated, num_alloc_retries, each step's
start (Unix us), and, if the run ran out of memory, the step and the line of this file that asked.
"""

import json
import sys
import time
import traceback

import torch

CASE = sys.argv[1]
_opts = dict(zip(sys.argv[2::2], sys.argv[3::2]))
_bad = [k for k in _opts if k not in ("--batch", "--steps")] + (["(odd)"] if len(sys.argv) % 2 else [])
if _bad:
    sys.exit(f"whatif_case.py: unknown or incomplete options {_bad}; usage: CASE [--batch B] [--steps N]")
BATCH = int(_opts["--batch"]) if "--batch" in _opts else None
STEPS = int(_opts["--steps"]) if "--steps" in _opts else None
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
    for _ in range(STEPS or 24):
        step_mark()
        b, s = (ri(2, 12), ri(64, 512)) if varying else (8, 256)
        if BATCH:
            b = BATCH  # the lengths still drawn as before: the same at every batch
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


class Block(torch.nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, a 1x1 projection when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = (
            torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else torch.nn.Identity()
        )

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


def resnet():
    """The ResNet-like network: a stem, then two blocks at each of four widths, pooled into 100 classes."""
    widths = [64, 128, 256, 512]
    layers = [torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU()]
    cin = 64
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, 100)]
    return torch.nn.Sequential(*layers).to(dev)


def conv():
    # Deterministic algorithms: cuDNN's choice (and its workspace) should not change with the batch.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    m = resnet()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    b = BATCH or 32
    for _ in range(STEPS or 8):
        step_mark()
        x = torch.randn(b, 3, 64, 64, device=dev)
        y = torch.randint(0, 100, (b,), device=dev)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def unseen_padded():
    """Unseen by the model's rules (issue 39's check on real jobs): HF GPT-2 (6 layers) fine-tuned in bf16 autocast
    on a seeded corpus whose lengths are skewed (log-normal, 16 to 512 tokens), shuffled once by a seeded
    permutation and cut into consecutive batches padded to their longest: as a DataLoader(shuffle=True) with a
    seed and DataCollatorWithPadding do. Each step's length depends on which samples the batch holds, so it changes
    with the batch."""
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=32000, n_positions=512)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    gd = torch.Generator().manual_seed(2)
    n = 4096
    lengths = torch.empty(n).log_normal_(5.0, 0.7, generator=gd).clamp(16, 512).long()
    order = torch.randperm(n, generator=gd)
    b = BATCH or 8
    for k in range(STEPS or 24):
        step_mark()
        idx = order[k * b:(k + 1) * b]
        lens = lengths[idx]
        s = int(lens.max())
        ids = torch.randint(0, 32000, (b, s), generator=gd).to(dev)
        mask = (torch.arange(s)[None, :] < lens[:, None]).to(dev)
        labels = ids.masked_fill(~mask, -100)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, attention_mask=mask.long(), labels=labels).loss  # line: loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def unseen_conv():
    """Unseen: the ResNet-like network under PyTorch's own cuDNN defaults (not deterministic, no benchmark), in
    bf16 autocast and channels_last, 96x96 images."""
    m = resnet().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    b = BATCH or 32
    for _ in range(STEPS or 8):
        step_mark()
        x = torch.randn(b, 3, 96, 96, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 100, (b,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def unseen_checkpointed():
    """Unseen: HF BERT (8 layers) for classification with gradient checkpointing, 256 tokens, fp32, AdamW."""
    from transformers import BertConfig, BertForSequenceClassification

    m = BertForSequenceClassification(BertConfig(num_hidden_layers=8, num_labels=4)).to(dev)
    m.gradient_checkpointing_enable()
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    b = BATCH or 16
    for _ in range(STEPS or 8):
        step_mark()
        ids = torch.randint(0, 30522, (b, 256), device=dev)
        y = torch.randint(0, 4, (b,), device=dev)
        loss = m(input_ids=ids, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def lstm():
    """Issue 48's code-path case: two stacked single-layer LSTMs (1024 -> 1024) in fp16, sequence 128, a linear
    head, SGD. PyTorch's cuDNN RNN picks the persistent algorithm for fp16, one layer, one direction, sizes that
    are multiples of 128 and, on a GPU of compute capability 8+ with 98+ SMs (an H200: 9.0, 132), a batch that is
    a multiple of 8 up to 128 (aten/src/ATen/native/cudnn/RNN.cpp, use_persist_device_heuristics); a larger
    batch takes the standard algorithm: the path a batch past 128 takes is not the path of 8 and 16."""
    m = torch.nn.ModuleDict(
        dict(l1=torch.nn.LSTM(1024, 1024), l2=torch.nn.LSTM(1024, 1024), head=torch.nn.Linear(1024, 1024))
    ).to(dev).half()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    b = BATCH or 32
    for _ in range(STEPS or 8):
        step_mark()
        x = torch.randn(128, b, 1024, device=dev, dtype=torch.half)
        h, _ = m["l1"](x)
        h, _ = m["l2"](h)
        loss = m["head"](h).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def lstm2():
    """Issue 48's code-path pair as the issue met it: one 2-layer LSTM, `torch.nn.LSTM(1024, 1024,
    num_layers=2)`, as a user writes it (fp32, PyTorch's default dtype; cuDNN's RNN, TF32 as PyTorch allows it by
    default), sequence 128 (sequence first, the module's default layout), a Linear head to 1024 classes, cross
    entropy on random targets, AdamW. The issue's runs at 16 and 32 were refused as "the runs take different code
    paths" (84 more requests on autograd's backward thread at 32)."""
    m = torch.nn.ModuleDict(
        dict(rnn=torch.nn.LSTM(1024, 1024, num_layers=2), head=torch.nn.Linear(1024, 1024))
    ).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    b = BATCH or 32
    for _ in range(STEPS or 8):
        step_mark()
        x = torch.randn(128, b, 1024, device=dev)
        y = torch.randint(0, 1024, (128 * b,), device=dev)
        h, _ = m["rnn"](x)
        loss = torch.nn.functional.cross_entropy(m["head"](h).flatten(0, 1), y)  # line: loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


out = {"case": CASE, "batch": BATCH, "oom": None}
try:
    {
        "train": lambda: train(False, False),
        "finetune": lambda: train(True, True),
        "serve": serve,
        "frag": frag,
        "conv": conv,
        "padded": unseen_padded,
        "convamp": unseen_conv,
        "ckpt": unseen_checkpointed,
        "lstm": lstm,
        "lstm2": lstm2,
    }[CASE]()
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

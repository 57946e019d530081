"""Loops with neither an optimizer nor a DataLoader, on the stand-in torch, for the verdicts on such loops
(issue 49). argv: MODE [REQUESTS]
- cache: a serving loop (`@torch.no_grad()` per request) that keeps each request's 32 MiB key/value tensors in a
  global dict it never evicts: growth, 32 MiB a request, held by `prefix_cache`;
- evict: the same with the cache bounded to 8 entries (the oldest evicted): no growth;
- longer: nothing kept, each request's input 4 MiB longer than the last (length-sorted work): the request's own
  need rises, nothing leaks;
- longer_keep: the input growing as in `longer`, and each request's key/values kept as in `cache`;
- longer_out: as `longer`, the input made before the request's scope (live at its boundary, as a batch moved to
  the GPU before `with torch.no_grad()` is);
- plain: the cache loop without any no_grad scope (nothing counts its iterations);
- long: a generation loop, each request's key/values kept a token at a time (4 MiB a token) in a list local to
  the request and freed when it ends: 48 tokens a request, but request 30 asks 400 (one request too long for
  the cap, nothing kept across requests)."""

import sys
import time

import torch

MIB = 1 << 20
mode = sys.argv[1]
requests = int(sys.argv[2]) if len(sys.argv) > 2 else 400

torch.cuda.init()
weights = torch.empty_cuda(64 * MIB)
prefix_cache = {}


def work(i, x=None):
    size = (16 + 4 * i) * MIB if mode.startswith("longer") else 16 * MIB
    x = x if x is not None else torch.empty_cuda(size)
    h = torch.empty_cuda(size)  # the request's own activations, as large as its input
    kv = torch.empty_cuda(32 * MIB)
    if mode in ("cache", "plain", "longer_keep"):
        prefix_cache[i] = kv
    elif mode == "evict":
        prefix_cache[i] = kv
        if len(prefix_cache) > 8:
            del prefix_cache[min(prefix_cache)]
    time.sleep(0.01)
    del x, h


@torch.no_grad()
def serve(i, x=None):
    if mode == "long":
        return generate(400 if i == 30 else 48)
    work(i, x)


def generate(tokens):
    kv = []
    for _ in range(tokens):
        kv.append(torch.empty_cuda(4 * MIB))
        time.sleep(0.001)
    del kv


try:
    for i in range(requests):
        if mode == "plain":
            work(i)
        elif mode == "longer_out":
            x = torch.empty_cuda((16 + 4 * i) * MIB)
            serve(i, x)
            del x
        else:
            serve(i)
except torch.OutOfMemoryError as e:
    print("OOM at request", i, "cached", len(prefix_cache), file=sys.stderr)
    sys.exit(3)
print("served", requests)

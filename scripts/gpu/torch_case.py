#!/usr/bin/env python3
"""PyTorch case for scripts/gpu/check.sh. Usage: torch_case.py MODE, MODE one of

  default     caching allocator, a small conv+MLP training loop; figure: torch.cuda.max_memory_reserved()
  expandable  same loop; run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; figure: max_memory_reserved()
  async       same loop; run with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; figure: max_memory_allocated()
  nocache     run with PYTORCH_NO_CUDA_MEMORY_CACHING=1: tensors of known sizes in a known pattern; PyTorch's own
              figures are 0 there, so the figure is the peak of the bytes this script held (sum of nbytes)

Prints one line `RESULT framework_peak_bytes=<n> expected_bytes=<n> figure=<name> ...`.
With VT_SNAPSHOT=FILE (modes default, expandable, async), writes at the end torch.cuda.memory_snapshot()'s segments
(address, total_size, ...) and PyTorch's own figures to FILE as JSON, for check.sh to tell the allocator's
allocations in the trace from those of libraries outside it (cuBLAS/cuBLASLt workspaces).
Exit 3 (with a SKIP line) when torch is not installed, 4 when CUDA is not usable."""
import json
import os
import sys

MiB = 1 << 20


def result(**kw):
    print("RESULT " + " ".join(f"{k}={v}" for k, v in kw.items()), flush=True)


def train(torch, dev):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 16 * 16, 2048),
        nn.ReLU(),
        nn.Linear(2048, 2048),
        nn.ReLU(),
        nn.Linear(2048, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(30):
        x = torch.randn(128, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (128,), device=dev)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    torch.cuda.synchronize()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def held_pattern(torch, dev):
    """Tensors of known sizes (multiples of 2 MiB), allocated and freed in a fixed order; returns the exact peak
    of the bytes held and the number of allocations."""
    held, cur, peak, n = {}, 0, 0, 0
    pattern = [
        ("+", "w", 64), ("+", "a1", 32), ("+", "a2", 128), ("-", "a1", 0), ("+", "ws", 16),
        ("+", "a3", 256), ("-", "a2", 0), ("-", "ws", 0), ("+", "g", 96), ("-", "a3", 0), ("-", "g", 0),
        ("-", "w", 0),
    ]
    for _ in range(5):
        for op, name, mib in pattern:
            if op == "+":
                t = torch.empty(mib * MiB, dtype=torch.uint8, device=dev)
                held[name] = t
                cur += t.nbytes
                n += 1
                peak = max(peak, cur)
                del t  # only `held` keeps it alive
            else:
                cur -= held.pop(name).nbytes
        torch.cuda.synchronize()
    for name in list(held):
        cur -= held.pop(name).nbytes
    torch.cuda.synchronize()
    return peak, n


def dump_snapshot(torch, path, backend):
    """Segments of PyTorch's allocator now (default: one cudaMalloc each, at `address`; expandable: a VA range
    backed by cuMemCreate handles, `total_size` mapped bytes; cudaMallocAsync: usually none)."""
    data = {"backend": backend, "segments": [], "memory_reserved": torch.cuda.memory_reserved(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "max_memory_allocated": torch.cuda.max_memory_allocated()}
    try:
        for sg in torch.cuda.memory_snapshot():
            data["segments"].append({k: sg.get(k) for k in ("device", "address", "total_size", "allocated_size",
                                                             "active_size", "segment_type", "is_expandable")})
    except Exception as e:  # noqa: BLE001
        data["error"] = f"{type(e).__name__}: {e}"[:200].replace("\n", " ")
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as e:
        print(f"snapshot not written: {e}", flush=True)
        return
    print(f"snapshot segments={len(data['segments'])} "
          f"bytes={sum(int(x.get('total_size') or 0) for x in data['segments'])} "
          f"memory_reserved={data['memory_reserved']} error={data.get('error', '')}", flush=True)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    try:
        import torch
    except ImportError:
        print("SKIP torch is not installed", flush=True)
        return 3
    print(f"torch {torch.__version__} mode={mode} "
          f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')} "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')}", flush=True)
    if not torch.cuda.is_available():
        print("FAIL torch.cuda.is_available() is False", flush=True)
        return 4
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception:  # noqa: BLE001
        backend = "?"
    print(f"device {torch.cuda.get_device_name(0)} allocator backend {backend}", flush=True)

    if mode == "nocache":
        peak, n = held_pattern(torch, dev)
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
        result(framework_peak_bytes=peak, expected_bytes=peak, figure="script_held_peak",
               max_memory_reserved=reserved, max_memory_allocated=allocated, allocations=n, backend=backend)
        return 0

    params = train(torch, dev)
    reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    try:
        stats = torch.cuda.memory_stats()
        keys = ["num_alloc_retries", "num_device_alloc", "num_device_free", "segment.all.peak",
                "reserved_bytes.all.peak", "allocated_bytes.all.peak"]
        print("stats " + " ".join(f"{k}={stats.get(k)}" for k in keys), flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"stats unavailable: {e}", flush=True)
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info free={free} total={total} param_bytes={params}", flush=True)
    if os.environ.get("VT_SNAPSHOT"):
        dump_snapshot(torch, os.environ["VT_SNAPSHOT"], backend)
    if mode == "async":
        figure, value = "max_memory_allocated", allocated
    else:
        figure, value = "max_memory_reserved", reserved
    result(framework_peak_bytes=value, expected_bytes=value, figure=figure, max_memory_reserved=reserved,
           max_memory_allocated=allocated, param_bytes=params, backend=backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())

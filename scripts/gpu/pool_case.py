"""Issue 10's pool case on a real GPU: two processes of one job under `vramtrace run --cap 4GiB`, PyTorch's
cudaMallocAsync backend (whose pool keeps what it frees: release threshold at the maximum). The first
allocates 3 GiB and frees it (its pool still reserves it); a second process then asks for 3 GiB: it must get
torch.OutOfMemoryError. After the first empties its cache (trims its pool), a third gets its 3 GiB. Prints one
RESULT line with what PyTorch and nvidia-smi said at each step.
    python3 pool_case.py          (the first process)
    python3 pool_case.py child    (the others)"""
import os
import subprocess
import sys

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
import torch  # noqa: E402

GiB = 1 << 30


def smi():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    return ";".join(l.replace(" ", "") for l in out.strip().splitlines())


if len(sys.argv) > 1:
    try:
        t = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print("child ok reserved=%d smi=%s" % (torch.cuda.memory_reserved(), smi()), flush=True)
    except torch.OutOfMemoryError:
        print("child oom reserved=%d" % torch.cuda.memory_reserved(), flush=True)
    sys.exit(0)

assert torch.cuda.get_allocator_backend() == "cudaMallocAsync"
t = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
del t
torch.cuda.synchronize()
held = torch.cuda.memory_reserved()
during = smi()


def child():
    return subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True).stdout.strip()


second = child()
torch.cuda.empty_cache()
torch.cuda.mem_get_info()
after_trim = torch.cuda.memory_reserved()
third = child()
print("RESULT first_reserved_after_free=%d smi_then=%s second=[%s] reserved_after_empty_cache=%d third=[%s]"
      % (held, during, second, after_trim, third), flush=True)

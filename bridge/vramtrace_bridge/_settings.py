"""The settings the PyTorch side reads, from the environment (and PyTorch's allocator backend): vramtrace's own
(`env_int`, VRAMTRACE_TORCH_SAMPLE_MS) and the program's settings of PyTorch's caching allocator (its backend,
PYTORCH_CUDA_ALLOC_CONF, caching turned off), which the `attach` and `oom` records carry. No state, no record:
it may touch os.environ (read only) and `torch.cuda.get_allocator_backend()`. VRAMTRACE_TORCH_HISTORY is
_arming.py's (`history_setting`)."""

import os


def env_int(name, default):
    try:
        v = os.environ.get(name, "").strip()
        return int(v) if v else default
    except ValueError:
        return default


def interval_ms():
    return max(1, env_int("VRAMTRACE_TORCH_SAMPLE_MS", 20))


def backend(torch):
    try:
        return torch.cuda.get_allocator_backend()
    except Exception:
        return "native"


def caching_off():
    """The variable that turns PyTorch's caching off (every tensor its own cudaMalloc, and no stats kept), if it is
    set as PyTorch reads it (exactly "1"), else None."""
    for name in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NO_HIP_MEMORY_CACHING"):
        if os.environ.get(name) == "1":
            return name
    return None


def alloc_conf():
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""


def conf_value(key):
    """A setting of PYTORCH_CUDA_ALLOC_CONF (`key:value,key:value`), or None."""
    for part in alloc_conf().split(","):
        k, _, v = part.partition(":")
        if k.strip() == key:
            return v.strip()
    return None

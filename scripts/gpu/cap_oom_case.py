#!/usr/bin/env python3
"""Programs for scripts/gpu/cap_oom.sh (the cap and out-of-memory cases). Usage: cap_oom_case.py MODE [ARG], MODE:

  grow MIB       torch.empty(MIB MiB) one by one, held, until the allocation fails (cap-torch)
  batch          a small MLP trained on a batch that doubles every step until it fails (oom-cap)
  pressure MIB   as grow, without a cap: the GPU runs out (oom-pressure); also with MIB = 2048 under another
                 process's hog (oom-external)
  killed MIB     as pressure, then SIGKILLs itself right after catching the error (oom-killed)
  worker         PYTORCH_NO_CUDA_MEMORY_CACHING=1: 1 GiB tensors until refused, sleeping between; then waits for
                 the other worker (VT_BARRIER folder, VT_WORKERS, default 2) before reporting (cap-two-procs)
  warn MIB       one tensor of MIB MiB, which must succeed (cap-warn)
  jax            JAX with its default preallocation: memory_stats() (cap-jax)
  hog FILE FRAC  outside the job: torch.empty(total * FRAC bytes), writes FILE, sleeps until killed (oom-external)
  nvml MIB       pynvml's figures (v1, and v2 when pynvml has it) for CUDA device 0's GPU, found by UUID, before the
                 driver is initialised and after it holds MIB MiB (cuMemAlloc_v2 through ctypes); beside them
                 cuMemGetInfo_v2's and nvidia-smi's (run without the shim) (nvml-cap, nvml-nocap). No torch needed.

Every mode prints `START pid=<n> ...` first and one line `RESULT k=v ...` (no spaces in values); the error's
message goes to a `MSG ...` line. Exit 3 (SKIP line) when the framework is missing, 4 when CUDA is unusable, 0
otherwise (an out-of-memory error is an expected outcome, reported in RESULT)."""
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30


def out(line):
    print(line, flush=True)


def result(**kw):
    out("RESULT " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in kw.items()))


def smi_used(pid):
    """nvidia-smi's used MiB for this pid (None if not listed) and for the whole GPU 0."""
    mine, gpu = None, None
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=15)
        for line in r.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
                mine = int(parts[1])
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True, timeout=15)
        v = r.stdout.strip().splitlines()[0].strip() if r.stdout.strip() else ""
        gpu = int(v) if v.isdigit() else None
    except Exception:  # noqa: BLE001
        pass
    return mine, gpu


def import_torch():
    try:
        import torch
    except ImportError:
        out("SKIP torch is not installed")
        sys.exit(3)
    if not torch.cuda.is_available():
        out("FAIL torch.cuda.is_available() is False")
        sys.exit(4)
    return torch


def oom_type(torch):
    t = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return t if t is not None else MemoryError


def is_oom(torch, e):
    return isinstance(e, oom_type(torch)) or "out of memory" in str(e).lower()


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:200]


def start_line(torch, mode):
    free, total = torch.cuda.mem_get_info()
    out(f"START pid={os.getpid()} mode={mode} torch={torch.__version__} device={torch.cuda.get_device_name(0)!r} "
        f"mem_get_info_free={free} mem_get_info_total={total} "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')} "
        f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')}")
    return free, total


def at_error(torch):
    """Figures at the moment of the error, before anything is freed."""
    st = {}
    try:
        s = torch.cuda.memory_stats()
        st["reserved_at_oom"] = s.get("reserved_bytes.all.current", -1)
        st["allocated_at_oom"] = s.get("allocated_bytes.all.current", -1)
        st["num_alloc_retries"] = s.get("num_alloc_retries", -1)
        st["num_ooms"] = s.get("num_ooms", -1)
    except Exception as e:  # noqa: BLE001
        out(f"memory_stats failed: {e}")
    try:
        f, t = torch.cuda.mem_get_info()
        st["free_at_oom"], st["total_at_oom"] = f, t
    except Exception as e:  # noqa: BLE001
        out(f"mem_get_info failed: {e}")
    st["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    st["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return st


def grow(mode, mib, limit_n=4096):
    """Tensors of `mib` MiB until the allocation fails; the caller decides what happens then."""
    torch = import_torch()
    free0, total0 = start_line(torch, mode)
    held, err, st = [], None, {}
    t0 = time.time()
    for _ in range(limit_n):
        try:
            held.append(torch.empty(mib * MiB, dtype=torch.uint8, device="cuda"))
        except Exception as e:  # noqa: BLE001
            err = e
            st = at_error(torch)
            break
    torch.cuda.synchronize()
    el = time.time() - t0
    if err is None:
        result(error_type="none", tensors=len(held), held_bytes=len(held) * mib * MiB, start_free=free0,
               start_total=total0, max_memory_reserved=torch.cuda.max_memory_reserved(), seconds=f"{el:.2f}")
        return 0
    out(f"MSG {type(err).__name__}: {first_line(err)}")
    if mode == "killed":
        out(f"OOM caught after {len(held)} tensors of {mib} MiB; SIGKILL to myself now")
        os.kill(os.getpid(), 9)
    smi_pid, smi_gpu = smi_used(os.getpid())
    result(error_type=type(err).__name__, is_oom=int(is_oom(torch, err)), tensors=len(held),
           held_bytes=len(held) * mib * MiB, start_free=free0, start_total=total0, smi_pid_mib=smi_pid,
           smi_gpu_mib=smi_gpu, seconds=f"{el:.2f}", **st)
    # Held a little longer, so that the nvidia-smi sampler of cap_oom.sh sees the peak.
    time.sleep(1.5)
    del held
    return 0


def batch():
    torch = import_torch()
    free0, total0 = start_line(torch, "batch")
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    bs, err, st, last_ok = 256, None, {}, 0
    while bs <= (1 << 24):
        try:
            x = torch.randn(bs, 4096, device="cuda")
            y = torch.randint(0, 10, (bs,), device="cuda")
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            last_ok = bs
            out(f"batch {bs} ok, loss {loss.item():.3f}, max_memory_reserved {torch.cuda.max_memory_reserved()}")
            del x, y, loss
            bs *= 2
        except Exception as e:  # noqa: BLE001
            err = e
            st = at_error(torch)
            break
    if err is None:
        result(error_type="none", last_ok_batch=last_ok, start_free=free0, start_total=total0,
               max_memory_reserved=torch.cuda.max_memory_reserved())
        return 0
    out(f"MSG {type(err).__name__}: {first_line(err)}")
    smi_pid, smi_gpu = smi_used(os.getpid())
    result(error_type=type(err).__name__, is_oom=int(is_oom(torch, err)), failed_batch=bs, last_ok_batch=last_ok,
           start_free=free0, start_total=total0, smi_pid_mib=smi_pid, smi_gpu_mib=smi_gpu, **st)
    time.sleep(1.0)
    return 0


def worker():
    torch = import_torch()
    start_line(torch, "worker")
    barrier = os.environ.get("VT_BARRIER", "/tmp")
    workers = int(os.environ.get("VT_WORKERS", "2"))
    held, err = [], None
    for _ in range(64):
        try:
            held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
            out(f"pid {os.getpid()} holds {len(held)} GiB")
        except Exception as e:  # noqa: BLE001
            err = e
            break
        time.sleep(0.3)
    if err is not None:
        out(f"MSG {type(err).__name__}: {first_line(err)}")
    # Hold until every worker is done, so that none gets what another gave back.
    os.makedirs(barrier, exist_ok=True)
    with open(os.path.join(barrier, f"done.{os.getpid()}"), "w") as f:
        f.write(str(len(held)))
    deadline = time.time() + 60
    while time.time() < deadline:
        if len([n for n in os.listdir(barrier) if n.startswith("done.")]) >= workers:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    result(pid=os.getpid(), got_gib=len(held), error_type=type(err).__name__ if err else "none",
           is_oom=int(bool(err) and is_oom(torch, err)))
    return 0


def warn(mib):
    torch = import_torch()
    free0, total0 = start_line(torch, "warn")
    try:
        x = torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        ok, et = 1, "none"
    except Exception as e:  # noqa: BLE001
        out(f"MSG {type(e).__name__}: {first_line(e)}")
        ok, et, x = 0, type(e).__name__, None
    free1, total1 = torch.cuda.mem_get_info()
    result(ok=ok, error_type=et, bytes=mib * MiB, start_free=free0, start_total=total0, after_free=free1,
           after_total=total1, max_memory_reserved=torch.cuda.max_memory_reserved())
    del x
    return 0


def jax_mode():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        out("SKIP jax is not installed")
        return 3
    out(f"START pid={os.getpid()} mode=jax jax={jax.__version__} JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')} "
        f"XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '')} "
        f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', '')}")
    try:
        dev = jax.devices("gpu")[0]
    except Exception as e:  # noqa: BLE001
        out(f"FAIL jax has no GPU device: {e}")
        return 4
    x = jnp.ones((16 * MiB,), jnp.uint8).block_until_ready()
    stats = dev.memory_stats() or {}
    out("STATS " + " ".join(f"{k}={v}" for k, v in sorted(stats.items())))
    # What the driver says about the device's size inside this (capped) process.
    total = -1
    try:
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        d, t = ctypes.c_int(0), ctypes.c_size_t(0)
        if cu.cuDeviceGet(ctypes.byref(d), 0) == 0 and cu.cuDeviceTotalMem_v2(ctypes.byref(t), d) == 0:
            total = int(t.value)
    except Exception as e:  # noqa: BLE001
        out(f"cuDeviceTotalMem_v2 via ctypes failed: {e}")
    result(bytes_limit=int(stats.get("bytes_limit", -1)), pool_bytes=int(stats.get("pool_bytes", -1)),
           peak_pool_bytes=int(stats.get("peak_pool_bytes", -1)), bytes_in_use=int(stats.get("bytes_in_use", -1)),
           cu_device_total=total, array_bytes=int(x.nbytes))
    x.delete()
    return 0


def hog(path, frac):
    torch = import_torch()
    free, total = start_line(torch, "hog")
    got, x = 0, None
    for f in (frac, frac - 0.05, frac - 0.1, frac - 0.2):
        try:
            x = torch.empty(int(total * f), dtype=torch.uint8, device="cuda")
            got = x.nbytes
            break
        except Exception as e:  # noqa: BLE001
            out(f"hog: {f:.2f} of the total failed: {first_line(e)}")
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    with open(path + ".tmp", "w") as fh:
        fh.write(f"pid={os.getpid()} bytes={got} total={total} free_after={free1}\n")
    os.rename(path + ".tmp", path)
    out(f"RESULT pid={os.getpid()} bytes={got} total={total} free_after={free1}")
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.5)
    del x
    return 0


def smi_memory(uuid):
    """nvidia-smi's memory.total/reserved/used/free in MiB for the GPU with this UUID, run without the shim (it would
    otherwise be part of the job). reserved is None where nvidia-smi does not know the field."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for fields in ("memory.total,memory.reserved,memory.used,memory.free", "memory.total,memory.used,memory.free"):
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu=uuid,{fields}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20, env=env)
        except Exception as e:  # noqa: BLE001
            out(f"nvidia-smi failed: {e}")
            return {}
        if r.returncode != 0:
            out(f"nvidia-smi --query-gpu={fields}: exit {r.returncode}: {r.stderr.strip()[:120]}")
            continue
        for line in r.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if parts and parts[0] == uuid:
                vals = dict(zip(fields.split(","), parts[1:]))
                return {k.split(".")[1]: (int(v) if v.isdigit() else None) for k, v in vals.items()}
    return {}


def nvml_mode(mib):
    try:
        import pynvml
    except ImportError:
        out("SKIP pynvml (nvidia-ml-py) is not installed")
        return 3
    import ctypes

    def text(v):
        return v.decode() if isinstance(v, bytes) else str(v)

    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    uuids = [text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    # Before the driver is initialised: nothing says yet which CUDA device a GPU is, so NVML's own figures.
    pre = {u: pynvml.nvmlDeviceGetMemoryInfo(h) for u, h in zip(uuids, handles)}
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        out(f"FAIL no libcuda.so.1: {e}")
        return 4
    dev, ctx, raw = ctypes.c_int(0), ctypes.c_void_p(), (ctypes.c_ubyte * 16)()
    for what, rc in (("cuInit", lambda: cu.cuInit(0)),
                     ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                     ("cuDeviceGetUuid_v2", lambda: cu.cuDeviceGetUuid_v2(raw, dev)),
                     ("cuDevicePrimaryCtxRetain", lambda: cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
                     ("cuCtxSetCurrent", lambda: cu.cuCtxSetCurrent(ctx))):
        r = rc()
        if r != 0:
            out(f"FAIL {what} returned {r}")
            return 4
    h = bytes(raw).hex()
    uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    if uuid not in uuids:
        out(f"FAIL CUDA device 0 ({uuid}) is none of NVML's devices {uuids}")
        return 4
    handle = handles[uuids.index(uuid)]
    ptr = ctypes.c_uint64(0)
    r = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MiB))
    if r != 0:
        out(f"FAIL cuMemAlloc_v2({mib} MiB) returned {r}")
        return 4
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    kw = {}
    if hasattr(pynvml, "nvmlMemory_v2"):
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            kw = dict(v2_total=v2.total, v2_reserved=v2.reserved, v2_free=v2.free, v2_used=v2.used)
        except Exception as e:  # noqa: BLE001
            out(f"MSG nvmlDeviceGetMemoryInfo_v2: {type(e).__name__}: {first_line(e)}")
            kw = dict(v2_error=type(e).__name__)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    r = cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    smi = smi_memory(uuid)
    result(uuid=uuid, nvml_devices=n, nvml_index=uuids.index(uuid), alloc=mib * MiB,
           pre_total=pre[uuid].total, pre_free=pre[uuid].free, pre_used=pre[uuid].used,
           v1_total=v1.total, v1_free=v1.free, v1_used=v1.used, has_v2=int("v2_total" in kw), **kw,
           cu_rc=r, cu_free=free.value, cu_total=total.value,
           smi_total_mib=smi.get("total"), smi_reserved_mib=smi.get("reserved"), smi_used_mib=smi.get("used"),
           smi_free_mib=smi.get("free"))
    cu.cuMemFree_v2(ptr)
    pynvml.nvmlShutdown()
    return 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    arg = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode in ("grow", "pressure", "killed"):
        return grow(mode, int(arg or 256))
    if mode == "batch":
        return batch()
    if mode == "worker":
        return worker()
    if mode == "warn":
        return warn(int(arg or 2048))
    if mode == "jax":
        return jax_mode()
    if mode == "nvml":
        return nvml_mode(int(arg or 256))
    if mode == "hog":
        return hog(arg, float(sys.argv[3]) if len(sys.argv) > 3 else 0.9)
    out(f"FAIL unknown mode {mode!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

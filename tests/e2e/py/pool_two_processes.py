"""The issue's case on the simulated driver: a process allocates 3 GiB from its stream-ordered pool, whose
release threshold is the maximum (as PyTorch's cudaMallocAsync backend sets it), and frees it: the pool keeps
the memory. A second process of the job then asks for 3 GiB under a 4 GiB cap: refused. Once the first trims
its pool (and looks at its memory), a third process gets its 3 GiB. Prints `second RC` and `third RC`.
Run as `pool_two_processes.py` (the first process) or `pool_two_processes.py child` (the others)."""
import ctypes
import subprocess
import sys

GiB = 1 << 30
from fakectx import open_driver

cuda, dev, ctx = open_driver()


def alloc_async(size):
    p = ctypes.c_uint64()
    rc = cuda.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(size), None)
    return rc, p


if len(sys.argv) > 1:
    rc, p = alloc_async(3 * GiB)
    print(rc)
    sys.exit(0)

pool = ctypes.c_void_p()
assert cuda.cuDeviceGetMemPool(ctypes.byref(pool), dev) == 0
keep = ctypes.c_uint64(0xFFFFFFFFFFFFFFFF)
assert cuda.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep)) == 0  # RELEASE_THRESHOLD
rc, p = alloc_async(3 * GiB)
assert rc == 0, rc
assert cuda.cuMemFreeAsync(p, None) == 0


def child():
    out = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
    return out.stdout.strip()


print("second", child())
assert cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print("third", child())

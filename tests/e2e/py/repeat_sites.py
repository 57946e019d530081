"""Allocations repeated from two lines of one function, 40 times each, alternating, through ctypes on the simulated
driver (tests/e2e/tests/stacks_python.rs): every allocation of a line must name the same stack, whichever way the
shim read its Python frames (the first walk of a process validates the walker; later ones read the frames' keys).
Lines the test checks carry a marker comment `# <name>`."""

import ctypes
import sys

MIB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
assert cuda.cuInit(0) == 0
dev = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
cuda.cuCtxSetCurrent(ctx)


def step(i):
    p = ctypes.c_uint64()
    if i % 2 == 0:
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), 2 * MIB)  # even
    else:
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), 3 * MIB)  # odd
    if rc != 0:
        sys.exit("alloc failed: %d" % rc)
    cuda.cuMemFree_v2(p.value)


for i in range(80):
    step(i)
print("ok")

"""A loop on the driver API through ctypes (no framework, no bridge) that keeps 32 MiB each round beside a 64 MiB
temporary it frees, 20 ms a round, over 200 MiB allocated first. argv: rounds. Exits 1 at a refused
allocation."""

import ctypes
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
dev = ctypes.c_int()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)


def alloc(n):
    p = ctypes.c_uint64()
    if cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) != 0:
        print("refused after", len(kept), "rounds", file=sys.stderr)
        sys.exit(1)
    return p


kept = []
weights = alloc(200 << 20)
for i in range(int(sys.argv[1])):
    t = alloc(64 << 20)
    kept.append(alloc(32 << 20))
    time.sleep(0.02)
    cuda.cuMemFree_v2(t)
print("kept", len(kept))

"""Allocates 64 MiB, then 2 GiB, straight from the driver, and prints each result code: under a 1 GiB cap the
first passes and the second is refused (2, CUDA_ERROR_OUT_OF_MEMORY)."""
import ctypes

from fakectx import open_driver

cuda, dev, ctx = open_driver()
rcs = []
for size in (64 << 20, 2 << 30):
    p = ctypes.c_uint64()
    rcs.append(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)))
print("rcs", *rcs)

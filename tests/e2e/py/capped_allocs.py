"""Allocates 64 MiB, then 2 GiB, straight from the driver, and prints each result code: under a 1 GiB cap the
first passes and the second is refused (2, CUDA_ERROR_OUT_OF_MEMORY)."""
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
dev = ctypes.c_int()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
rcs = []
for size in (64 << 20, 2 << 30):
    p = ctypes.c_uint64()
    rcs.append(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)))
print("rcs", *rcs)

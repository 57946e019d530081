"""Looks up cuMemAlloc through cuGetProcAddress at version 2000, which answers the legacy 32-bit entry point
(not one the shim wraps), then the current one at 12000. Prints both results."""
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
out = []
for version in (2000, 12000):
    pfn = ctypes.c_void_p()
    status = ctypes.c_int()
    rc = cuda.cuGetProcAddress_v2(b"cuMemAlloc", ctypes.byref(pfn), version, ctypes.c_uint64(0), ctypes.byref(status))
    out.append("%d:%d" % (rc, pfn.value is not None))
print("lookups", *out)

"""Allocates 4 MiB from the driver once while running (Python frames expected in its call site) and once from a
__del__ that runs while the interpreter is being torn down (no Python frames may be read then: the shim must
see the interpreter finalizing and record native frames only)."""
import ctypes
import sys

from fakectx import open_driver

cuda, dev, ctx = open_driver()
alloc = cuda.cuMemAlloc_v2
size = ctypes.c_size_t


def running():
    p = ctypes.c_uint64()
    alloc(ctypes.byref(p), size(4 << 20))


class AtTeardown:
    def __del__(self):
        p = ctypes.c_uint64()
        alloc(ctypes.byref(p), size(8 << 20))


running()
# Kept alive by a reference cycle through a module global, collected only during finalization.
sys.modules[__name__].keeper = AtTeardown()
print("ok")

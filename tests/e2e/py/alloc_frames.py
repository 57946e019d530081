# -*- coding: utf-8 -*-
"""Allocations through ctypes at known lines, for `vramtrace run` (tests/e2e/tests/stacks_python.rs).

Calls the driver (the simulated one: libcuda.so.1 on LD_LIBRARY_PATH) through ctypes, which drops the GIL
around each call as PyTorch does around its operators. Lines the test checks carry a marker comment
`# <name>`. Allocations, in order: 64 MiB from the main thread through a method, 16 MiB from a
threading.Thread, 1 TiB (refused by the simulated 16 GiB device) from the main thread. Prints "ok" at the end.
"""

import ctypes
import sys
import threading

MIB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]


def check(rc, what):
    if rc != 0:
        sys.exit("%s failed: %d" % (what, rc))


check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")


def alloc(size):
    cuda.cuCtxSetCurrent(ctx)
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), size)  # alloc
    return rc, p.value


class Modèle:
    def poids(self):
        return alloc(64 * MIB)  # poids


def activations(out):
    out.append(alloc(16 * MIB))  # activations


def main():
    rc, weights = Modèle().poids()  # main_poids
    check(rc, "64 MiB")
    out = []
    t = threading.Thread(target=activations, args=(out,))
    t.start()
    t.join()
    check(out[0][0], "16 MiB")
    rc, _ = alloc(1 << 40)  # too_much
    if rc == 0:
        sys.exit("1 TiB succeeded")
    check(cuda.cuMemFree_v2(weights), "free")
    print("ok")


main()  # run

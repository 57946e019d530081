"""The driver with a context on device 0, as the end-to-end scripts need it (bridge_plain.py keeps its own copy:
it runs under `python -I`, which does not put its directory on sys.path)."""
import ctypes


def open_driver():
    """(the driver's library, device 0, a new context made current)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    return cuda, dev, ctx

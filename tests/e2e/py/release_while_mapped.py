"""cuMemCreate memory released while still mapped stays allocated until its last unmap (the driver's rule). Under a
1 GiB cap: 512 MiB created, mapped and released (still held), then 768 MiB asked for (refused: 1280 MiB would be
held), then unmapped (now freed) and 768 MiB asked for again (granted). Prints the three result codes."""
import ctypes

from fakectx import open_driver

cuda, dev, ctx = open_driver()
MiB = 1 << 20


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class Flags(ctypes.Structure):
    _fields_ = [("compression", ctypes.c_ubyte), ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("handle_types", ctypes.c_uint), ("location", Location),
                ("win32", ctypes.c_void_p), ("flags", Flags)]


prop = Prop(type=1, handle_types=0, location=Location(type=1, id=0))


def create(size):
    h = ctypes.c_uint64()
    return cuda.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0)), h


rc, h = create(512 * MiB)
assert rc == 0, rc
va = ctypes.c_uint64()
assert cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(512 * MiB), ctypes.c_size_t(0),
                                ctypes.c_uint64(0), ctypes.c_uint64(0)) == 0
assert cuda.cuMemMap(va, ctypes.c_size_t(512 * MiB), ctypes.c_size_t(0), h, ctypes.c_uint64(0)) == 0
assert cuda.cuMemRelease(h) == 0  # still mapped: the memory stays
while_mapped, h2 = create(768 * MiB)
assert cuda.cuMemUnmap(va, ctypes.c_size_t(512 * MiB)) == 0  # now it is freed
after_unmap, h3 = create(768 * MiB)
print("rcs", while_mapped, after_unmap)

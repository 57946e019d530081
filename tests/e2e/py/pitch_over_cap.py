"""A pitched allocation whose guessed size fits the cap but whose real pitch does not: refused after the driver
allocated it. Prints the result code and what the caller's dptr and pitch hold afterwards."""
import ctypes

from fakectx import open_driver

cuda, dev, ctx = open_driver()
p = ctypes.c_uint64(0xDEAD)
pitch = ctypes.c_size_t(0xBEEF)
# 520-byte rows x 1 Mi rows: the shim guesses 1024 B/row (512-byte padding) = 1 GiB; the driver pads to 2048.
rc = cuda.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), ctypes.c_size_t(520), ctypes.c_size_t(1 << 20), 4)
print("rc", rc, "dptr", hex(p.value), "pitch", pitch.value)

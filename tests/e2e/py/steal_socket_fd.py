"""A host that closes every descriptor it did not open and reuses the number for a socket of its own (a daemon
closing fds, then opening connections): the shim's connection to the collector must never send into it. Finds
the shim's socket among its descriptors, puts one end of its own socketpair on that number, allocates more,
and prints how many bytes its socket received (must be 0)."""
import ctypes
import os
import socket
import time

from fakectx import open_driver

cuda, dev, ctx = open_driver()


def alloc(n):
    p = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p


alloc(1 << 20)
time.sleep(0.2)  # connected, hello sent
def link(fd):
    try:
        return os.readlink("/proc/self/fd/" + fd)
    except OSError:  # the directory's own descriptor, gone by now
        return ""


theirs = [int(fd) for fd in os.listdir("/proc/self/fd") if link(fd).startswith("socket:")]
assert theirs, "no socket found"
stolen = max(theirs)
mine, peer = socket.socketpair()
os.dup2(mine.fileno(), stolen)  # the shim's socket is gone; the number is now the host's
for _ in range(50):
    alloc(1 << 20)
time.sleep(0.5)
peer.setblocking(False)
try:
    got = len(peer.recv(1 << 20))
except BlockingIOError:
    got = 0
print("stolen_fd", stolen, "received", got)

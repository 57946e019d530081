"""A thread makes the process's first tracked call (the shim's settings are read slowly: the debug build honours
VRAMTRACE_TEST_SLOW_INIT_MS) while the main thread forks. The child then makes its own first call: it must
complete, not wait for a builder that did not survive the fork. Prints `child ok` or `child stuck`."""
import ctypes
import os
import signal
import threading
import time

from fakectx import open_driver

cuda, dev, ctx = open_driver()


def alloc():
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20))
    if rc == 0:
        cuda.cuMemFree_v2(p)
    return rc


t = threading.Thread(target=alloc)
t.start()
time.sleep(0.15)  # the thread is inside the shim's first-call set-up now
pid = os.fork()
if pid == 0:
    signal.alarm(5)  # stuck: SIGALRM ends the child
    alloc()  # whatever the driver answers in a forked child: the call must return
    os._exit(0)
t.join()
deadline = time.time() + 10
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.time() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = -1
        break
    time.sleep(0.01)
print("child ok" if status == 0 else "child stuck (status %d)" % status)

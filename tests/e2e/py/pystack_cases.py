# -*- coding: utf-8 -*-
"""What libvramtrace.so's Python walker reads, case by case (tests/e2e/tests/stacks_python.rs runs this).

Usage: python3 pystack_cases.py /path/to/libvramtrace.so

Each case calls the shim's diagnostic export `vramtrace_debug_pystack` through ctypes, which drops the GIL
around the call as frameworks do around their driver calls, and prints what the walker read ("got") beside
what the interpreter itself says ("want": each frame's co_filename, f_lineno and co_qualname, or co_name before
3.11), computed on the same line as the walk so the lines agree:

    version 3.12
    case NAME
    rc N                      (the export's return: bytes written, 0 = no Python, < 0 = unsupported)
    want FILE<TAB>LINE<TAB>FUNCTION
    got FILE<TAB>LINE<TAB>FUNCTION
    end
    bench FRAMES NS_PER_WALK NS_PER_CTYPES_CALL

Lines that the test checks by itself carry a marker comment `# <name>`.
"""

import _thread
import ctypes
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1])
walk = lib.vramtrace_debug_pystack
walk.restype = ctypes.c_ssize_t
walk.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
bench = lib.vramtrace_debug_pystack_ns
bench.restype = ctypes.c_uint64
bench.argtypes = [ctypes.c_uint32]
BUF = ctypes.create_string_buffer(1 << 20)
QUALNAME = sys.version_info >= (3, 11)


def oracle(frame):
    """The interpreter's own view of `frame` and its callers, innermost first."""
    out = []
    while frame is not None:
        code = frame.f_code
        name = code.co_qualname if QUALNAME else code.co_name
        out.append((code.co_filename, frame.f_lineno, name))
        frame = frame.f_back
    return out


def parse(rc, raw):
    if rc <= 0:
        return []
    frames = []
    for line in raw.decode("utf-8").splitlines():
        where, func = line.split(" ", 1)
        file, lineno = where.rsplit(":", 1)
        frames.append((file, int(lineno), func))
    return frames


def report(name, rc, want, got):
    print("case", name)
    print("rc", rc)
    for tag, frames in (("want", want), ("got", got)):
        for f, l, fn in frames:
            print(tag, "%s\t%d\t%s" % (f, l, fn))
    print("end")


RESULTS = {}


def snap(name):
    want, rc = oracle(sys._getframe()), walk(BUF, len(BUF))  # snap
    RESULTS[name] = (rc, want, parse(rc, BUF.value))


def inner(name):
    snap(name)  # inner


def middle(name):
    inner(name)  # middle


def outer(name):
    middle(name)  # outer


class Modèle:
    def forward(self, name):
        snap(name)  # forward


def 関数(name):
    snap(name)  # ucs2


def 𠀀(name):
    snap(name)  # ucs4


def generator(name):
    snap(name)  # generator
    yield 1


def with_lambda(name):
    f = lambda: snap(name)  # lambda
    f()  # call_f


def with_comprehensions(name):
    [snap(name + "_listcomp") for _ in range(1)]  # listcomp
    list(snap(name + "_genexpr") for _ in range(1))  # genexpr


def deep(n, name):
    if n > 0:
        return deep(n - 1, name)  # deep
    snap(name)  # deep_snap


def thread_callers():
    RESULTS["thread_callers"] = oracle(sys._getframe(1))


def run():
    rc = walk(BUF, len(BUF))
    if rc < 0:
        print("version %d.%d" % sys.version_info[:2])
        print("unsupported", BUF.value.decode("utf-8").strip())
        return
    print("version %d.%d" % sys.version_info[:2])

    outer("main_nested")  # main_nested
    Modèle().forward("method")  # method
    関数("ucs2")  # call_ucs2
    𠀀("ucs4")  # call_ucs4
    next(generator("generator"))  # call_generator
    with_lambda("lambda")  # call_lambda
    with_comprehensions("comprehension")  # call_comprehensions
    deep(5, "deep")  # call_deep

    t = threading.Thread(target=outer, args=("thread_nested",))
    t.start()
    t.join()

    # A thread whose only Python is the threading module's bootstrap: its target is the C function itself.
    # What the interpreter says of those frames comes from an identical thread whose target is Python.
    t = threading.Thread(target=thread_callers)
    t.start()
    t.join()
    t = threading.Thread(target=walk, args=(BUF, len(BUF)))
    t.start()
    t.join()
    RESULTS["bootstrap_only"] = (len(BUF.value), RESULTS.pop("thread_callers"), parse(1, BUF.value))

    # A thread that runs no Python at all (the walk writes an empty string).
    BUF.value = b"X"
    _thread.start_new_thread(walk, (BUF, len(BUF)))
    deadline = time.time() + 30
    while BUF.value == b"X" and time.time() < deadline:
        time.sleep(0.01)
    RESULTS["no_python"] = (0 if BUF.value == b"" else -999, [], parse(1, BUF.value))

    for name in sorted(RESULTS):
        report(name, *RESULTS[name])

    # Cost of one walk at a depth of exactly 20 frames (measured inside the shim), and of the whole ctypes
    # call of the text export at the same depth (ctypes and the formatting included).
    def timed(depth_left):
        if depth_left > 0:
            return timed(depth_left - 1)
        frames = len(oracle(sys._getframe()))
        ns = bench(20000)
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            walk(BUF, len(BUF))
        per_call = (time.perf_counter() - t0) / n * 1e9
        return frames, ns, per_call

    here = len(oracle(sys._getframe()))
    print("bench %d %d %d" % timed(20 - here - 1))


run()  # run

#!/usr/bin/env python3
"""CuPy case for scripts/gpu/check.sh. Usage: cupy_case.py MODE, MODE one of

  nopool  cupy.cuda.set_allocator(None): every array is its own cudaMalloc/cudaFree; arrays of known sizes in a
          known pattern. Figure and expected: the peak of the bytes this script held (sum of nbytes)
  pool    the default memory pool; figure: the peak of cupy.get_default_memory_pool().total_bytes() (what the pool
          got from the driver), sampled after every step, with free_all_blocks() between rounds; expected: the peak
          of the bytes this script held

Prints one line `RESULT framework_peak_bytes=<n> expected_bytes=<n> ...`.
Exit 3 (SKIP line) when cupy is not installed, 4 when it sees no device."""
import sys

MiB = 1 << 20

PATTERN = [
    ("+", "w", 64), ("+", "a1", 32), ("+", "a2", 128), ("-", "a1", 0), ("+", "ws", 16),
    ("+", "a3", 256), ("-", "a2", 0), ("-", "ws", 0), ("+", "g", 96), ("-", "a3", 0), ("-", "g", 0),
    ("-", "w", 0),
]


def result(**kw):
    print("RESULT " + " ".join(f"{k}={v}" for k, v in kw.items()), flush=True)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "nopool"
    try:
        import cupy as cp
    except ImportError:
        print("SKIP cupy is not installed", flush=True)
        return 3
    try:
        ndev = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print(f"FAIL cupy sees no device: {e}", flush=True)
        return 4
    print(f"cupy {cp.__version__} mode={mode} devices={ndev}", flush=True)
    pool = cp.get_default_memory_pool()
    if mode == "nopool":
        cp.cuda.set_allocator(None)
    held, cur, peak, n, pool_peak = {}, 0, 0, 0, 0
    for _ in range(3):
        for op, name, mib in PATTERN:
            if op == "+":
                a = cp.empty((mib * MiB,), dtype=cp.uint8)
                held[name] = a
                cur += a.nbytes
                n += 1
                peak = max(peak, cur)
                del a  # only `held` keeps it alive
            else:
                cur -= held.pop(name).nbytes
            if mode == "pool":
                pool_peak = max(pool_peak, pool.total_bytes())
        cp.cuda.Device().synchronize()
        if mode == "pool":
            pool.free_all_blocks()
    for name in list(held):
        held.pop(name)
    cp.cuda.Device().synchronize()
    if mode == "pool":
        pool_peak = max(pool_peak, pool.total_bytes())
        result(framework_peak_bytes=pool_peak, expected_bytes=peak, figure="pool_total_bytes_peak", allocations=n)
    else:
        result(framework_peak_bytes=peak, expected_bytes=peak, figure="script_held_peak", allocations=n,
               pool_total_bytes=pool.total_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())

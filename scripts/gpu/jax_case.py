#!/usr/bin/env python3
"""JAX case for scripts/gpu/check.sh. Usage: jax_case.py MODE (run with JAX_PLATFORMS=cuda so that a broken GPU
backend fails loudly instead of falling back to the CPU), MODE one of

  noprealloc  run with XLA_PYTHON_CLIENT_PREALLOCATE=false: arrays of known sizes in a known pattern. Figure: the
              BFC pool's peak (memory_stats 'peak_pool_bytes', else 'peak_bytes_reserved', else
              'peak_bytes_in_use'); expected: the peak of the bytes this script held (sum of nbytes)
  prealloc    default preallocation: figure as above (the preallocated pool); expected: 75% of the device's total
              (cuDeviceTotalMem_v2), XLA's default XLA_PYTHON_CLIENT_MEM_FRACTION

Prints `STATS {...}` (every memory_stats key) and one line `RESULT framework_peak_bytes=<n> expected_bytes=<n> ...`.
Exit 3 (SKIP line) when jax is not installed, 4 when it has no GPU device."""
import ctypes
import json
import os
import subprocess
import sys

MiB = 1 << 20


def result(**kw):
    print("RESULT " + " ".join(f"{k}={v}" for k, v in kw.items()), flush=True)


def device_total():
    """The device's total memory as the driver reports it (no context needed), else nvidia-smi's MiB figure."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0 \
                and cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev) == 0:
            return int(total.value), "cuDeviceTotalMem_v2"
    except Exception:  # noqa: BLE001
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(float(out.strip().splitlines()[0])) * MiB, "nvidia-smi"
    except Exception:  # noqa: BLE001
        return 0, "unknown"


def pool_figure(stats):
    for key in ("peak_pool_bytes", "peak_bytes_reserved", "peak_bytes_in_use"):
        if stats.get(key):
            return key, int(stats[key])
    return "none", 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "noprealloc"
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("SKIP jax is not installed", flush=True)
        return 3
    print(f"jax {jax.__version__} mode={mode} JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')} "
          f"XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '')} "
          f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', '')}", flush=True)
    try:
        devs = jax.devices("gpu")
    except Exception as e:  # noqa: BLE001
        print(f"FAIL jax has no GPU device: {e}", flush=True)
        return 4
    dev = devs[0]
    print(f"device {dev} backend {jax.default_backend()}", flush=True)

    held, cur, peak, n = {}, 0, 0, 0
    if mode == "prealloc":
        x = jnp.ones((16 * MiB,), jnp.uint8).block_until_ready()
        held["x"] = x
        cur = peak = x.nbytes
        n = 1
    else:
        pattern = [
            ("+", "w", 64), ("+", "a1", 32), ("+", "a2", 128), ("-", "a1", 0), ("+", "ws", 16),
            ("+", "a3", 256), ("-", "a2", 0), ("-", "ws", 0), ("+", "g", 96), ("-", "a3", 0), ("-", "g", 0),
            ("-", "w", 0),
        ]
        for _ in range(3):
            for op, name, mib in pattern:
                if op == "+":
                    a = jnp.full((mib * MiB,), 1, jnp.uint8).block_until_ready()
                    held[name] = a
                    cur += a.nbytes
                    n += 1
                    peak = max(peak, cur)
                else:
                    a = held.pop(name)
                    cur -= a.nbytes
                    a.delete()
    stats = dev.memory_stats() or {}
    print("STATS " + json.dumps(stats, sort_keys=True), flush=True)
    figure, value = pool_figure(stats)
    if mode == "prealloc":
        total, source = device_total()
        frac = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or 0.75)
        expected = int(total * frac)
        result(framework_peak_bytes=value, expected_bytes=expected, figure=figure, device_total=total,
               total_source=source, fraction=frac, bytes_limit=int(stats.get("bytes_limit", 0)),
               peak_bytes_in_use=int(stats.get("peak_bytes_in_use", 0)), script_peak=peak)
    else:
        result(framework_peak_bytes=value, expected_bytes=peak, figure=figure,
               peak_bytes_in_use=int(stats.get("peak_bytes_in_use", 0)),
               bytes_limit=int(stats.get("bytes_limit", 0)), allocations=n)
    for a in held.values():
        a.delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())

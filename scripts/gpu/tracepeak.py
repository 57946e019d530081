#!/usr/bin/env python3
"""Reads `vramtrace report --json` output and prints one line of whitespace-separated numbers:

    device_peak process_peak events dropped_events n_devices n_processes

Tolerant of schema details it does not rely on: missing keys count as 0, `events` may be a number or a list.
Exit 1 (and prints nothing) when the file is not JSON."""
import json
import sys


def number(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return int(v)
    if isinstance(v, (list, tuple)):
        return len(v)
    if isinstance(v, dict):
        for k in ("total", "count", "n"):
            if k in v:
                return number(v[k])
        return sum(number(x) for x in v.values())
    return 0


def peak(entries):
    vals = [number(e.get("peak_bytes", 0)) for e in entries if isinstance(e, dict)]
    return max(vals) if vals else 0


def main():
    try:
        with open(sys.argv[1]) as f:
            d = json.load(f)
    except Exception as e:  # noqa: BLE001
        print(f"tracepeak: {e}", file=sys.stderr)
        return 1
    devices = d.get("devices") or []
    processes = d.get("processes") or []
    if isinstance(devices, dict):
        devices = list(devices.values())
    if isinstance(processes, dict):
        processes = list(processes.values())
    print(
        peak(devices),
        peak(processes),
        number(d.get("events", 0)),
        number(d.get("dropped_events", 0)),
        len(devices),
        len(processes),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

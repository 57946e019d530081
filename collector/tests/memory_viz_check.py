#!/usr/bin/env python3
"""Checks a snapshot pickle as PyTorch's memory_viz (torch/utils/viz/MemoryViz.js) would read it, with the
standard library only: `memory_viz_check.py FILE` prints a JSON summary, or fails with the reason.

- the pickle: protocol 2 to 4, only the opcodes MemoryViz.js's unpickler knows, every integer in 64-bit signed;
- the structure: `segments` (device, address, total_size, stream, frames, blocks) and `device_traces` (a list
  per device ordinal) whose entries have action, addr (device_free for oom), size, stream, frames
  (filename, line, name);
- blocks tile their segment in address order (memory_viz recomputes their addresses from the sizes);
- "Allocator State History": replaying each device's trace backwards from the final segments, as
  MemoryViz.js's simulate_memory does, finds every segment and block where the trace says, and every block
  inside a segment at every step (its draw() throws otherwise).
"""
import json
import pickle
import pickletools
import sys

# The opcodes MemoryViz.js's unpickler handles.
KNOWN = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
    "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND",
    "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
    "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM",
}
I64 = (-(1 << 63), (1 << 63) - 1)
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}


def fail(msg):
    sys.exit("memory_viz_check: " + msg)


def check_opcodes(raw):
    proto = None
    for op, arg, pos in pickletools.genops(raw):
        if op.name not in KNOWN:
            fail(f"opcode {op.name} at {pos} is not one memory_viz reads")
        if op.name == "PROTO":
            proto = arg
            if not 2 <= arg <= 4:
                fail(f"protocol {arg}: memory_viz reads 2 to 4")
        if op.name == "LONG1" and not I64[0] <= arg <= I64[1]:
            fail(f"integer {arg} at {pos} does not fit in 64-bit signed")
    if proto is None:
        fail("no PROTO opcode")


def check_ints(x, where):
    if isinstance(x, bool):
        return
    if isinstance(x, int):
        if not I64[0] <= x <= I64[1]:
            fail(f"{where}: {x} does not fit in 64-bit signed")
    elif isinstance(x, dict):
        for k, v in x.items():
            check_ints(v, f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            check_ints(v, f"{where}[{i}]")


def check_frames(frames, where):
    if not isinstance(frames, list):
        fail(f"{where}: frames is not a list")
    for f in frames:
        for k, t in (("filename", str), ("line", int), ("name", str)):
            if not isinstance(f.get(k), t):
                fail(f"{where}: a frame without {k}: {f}")


class Segments:
    """MemoryViz.js's segment list in simulate_memory, with its map_segment/unmap_segment."""

    def __init__(self, segs):
        self.l = sorted(segs, key=lambda s: s["addr"])

    def map_segment(self, merge, seg):
        idx = next((i for i, e in enumerate(self.l) if e["addr"] > seg["addr"]), -1)
        if not merge:
            self.l.insert(idx if idx != -1 else len(self.l), seg)
            return
        if idx == -1:
            idx = len(self.l)
        self.l.insert(idx, seg)
        if idx + 1 < len(self.l):
            nxt = self.l[idx + 1]
            if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                seg["size"] += nxt["size"]
                del self.l[idx + 1]
        if idx > 0:
            prev = self.l[idx - 1]
            if prev["addr"] + prev["size"] == seg["addr"] and prev["stream"] == seg["stream"]:
                prev["size"] += seg["size"]
                del self.l[idx]

    def unmap_segment(self, merge, seg, where):
        if not merge:
            idx = next((i for i, x in enumerate(self.l) if x["addr"] == seg["addr"]), -1)
            if idx == -1:
                fail(f"{where}: segment_alloc of {seg['addr']:#x} with no such segment at that point")
            if self.l[idx]["size"] != seg["size"]:
                fail(f"{where}: segment_alloc of {seg['addr']:#x} size {seg['size']} but the segment has "
                     f"{self.l[idx]['size']}")
            del self.l[idx]
            return
        end = seg["addr"] + seg["size"]
        idx = next((i for i, e in enumerate(self.l) if e["addr"] <= seg["addr"] and end <= e["addr"] + e["size"]),
                   -1)
        if idx == -1:
            fail(f"{where}: segment_map of {seg['addr']:#x} with no segment holding it (memory_viz throws)")
        ex = self.l[idx]
        ex_end = ex["addr"] + ex["size"]
        if ex["addr"] == seg["addr"]:
            ex["addr"] += seg["size"]
            ex["size"] -= seg["size"]
            if ex["size"] == 0:
                del self.l[idx]
        elif ex_end == end:
            ex["size"] -= seg["size"]
        else:
            ex["size"] = seg["addr"] - ex["addr"]
            self.l.insert(idx + 1, {"addr": end, "size": ex_end - end, "stream": seg["stream"]})

    def holds(self, addr, size):
        return any(s["addr"] <= addr and addr + size <= s["addr"] + s["size"] for s in self.l)

    def total(self):
        return sum(s["size"] for s in self.l)


def check_device(d, segments, trace):
    where = f"device {d}"
    segs = Segments([{"addr": s["address"], "size": s["total_size"], "stream": s["stream"]}
                     for s in segments if s["device"] == d])
    blocks = {}
    final_seg_bytes = segs.total()
    for s in segments:
        if s["device"] != d:
            continue
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = b["size"]
            addr += b["size"]
    final_block_bytes = sum(blocks.values())
    # Backwards, as simulate_memory: the state before each event.
    peak = final_seg_bytes
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        at = f"{where} event {i} ({e['action']})"
        a = e["action"]
        if a == "free_completed":
            if e["addr"] in blocks:
                fail(f"{at}: block {e['addr']:#x} freed but still live after")
            if not segs.holds(e["addr"], e["size"]):
                fail(f"{at}: block {e['addr']:#x} outside every segment (memory_viz's draw throws)")
            blocks[e["addr"]] = e["size"]
        elif a == "alloc":
            if e["addr"] not in blocks:
                fail(f"{at}: block {e['addr']:#x} allocated but not live after")
            del blocks[e["addr"]]
        elif a in ("segment_free", "segment_unmap"):
            segs.map_segment(a == "segment_unmap",
                             {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
        elif a in ("segment_alloc", "segment_map"):
            segs.unmap_segment(a == "segment_map",
                               {"addr": e["addr"], "size": e["size"], "stream": e["stream"]}, at)
            for b, size in blocks.items():
                if not segs.holds(b, size):
                    fail(f"{at}: block {b:#x} left outside every segment (memory_viz's draw throws)")
        peak = max(peak, segs.total())
    return {
        "events": len(trace),
        "final_segment_bytes": final_seg_bytes,
        "final_block_bytes": final_block_bytes,
        "initial_segment_bytes": segs.total(),
        "peak_segment_bytes": peak,
        "ooms": [{"size": e["size"], "device_free": e["device_free"]} for e in trace if e["action"] == "oom"],
        "actions": sorted({e["action"] for e in trace}),
    }


def main(path):
    raw = open(path, "rb").read()
    check_opcodes(raw)
    snap = pickle.loads(raw)
    check_ints(snap, "snapshot")
    if not isinstance(snap, dict) or "segments" not in snap or "device_traces" not in snap:
        fail("no segments or device_traces")
    for i, s in enumerate(snap["segments"]):
        for k in ("device", "address", "total_size", "stream", "blocks"):
            if k not in s:
                fail(f"segment {i} has no {k}")
        check_frames(s.get("frames", []), f"segment {i}")
        # Tiling: the blocks' sizes, in order, cover the segment exactly.
        if sum(b["size"] for b in s["blocks"]) != s["total_size"]:
            fail(f"segment {i}: blocks do not tile it")
        addr = s["address"]
        for j, b in enumerate(s["blocks"]):
            if b.get("address", addr) != addr:
                fail(f"segment {i} block {j}: address {b.get('address'):#x}, tiling says {addr:#x}")
            if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
                fail(f"segment {i} block {j}: state {b['state']}")
            check_frames(b.get("frames", []), f"segment {i} block {j}")
            addr += b["size"]
    by_dev = {}
    for s in snap["segments"]:
        by_dev.setdefault(s["device"], []).append(s)
    for d, l in by_dev.items():
        l.sort(key=lambda s: s["address"])
        for x, y in zip(l, l[1:]):
            if x["address"] + x["total_size"] > y["address"]:
                fail(f"device {d}: segments {x['address']:#x} and {y['address']:#x} overlap")
    out = {"devices": {}, "segments": len(snap["segments"]), "notes": snap.get("vramtrace", {}).get("notes", []),
           "hosts": snap.get("vramtrace", {}).get("hosts", []),
           "first_time_us": [min((e["time_us"] for e in t), default=None) for t in snap["device_traces"]]}
    # Devices that hold PyTorch's own allocator history, as PyTorch wrote it (the bridge's --torch-history
    # snapshots): checked for what memory_viz reads, not replayed (PyTorch's history is its own to keep).
    torch = set(snap.get("vramtrace", {}).get("torch_devices", []))
    for d, trace in enumerate(snap["device_traces"]):
        if d in torch:
            for i, e in enumerate(trace):
                for k in ("action", "addr", "size", "time_us"):
                    if k not in e:
                        fail(f"device {d} (PyTorch's history) event {i} has no {k}")
            segs = [s for s in snap["segments"] if s["device"] == d]
            out["devices"][str(d)] = {"torch": True, "events": len(trace), "segments": len(segs),
                                      "actions": sorted({e["action"] for e in trace}),
                                      "segment_bytes": sum(s["total_size"] for s in segs)}
            continue
        for i, e in enumerate(trace):
            for k in ("action", "size", "stream"):
                if k not in e:
                    fail(f"device {d} event {i} has no {k}")
            if e["action"] not in ACTIONS:
                fail(f"device {d} event {i}: action {e['action']}")
            if ("device_free" if e["action"] == "oom" else "addr") not in e:
                fail(f"device {d} event {i} ({e['action']}) has no address")
            check_frames(e.get("frames", []), f"device {d} event {i}")
        out["devices"][str(d)] = check_device(d, snap["segments"], trace)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])

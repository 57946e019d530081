#!/usr/bin/env python3
"""Reads a vramtrace trace file directly (docs/TRACE-FORMAT.md) and JSON answers of `vramtrace report --json` /
`vramtrace oom --json`, for scripts/gpu/check.sh and scripts/gpu/cap_oom.sh. Standard library only.

    vtread.py split TRACE --mode MODE [--snapshot FILE] [--figure BYTES]
        Replays every allocation and free of the trace (all processes, in time order, a process's memory gone
        when it ends) and splits the device's bytes in use into the framework's allocator ("in") and everything
        else ("out": cuBLAS/cuBLASLt workspaces, other libraries). MODE says what belongs to the allocator:
          torch-default     cuMemAlloc_v2 allocations whose address is a segment address of the snapshot
                            (torch.cuda.memory_snapshot(), written by torch_case.py)
          torch-expandable  cuMemCreate handles (cross-checked: handles mapped inside the snapshot's segments)
          torch-async       cuMemAllocAsync / cuMemAllocFromPoolAsync
          jax               the BFC pool: allocations of 1 MiB or more (XLA's BFC regions start at 2 MiB); with
                            --figure, other rules (by API) are tried first and the one matching exactly is kept
        Prints key=value lines: total_peak, in_at_peak, out_at_peak, in_peak, out_desc, rule, ...
    vtread.py ooms TRACE
        The out-of-memory records (frame kind 7) and over-cap events: key=value lines.
    vtread.py report REPORT_JSON
        Figures from `vramtrace report --json`: key=value lines.
    vtread.py oomverb OOM_JSON
        Figures from `vramtrace oom --json`: key=value lines.

Every subcommand exits 0 with its lines, or 1 with a message on stderr."""
import json
import struct
import sys

MiB = 1 << 20
KiB = 1 << 10
M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
NO_DEVICE = M32

API = {1: "cuMemAlloc_v2", 2: "cuMemAllocPitch_v2", 3: "cuMemAllocManaged", 4: "cuMemFree_v2",
       5: "cuMemAllocAsync", 6: "cuMemAllocFromPoolAsync", 7: "cuMemFreeAsync", 8: "cuMemCreate",
       9: "cuMemRelease", 10: "cuMemMap", 11: "cuMemUnmap", 12: "cuMemAddressReserve", 13: "cuMemAddressFree",
       14: "cuMemGetInfo_v2"}
ALLOC_PTR = {1, 2, 3, 5, 6}
ALLOC_HANDLE = {8}
FREE_PTR = {4, 7}
FREE_HANDLE = {9}
MAP = 10
FLAG_PTSZ, FLAG_REFUSED, FLAG_OVER_CAP = 1, 2, 4


class Short(Exception):
    pass


def leb(b, pos):
    v, shift = 0, 0
    while True:
        if pos >= len(b):
            raise Short("varint past the end")
        x = b[pos]
        pos += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            return v, pos
        shift += 7
        if shift > 63:
            raise Short("bad varint")


def unzz(v):
    return (v >> 1) ^ -(v & 1)


def bvar(b, pos):
    """bincode 2 standard-config varint (unsigned)."""
    if pos >= len(b):
        raise Short("bincode past the end")
    x = b[pos]
    if x < 251:
        return x, pos + 1
    n = {251: 2, 252: 4, 253: 8, 254: 16}.get(x)
    if n is None or pos + 1 + n > len(b):
        raise Short("bad bincode varint")
    return int.from_bytes(b[pos + 1:pos + 1 + n], "little"), pos + 1 + n


def bopt(b, pos):
    tag = b[pos]
    if tag == 0:
        return None, pos + 1
    return bvar(b, pos + 1)


def decode_events(p, with_stacks=False):
    """Kind 2 (format 1) or kind 8 (format 2: a stack id after aux). Tuples keep their format-1 shape."""
    pid, pos = leb(p, 0)
    n, pos = leb(p, pos)
    ts = tid = addr = aux = 0
    out = []
    for _ in range(n):
        v, pos = leb(p, pos)
        ts = (ts + unzz(v)) & M64
        v, pos = leb(p, pos)
        tid = (tid + unzz(v)) & M32
        api, flags = p[pos], p[pos + 1]
        pos += 2
        dev, pos = leb(p, pos)
        dev = (dev - 1) & M32
        result, pos = leb(p, pos)
        v, pos = leb(p, pos)
        addr = (addr + unzz(v)) & M64
        size, pos = leb(p, pos)
        v, pos = leb(p, pos)
        aux = (aux + unzz(v)) & M64
        if with_stacks:
            _stack, pos = leb(p, pos)
        out.append((ts, tid, api, flags, dev, result, addr, size, aux))
    return pid, out


def decode_oom(p):
    o = {}
    pos = 0
    for k in ("pid", "tid", "ts_ns", "device"):
        o[k], pos = bvar(p, pos)
    o["api"], o["flags"] = p[pos], p[pos + 1]
    pos += 2
    o["requested_bytes"], pos = bvar(p, pos)
    o["result"], pos = bvar(p, pos)
    for k in ("device_free_bytes", "device_total_bytes", "cap_bytes", "job_used_bytes", "process_used_bytes"):
        o[k], pos = bopt(p, pos)
    o["cap_refused"] = bool(o["flags"] & FLAG_REFUSED)
    return o


def read_trace(path):
    """Returns dict: events [(ts, seq, pid, ev)], ends {pid: ts}, ooms [dict], partial (str or None)."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:8] != b"VRAMTRC\0":
        raise ValueError(f"{path}: not a vramtrace trace (bad magic)")
    (hlen,) = struct.unpack_from("<I", b, 10)
    pos = 14 + hlen
    events, ends, ooms, partial, seq = [], {}, [], None, 0
    kinds = {}
    while pos < len(b):
        if pos + 4 > len(b):
            partial = f"cut in a frame length at {pos}"
            break
        (flen,) = struct.unpack_from("<I", b, pos)
        if flen == 0 or pos + 4 + flen > len(b):
            partial = f"cut frame at {pos} (length {flen})"
            break
        kind = b[pos + 4]
        payload = b[pos + 5:pos + 4 + flen]
        pos += 4 + flen
        kinds[kind] = kinds.get(kind, 0) + 1
        try:
            if kind in (2, 8):
                pid, evs = decode_events(payload, kind == 8)
                for e in evs:
                    events.append((e[0], seq, pid, e))
                    seq += 1
            elif kind == 6:
                pid, p2 = bvar(payload, 0)
                ts, _ = bvar(payload, p2)
                ends[pid] = ts
            elif kind == 7:
                ooms.append(decode_oom(payload))
        except (Short, IndexError) as e:
            print(f"vtread: frame kind {kind} undecodable: {e}", file=sys.stderr)
    events.sort(key=lambda x: (x[0], x[1]))
    return {"events": events, "ends": ends, "ooms": ooms, "partial": partial, "kinds": kinds}


def human(n):
    if n and n % MiB == 0:
        return f"{n // MiB}MiB"
    if n and n % KiB == 0:
        return f"{n // KiB}KiB"
    return f"{n}B"


def describe(allocs):
    """'cuMemAlloc_v2 64MiBx2 128KiBx2 4Bx1' for a list of (api, size)."""
    groups = {}
    for api, size in allocs:
        groups.setdefault(API.get(api, str(api)), {}).setdefault(size, 0)
        groups[API.get(api, str(api))][size] += 1
    parts = []
    for api in sorted(groups):
        sizes = sorted(groups[api].items(), key=lambda kv: -kv[0])
        parts.append(api + " " + " ".join(f"{human(s)}x{c}" for s, c in sizes))
    return "; ".join(parts) if parts else "none"


def replay(tr, pred):
    """One pass over the trace. pred(api, addr, size, pid) -> True when the allocation is the allocator's.
    Returns per-device figures for the device with the highest peak."""
    items = [(ts, s, "ev", pid, e) for ts, s, pid, e in tr["events"]]
    big = len(items) + 1
    items += [(ts, big + i, "end", pid, None) for i, (pid, ts) in enumerate(sorted(tr["ends"].items()))]
    items.sort(key=lambda x: (x[0], x[1]))
    live = {}  # (pid, ns, addr) -> (size, dev, api, in?)
    cur, cur_in = {}, {}
    st = {}
    handle_va = {}

    def dstat(d):
        return st.setdefault(d, {"total_peak": 0, "in_at_peak": 0, "peak_live": [], "in_peak": 0,
                                 "out_peak": 0, "in_peak_live": [], "allocs": 0})

    def changed(d):
        s = dstat(d)
        tot, cin = cur.get(d, 0), cur_in.get(d, 0)
        if tot > s["total_peak"]:
            s["total_peak"], s["in_at_peak"] = tot, cin
            s["peak_live"] = None  # filled in by a second pass (the set at the first moment of the peak)
            s["peak_seq"] = seq_now[0]
        if cin > s["in_peak"]:
            s["in_peak"] = cin
            s["in_peak_seq"] = seq_now[0]
        if tot - cin > s["out_peak"]:
            s["out_peak"] = tot - cin

    seq_now = [0]
    snapshots = {}

    def run(stop_at=None):
        live.clear()
        cur.clear()
        cur_in.clear()
        for i, (ts, _, what, pid, e) in enumerate(items):
            seq_now[0] = i
            if what == "end":
                for key in [k for k in live if k[0] == pid]:
                    size, d, api, inn = live.pop(key)
                    cur[d] -= size
                    if inn:
                        cur_in[d] -= size
            else:
                _, _, api, flags, dev, result, addr, size, aux = e
                if result != 0 or flags & FLAG_REFUSED:
                    pass
                elif api in ALLOC_PTR or api in ALLOC_HANDLE:
                    ns = "h" if api in ALLOC_HANDLE else "p"
                    key = (pid, ns, addr)
                    if key in live:  # lost free
                        osize, od, _, oin = live.pop(key)
                        cur[od] -= osize
                        if oin:
                            cur_in[od] -= osize
                    inn = bool(pred(api, addr, size, pid))
                    live[key] = (size, dev, api, inn)
                    cur[dev] = cur.get(dev, 0) + size
                    if inn:
                        cur_in[dev] = cur_in.get(dev, 0) + size
                    if stop_at is None:
                        dstat(dev)["allocs"] += 1
                        changed(dev)
                elif api in FREE_PTR or api in FREE_HANDLE:
                    key = (pid, "h" if api in FREE_HANDLE else "p", addr)
                    if key in live:
                        size, d, _, inn = live.pop(key)
                        cur[d] -= size
                        if inn:
                            cur_in[d] -= size
                elif api == MAP and stop_at is None:
                    handle_va.setdefault((pid, aux), []).append((addr, size))
            if stop_at is not None and i in stop_at:
                snapshots[i] = [(v[2], v[0], v[3], k[2]) for k, v in live.items() if v[1] == stop_at[i]]
        return st

    run()
    if not st:
        return None, handle_va
    dev = max(st, key=lambda d: st[d]["total_peak"])
    s = st[dev]
    want = {}
    if "peak_seq" in s:
        want[s["peak_seq"]] = dev
    if "in_peak_seq" in s:
        want[s["in_peak_seq"]] = dev
    run(stop_at=want)
    s["peak_live"] = snapshots.get(s.get("peak_seq"), [])
    s["in_peak_live"] = snapshots.get(s.get("in_peak_seq"), [])
    s["device"] = dev
    return s, handle_va


def cmd_split(args):
    path = args[0]
    mode, snap_path, figure = "torch-default", None, None
    i = 1
    while i < len(args):
        if args[i] == "--mode":
            mode = args[i + 1]
        elif args[i] == "--snapshot":
            snap_path = args[i + 1]
        elif args[i] == "--figure":
            figure = int(args[i + 1]) if args[i + 1].isdigit() else None
        i += 2
    tr = read_trace(path)
    out = {"events": len(tr["events"]), "partial": tr["partial"] or "no"}
    snap = None
    if snap_path:
        try:
            with open(snap_path) as f:
                snap = json.load(f)
        except Exception as e:  # noqa: BLE001
            out["snapshot"] = f"unreadable: {type(e).__name__}"
    segs = (snap or {}).get("segments") or []
    seg_addrs = {int(sg["address"]) for sg in segs if "address" in sg}
    seg_bytes = sum(int(sg.get("total_size", 0)) for sg in segs)
    if snap is not None:
        out["snapshot_segments"] = len(segs)
        out["snapshot_segment_bytes"] = seg_bytes
        if snap.get("error"):
            out["snapshot_error"] = snap["error"]

    rules = []
    if mode == "torch-default":
        rules = [("cuMemAlloc_v2 at a snapshot segment address", lambda a, ad, s, p: a == 1 and ad in seg_addrs)]
    elif mode == "torch-expandable":
        rules = [("cuMemCreate handles", lambda a, ad, s, p: a == 8)]
    elif mode == "torch-async":
        rules = [("cuMemAllocAsync/cuMemAllocFromPoolAsync", lambda a, ad, s, p: a in (5, 6))]
    elif mode == "jax":
        rules = [("allocations >= 1 MiB (BFC regions)", lambda a, ad, s, p: s >= MiB),
                 ("cuMemAlloc_v2", lambda a, ad, s, p: a == 1),
                 ("cuMemCreate", lambda a, ad, s, p: a == 8),
                 ("cuMemAllocAsync/FromPool", lambda a, ad, s, p: a in (5, 6)),
                 ("allocations >= 2 MiB", lambda a, ad, s, p: s >= 2 * MiB),
                 ("the largest allocation only", None)]
    else:
        print(f"vtread: unknown mode {mode}", file=sys.stderr)
        return 1

    chosen = None
    for name, pred in rules:
        if pred is None:
            # The largest single allocation (a preallocated pool is one).
            sizes = [e[3][7] for e in tr["events"] if e[3][2] in ALLOC_PTR | ALLOC_HANDLE and e[3][5] == 0]
            if not sizes:
                continue
            top = max(sizes)
            pred = (lambda t: (lambda a, ad, s, p: s == t))(top)
        s, hv = replay(tr, pred)
        if s is None:
            break
        if chosen is None:
            chosen = (name, s, hv)
        if figure is None or s["in_peak"] == figure:
            chosen = (name, s, hv)
            break
    if chosen is None:
        out["error"] = "no allocations in the trace"
        for k, v in out.items():
            print(f"{k}={v}")
        return 0
    name, s, hv = chosen
    out["rule"] = name
    out["device"] = s["device"]
    out["total_peak"] = s["total_peak"]
    out["in_at_peak"] = s["in_at_peak"]
    out["out_at_peak"] = s["total_peak"] - s["in_at_peak"]
    out["in_peak"] = s["in_peak"]
    out["out_peak"] = s["out_peak"]
    outs = [(api, size) for api, size, inn, _ in s["peak_live"] if not inn]
    ins = [(api, size) for api, size, inn, _ in s["peak_live"] if inn]
    out["n_in_at_peak"] = len(ins)
    out["n_out_at_peak"] = len(outs)
    out["out_desc"] = describe(outs)
    out["in_desc"] = describe(ins) if len(ins) <= 12 else f"{len(ins)} allocations"
    if mode == "torch-expandable" and segs:
        # Which cuMemCreate handles were mapped inside a snapshot segment's VA range.
        ranges = [(int(sg["address"]), int(sg["address"]) + int(sg.get("total_size", 0))) for sg in segs]
        inside = 0
        handles = [(ad) for api, size, inn, ad in s["peak_live"] if api == 8]
        for h in handles:
            maps = [m for (pid, hh), ms in hv.items() if hh == h for m in ms]
            if any(lo <= va < hi for va, _ in maps for lo, hi in ranges):
                inside += 1
        out["handles_mapped_in_segments"] = f"{inside}/{len(handles)}"
    if figure is not None and s["in_peak"] != figure:
        # What rounding of the allocator's allocations (at its own peak) would give the figure.
        live_in = [size for api, size, inn, _ in s["in_peak_live"] if inn]
        hits = []
        for g in (256, 512, 1024, 4096, 65536, 2 * MiB, 20 * MiB):
            if sum(-(-x // g) * g for x in live_in) == figure:
                hits.append(human(g))
        out["rounding_that_matches"] = ",".join(hits) if hits else "none"
        out["in_peak_live_count"] = len(live_in)
    for k, v in out.items():
        print(f"{k}={v}")
    return 0


def cmd_ooms(args):
    tr = read_trace(args[0])
    ooms = tr["ooms"]
    over = sum(1 for e in tr["events"] if e[3][3] & FLAG_OVER_CAP)
    refused = sum(1 for e in tr["events"] if e[3][3] & FLAG_REFUSED)
    failed2 = sum(1 for e in tr["events"] if e[3][5] == 2 and e[3][2] in ALLOC_PTR | ALLOC_HANDLE)
    print(f"oom_records={len(ooms)}")
    print(f"over_cap_events={over}")
    print(f"refused_events={refused}")
    print(f"oom_result_events={failed2}")
    print(f"partial={tr['partial'] or 'no'}")
    print(f"ended_pids={len(tr['ends'])}")
    if ooms:
        o = ooms[0]
        for k in ("requested_bytes", "cap_refused", "device_free_bytes", "device_total_bytes", "cap_bytes",
                  "job_used_bytes", "process_used_bytes", "result"):
            print(f"first_{k}={o[k]}")
        print(f"first_api={API.get(o['api'], o['api'])}")
        print(f"cap_refused_records={sum(1 for x in ooms if x['cap_refused'])}")
    return 0


def load_json(path):
    with open(path) as f:
        return json.load(f)


def cmd_report(args):
    d = load_json(args[0])
    devs = d.get("devices") or []
    procs = d.get("processes") or []
    print(f"device_peak={max([int(x.get('peak_bytes') or 0) for x in devs] or [0])}")
    print(f"devices={len(devs)}")
    print(f"processes={len(procs)}")
    print(f"announced={sum(1 for p in procs if p.get('announced'))}")
    print(f"cap_refusals={sum(int(p.get('cap_refusals') or 0) for p in procs)}")
    print(f"oom_results={sum(int(p.get('oom_results') or 0) for p in procs)}")
    print(f"failed_allocations={sum(int(p.get('failed_allocations') or 0) for p in procs)}")
    print(f"ended={','.join(str(p.get('ended')) for p in procs if p.get('allocations'))}")
    print(f"process_peaks={','.join(str(p.get('peak_bytes')) for p in procs if p.get('allocations'))}")
    print(f"dropped_events={d.get('dropped_events')}")
    print(f"partial={d.get('partial')}")
    print(f"live_at_end_bytes={d.get('live_at_end_bytes')}")
    return 0


def cmd_oomverb(args):
    d = load_json(args[0])
    ooms = d.get("ooms") if isinstance(d, dict) else d
    if not isinstance(ooms, list):
        ooms = []
    print(f"n={len(ooms)}")
    causes = [str(o.get("cause")) for o in ooms if isinstance(o, dict)]
    print(f"causes={','.join(causes) if causes else 'none'}")
    print(f"distinct_causes={','.join(sorted(set(causes))) if causes else 'none'}")
    if isinstance(d, dict):
        for k in ("oom_recorded", "oom_records", "oom_results", "message"):
            v = d.get(k)
            print(f"{k}={'null' if v is None else v}")
    if ooms and isinstance(ooms[0], dict):
        o = ooms[0]
        for k in ("cause", "cause_rule", "requested_bytes", "device_free_bytes", "job_live_bytes", "job_live_source",
                  "job_live_trace_bytes", "cap_bytes", "cap_refused"):
            v = o.get(k)
            print(f"first_{k}={'null' if v is None else v}")
        print(f"first_cause_reason={str(o.get('cause_reason') or '')[:160]}".replace("\n", " "))
        adv = o.get("advice") or []
        print(f"first_advice_count={len(adv)}")
        if adv:
            first = adv[0] if isinstance(adv[0], str) else json.dumps(adv[0])
            print(f"first_advice={first[:160]}".replace("\n", " "))
    return 0


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 1
    cmd, args = sys.argv[1], sys.argv[2:]
    fn = {"split": cmd_split, "ooms": cmd_ooms, "report": cmd_report, "oomverb": cmd_oomverb}.get(cmd)
    if fn is None:
        print(f"vtread: unknown command {cmd}", file=sys.stderr)
        return 1
    try:
        return fn(args)
    except Exception as e:  # noqa: BLE001
        print(f"vtread: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Decodes a Perfetto protobuf trace with nothing but the standard library (a protobuf wire-format walker,
independent of the exporter's prost structs), checks it and prints a JSON summary: `perfetto_check.py FILE`.

Field numbers are Perfetto's (protos/perfetto/trace/trace.proto, trace_packet.proto,
track_event/track_descriptor.proto, counter_descriptor.proto, process_descriptor.proto, track_event.proto,
debug_annotation.proto). Checks: the file is a sequence of `Trace.packet` fields (1, length-delimited); every
packet is on a trusted sequence; every track event names a described track and has a timestamp; counters are
on counter tracks (with unit bytes) and instants on others; track ids are unique.
"""
import json
import sys


def fail(msg):
    sys.exit("perfetto_check: " + msg)


def varint(b, i):
    shift = v = 0
    while True:
        if i >= len(b):
            fail("varint runs past the end")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, i
        shift += 7
        if shift > 63:
            fail("varint longer than 10 bytes")


def fields(b):
    """(field number, wire type, value) of a message: ints for varints, bytes for length-delimited."""
    i = 0
    out = []
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            if i + n > len(b):
                fail(f"field {num}: {n} bytes past the end")
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = int.from_bytes(b[i:i + 8], "little"), i + 8
        elif wt == 5:
            v, i = int.from_bytes(b[i:i + 4], "little"), i + 4
        else:
            fail(f"wire type {wt}")
        out.append((num, wt, v))
    return out


def one(fs, num, default=None):
    vals = [v for n, _, v in fs if n == num]
    return vals[-1] if vals else default


def signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def main(path):
    data = open(path, "rb").read()
    tracks = {}
    counters = {}
    instants = []
    packets = 0
    for num, wt, pkt in fields(data):
        if num != 1 or wt != 2:
            fail(f"top-level field {num} (wire type {wt}): not Trace.packet")
        packets += 1
        p = fields(pkt)
        if one(p, 10) is None:
            fail(f"packet {packets} has no trusted_packet_sequence_id")
        td = one(p, 60)
        if td is not None:
            t = fields(td)
            uuid = one(t, 1)
            if uuid in tracks:
                fail(f"track {uuid} described twice")
            proc = one(t, 3)
            counter = one(t, 8)
            tracks[uuid] = {
                "name": one(t, 2, b"").decode(),
                "parent": one(t, 5),
                "pid": one(fields(proc), 1) if proc is not None else None,
                "cmdline": [v.decode() for n, _, v in fields(proc) if n == 2] if proc is not None else None,
                "process_name": one(fields(proc), 6, b"").decode() if proc is not None else None,
                "counter_unit": one(fields(counter), 3) if counter is not None else None,
            }
        te = one(p, 11)
        if te is not None:
            e = fields(te)
            ts = one(p, 8)
            if ts is None:
                fail(f"packet {packets}: a track event without a timestamp")
            uuid = one(e, 11)
            if uuid not in tracks:
                fail(f"packet {packets}: track {uuid} not described before its event")
            typ = one(e, 9)
            if typ == 4:
                if tracks[uuid]["counter_unit"] != 3:
                    fail(f"packet {packets}: a counter on track {uuid}, not a bytes counter track")
                v = signed(one(e, 30, 0))
                if v < 0:
                    fail(f"packet {packets}: negative bytes {v}")
                c = counters.setdefault(str(uuid), {"max": 0, "last": 0, "values": 0, "first_ts": ts})
                c["max"] = max(c["max"], v)
                c["last"] = v
                c["values"] += 1
            elif typ == 3:
                if tracks[uuid]["counter_unit"] is not None:
                    fail(f"packet {packets}: an instant on counter track {uuid}")
                ann = {}
                for n, _, a in e:
                    if n == 4:
                        af = fields(a)
                        name = one(af, 10, b"").decode()
                        s = one(af, 6)
                        ann[name] = s.decode() if s is not None else one(af, 3)
                instants.append({
                    "ts": ts, "track": uuid, "name": one(e, 23, b"").decode(),
                    "categories": [v.decode() for n, _, v in e if n == 22], "annotations": ann,
                })
            else:
                fail(f"packet {packets}: track event type {typ}")
    print(json.dumps({
        "packets": packets,
        "tracks": {str(k): v for k, v in tracks.items()},
        "counters": counters,
        "instants": instants,
    }, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])

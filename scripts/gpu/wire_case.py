#!/usr/bin/env python3
"""The bridge's typed wire on a real GPU (issue 51; scripts/gpu/s58_wire.sh runs it). Standard library, plus JAX
for `jax_oom`.

    wire_case.py jax_oom
        JAX with its pool at XLA_PYTHON_CLIENT_MEM_FRACTION (s58_wire.sh: 0.04): 1 GiB arrays kept until XLA
        raises RESOURCE_EXHAUSTED. Prints JAX's own memory_stats() at the error (`STATS {...}`, `RESULT ...`),
        then raises it again, uncaught: the bridge's sys.excepthook sends its `oom` record and atexit its `exit`.
    wire_case.py kinds TRACE...
        Per trace: how many frames of each kind, and of the bridge's records (kind 21, one JSON object each; kind
        13 is the older k=v text) how many of each `what`, whether every body parses as one JSON object, and
        one body of each `what` (cut at 400 characters).
    wire_case.py summary BRIDGE_DIR LOOPS_DIR WIRE_DIR
        The tables s58_wire.sh prints last, from the three scripts' files (bridge.sh's, loops.sh's, jax_oom's: each
        case's .out, .oom.json, .oom.txt, .report.json): the program's own figures beside what the reports say
        (PyTorch's peaks and its figures at the error, the holders walk, JAX's oom and exit figures).
"""
import json
import struct
import sys

GiB = 1 << 30


def result(**kw):
    print("RESULT " + " ".join("%s=%s" % (k, v) for k, v in kw.items()), flush=True)


def jax_oom():
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    kept = []
    try:
        while True:
            a = jnp.ones((256, 1024, 1024), dtype=jnp.float32)  # 1 GiB
            a.block_until_ready()
            kept.append(a)
    except Exception as e:
        s = dev.memory_stats() or {}
        print("STATS " + json.dumps(s), flush=True)
        result(case="jax_oom", arrays=len(kept), bytes_in_use=s.get("bytes_in_use"),
               peak_bytes_in_use=s.get("peak_bytes_in_use"), bytes_limit=s.get("bytes_limit"),
               bytes_reserved=s.get("bytes_reserved"), largest_free_block=s.get("largest_free_block_bytes"),
               resource_exhausted=int("RESOURCE_EXHAUSTED" in str(e)), jax=jax.__version__)
        globals()["kept"] = kept
        raise


def var(b, p):
    """bincode 2's varint (standard config): (value, next position)."""
    x = b[p]
    if x < 251:
        return x, p + 1
    n = {251: 2, 252: 4, 253: 8}[x]
    return int.from_bytes(b[p + 1:p + 1 + n], "little"), p + 1 + n


def bridge21(payload):
    """Record::Bridge (kind 21): pid, tid, ts_ns, what, device, ack, doc."""
    p = 0
    for _ in range(3):
        _, p = var(payload, p)
    n, p = var(payload, p)
    what = payload[p:p + n].decode("utf-8", "replace")
    p += n
    _, p = var(payload, p)
    p += 1  # ack
    n, p = var(payload, p)
    return what, payload[p:p + n].decode("utf-8", "replace")


def kinds(paths, bodies=True):
    for path in paths:
        try:
            b = open(path, "rb").read()
        except OSError as e:
            print(f"{path}: {e}")
            continue
        if b[:8] != b"VRAMTRC\0":
            print(f"{path}: not a trace")
            continue
        (hlen,) = struct.unpack_from("<I", b, 10)
        pos = 14 + hlen
        count, whats, bad, sample = {}, {}, 0, {}
        while pos + 4 <= len(b):
            (flen,) = struct.unpack_from("<I", b, pos)
            if flen == 0 or pos + 4 + flen > len(b):
                break
            kind = b[pos + 4]
            payload = b[pos + 5:pos + 4 + flen]
            pos += 4 + flen
            count[kind] = count.get(kind, 0) + 1
            if kind == 21:
                try:
                    what, doc = bridge21(payload)
                    obj = json.loads(doc)
                    if not isinstance(obj, dict):
                        raise ValueError("not an object")
                except (ValueError, IndexError, KeyError):
                    bad += 1
                    continue
                whats[what] = whats.get(what, 0) + 1
                sample.setdefault(what, doc[:400])
        print(f"{path}: frames {dict(sorted(count.items()))}; bridge (21) {dict(sorted(whats.items()))}; "
              f"bodies not one JSON object: {bad}; kind 13: {count.get(13, 0)}")
        for w, d in sorted(sample.items()) if bodies else ():
            print(f"  {w}: {d}")


def kv(path):
    """The last RESULT line of a case's output as a dict."""
    out = {}
    try:
        for line in open(path, errors="replace"):
            if line.startswith("RESULT"):
                out = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
    except OSError:
        pass
    return out


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}


def num(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def mark(a, b):
    return "yes" if a is not None and a == b else "NO"


def fw_device(rep):
    """The report's device entry with a framework section: its framework figures."""
    for d in rep.get("devices") or []:
        if d.get("framework"):
            return d["framework"]
    return {}


def summary(bdir, ldir, wdir):
    import glob
    import os

    print("\n=== frames (wire_case.py kinds)")
    for d in (bdir, ldir, wdir):
        traces = sorted(glob.glob(os.path.join(d, "*.vtrace")))
        if traces:
            kinds(traces, bodies=False)
    print("\n=== PyTorch's own figures beside the reports' (peaks: report --json devices[].framework; at the error:"
          " oom --json ooms[0].framework, the observer's record)")
    print("| case | PyTorch: max allocated / max reserved | report: peak allocated / peak reserved | match |"
          " at the error, PyTorch (after the except): allocated / reserved / retries | oom --json framework: source,"
          " allocated / reserved / retries | holders (oom --json) | HELD BY in oom text |")
    print("|---|---|---|---|---|---|---|---|")
    for d in (ldir, bdir):
        for out in sorted(glob.glob(os.path.join(d, "*.out"))):
            c = os.path.basename(out)[:-4]
            r = kv(out)
            if "max_allocated" not in r and c not in ("frag", "keep", "backward"):
                continue
            rep = fw_device(load(os.path.join(d, c + ".report.json")))
            pa, pr = rep.get("peak_allocated_bytes"), rep.get("peak_reserved_bytes")
            ma, mr = num(r.get("max_allocated")), num(r.get("max_reserved"))
            o = (load(os.path.join(d, c + ".oom.json")).get("ooms") or [None])[0] or {}
            f = o.get("framework") or {}
            hs = (o.get("holders") or {}).get("holders") or []
            hold = ", ".join("%s %s %d" % (h.get("kind"), h.get("name"), h.get("bytes") or 0) for h in hs[:3]) or "-"
            try:
                held = "yes" if "HELD BY" in open(os.path.join(d, c + ".oom.txt"), errors="replace").read() else "no"
            except OSError:
                held = "-"
            at = "%s / %s / %s" % (r.get("allocated", "-"), r.get("reserved", "-"), r.get("retries", "-"))
            fo = "%s, %s / %s / %s" % (f.get("source"), f.get("allocated_bytes"), f.get("reserved_bytes"),
                                       f.get("alloc_retries")) if f else "-"
            m = "%s / %s" % (mark(ma, pa), mark(mr, pr)) if ma is not None else "-"
            print(f"| {c} | {ma} / {mr} | {pa} / {pr} | {m} | {at} | {fo} | {hold} | {held} |")
    print("\n=== JAX: its own memory_stats() beside the reports'")
    print("| case | JAX's own | vramtrace | match |")
    print("|---|---|---|---|")
    r = kv(os.path.join(wdir, "jax_oom.out"))
    o = (load(os.path.join(wdir, "jax_oom.oom.json")).get("ooms") or [None])[0] or {}
    f = o.get("framework") or {}
    want = (r.get("bytes_reserved") if r.get("bytes_reserved") not in (None, "None") else r.get("bytes_limit"))
    got = (f.get("framework"), f.get("allocated_bytes"), f.get("reserved_bytes"))
    exp = ("jax", num(r.get("bytes_in_use")), num(want))
    print(f"| jax_oom: oom --json framework (framework, allocated = bytes_in_use, reserved = bytes_reserved else"
          f" bytes_limit); cause {o.get('cause')} | {exp} | {got} | {'yes' if got == exp else 'NO'} |")
    rep = load(os.path.join(wdir, "jax_oom.report.json"))
    pa = fw_device(rep).get("peak_allocated_bytes")
    print(f"| jax_oom: report peak allocated = peak_bytes_in_use (the exit record) | {r.get('peak_bytes_in_use')} |"
          f" {pa} | {mark(num(r.get('peak_bytes_in_use')), pa)} |")
    bj = kv(os.path.join(bdir, "jax.out"))
    rep = load(os.path.join(bdir, "jax.report.json"))
    pa = fw_device(rep).get("peak_allocated_bytes")
    print(f"| bridge.sh jax: report peak allocated (arrays held to the end: bytes_in_use) | {bj.get('bytes_in_use')} |"
          f" {pa} | {mark(num(bj.get('bytes_in_use')), pa)} |")


if __name__ == "__main__":
    if sys.argv[1] == "jax_oom":
        jax_oom()
    elif sys.argv[1] == "kinds":
        kinds(sys.argv[2:])
    elif sys.argv[1] == "summary":
        summary(*sys.argv[2:5])
    else:
        sys.exit("usage: wire_case.py jax_oom | kinds TRACE... | summary BRIDGE_DIR LOOPS_DIR WIRE_DIR")

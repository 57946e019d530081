#!/usr/bin/env python3
"""The tables of scripts/gpu/s58_final.sh (session 58's final build against the session's start), from its files.
Standard library only.

    s58_final.py bridge W        the bridge's cost: W/bc-base-K/bridge_cost.tsv and W/bc-head-K/... (K = the
                                 half, 1 or 2; each one round of bare on off off on bare), side by side
    s58_final.py fraction W      the PyTorch fraction case: W/fraction/{head,base}.out (RESULT and ERROR lines),
                                 the `oom --json` of each build on each trace, and the run's exit codes
    s58_final.py stop W          `run --stop-after-steps 5`: exit code, seconds, the bridge's records in the trace
                                 (its `steps` and `stopped`), the report's STOPPED line and JSON
    s58_final.py ingest W        the ingest benchmark's tables, W/ingest/{base,head}-N.txt, side by side
"""
import collections
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire_case  # noqa: E402  (its bridge21: the kind-21 record's what and JSON body)


def rd(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def js(path):
    try:
        return json.loads(rd(path))
    except ValueError:
        return None


def kv(text, tag):
    out = {}
    for line in text.splitlines():
        if line.startswith(tag + " "):
            out = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
    return out


# ---- 1. the bridge's cost ------------------------------------------------------------------------------------


def bridge(w):
    med = collections.defaultdict(list)  # (build, case, cfg) -> run medians
    byround = collections.defaultdict(list)  # (build, case, cfg, half) -> run medians
    walls = collections.defaultdict(list)
    hooks = {}
    halves = collections.defaultdict(set)
    cases = []
    for build in ("base", "head"):
        for tsv in sorted(glob.glob(os.path.join(w, "bc-%s-*" % build, "bridge_cost.tsv"))):
            half = tsv.split(os.sep)[-2].rsplit("-", 1)[1]
            for line in open(tsv):
                f = line.rstrip("\n").split("\t")
                if len(f) < 10:
                    continue
                r, pos, cfg, case, m = f[:5]
                walls[(build, cfg)].append(float(f[8]))
                hooks[(build, cfg)] = f[9]
                if case == "ERROR":
                    continue
                if case not in cases:
                    cases.append(case)
                key = "%s.%s" % (half, r)
                halves[build].add(key)
                med[(build, case, cfg)].append(float(m))
                byround[(build, case, cfg, key)].append(float(m))
    print("## per run: build, case, configuration: median us per iteration of each run (in order)")
    for b in ("base", "head"):
        for c in cases:
            for cfg in ("bare", "on", "off"):
                print(f"{b} {c:10s} {cfg:4s} " + " ".join(f"{x:.2f}" for x in med[(b, c, cfg)]))
    print("hooks at the end of a process:", json.dumps({"%s %s" % k: v for k, v in hooks.items()}))
    print("process wall s (median, runs):",
          {"%s %s" % k: (round(statistics.median(v), 2), len(v)) for k, v in walls.items()})
    print()
    print("### The bridge's cost per iteration, BASE (b433793) against HEAD: median over runs of each run's median us")
    print("(rounds of bare on off off on bare; `added` = on - off, the median's; in brackets each round's mean on - mean off)")
    print()
    print("| case | BASE bare / off / on | BASE added, us | HEAD bare / off / on | HEAD added, us | HEAD - BASE, us |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        cells, added = [], {}
        for b in ("base", "head"):
            v = {k: med[(b, c, k)] for k in ("bare", "off", "on")}
            if not all(v.values()):
                cells += ["-", "-"]
                continue
            bare, off, on = (statistics.median(v[k]) for k in ("bare", "off", "on"))
            per = []
            for key in sorted(halves[b]):
                x, y = byround.get((b, c, "on", key)), byround.get((b, c, "off", key))
                if x and y:
                    per.append(statistics.mean(x) - statistics.mean(y))
            added[b] = on - off
            cells += [f"{bare:.2f} / {off:.2f} / {on:.2f}",
                      f"**{on - off:+.2f}** ({' '.join(f'{d:+.2f}' for d in per)})"]
        diff = f"{added['head'] - added['base']:+.2f}" if len(added) == 2 else "-"
        print(f"| {c} | " + " | ".join(cells) + f" | {diff} |")


# ---- 2. PyTorch's fraction -----------------------------------------------------------------------------------


def first_oom(doc):
    if not doc or not doc.get("ooms"):
        return None
    return doc["ooms"][0]


def fraction(w):
    d = os.path.join(w, "fraction")
    rows = []
    for trace_build in ("head", "base"):
        out = rd(os.path.join(d, trace_build + ".out"))
        pt = kv(out, "RESULT")
        err = next((l[6:] for l in out.splitlines() if l.startswith("ERROR ")), "")
        rc = rd(os.path.join(d, trace_build + ".rc")).strip()
        print(f"\n## the trace of {trace_build.upper()}'s run (exit {rc}); PyTorch's own figures: {pt}")
        print(f"PyTorch's error: {err[:600]}")
        for reader in ("head", "base"):
            doc = js(os.path.join(d, f"{trace_build}.by-{reader}.oom.json"))
            o = first_oom(doc)
            if o is None:
                txt = rd(os.path.join(d, f"{trace_build}.by-{reader}.oom.txt"))
                print(f"  read by {reader.upper()}: no oom in its JSON; its text: {' '.join(txt.split())[:400]}")
                rows.append((trace_build, reader, pt, None))
                continue
            f = o.get("framework") or {}
            print(f"  read by {reader.upper()}: cause {o.get('cause')}, rule {o.get('cause_rule')}, "
                  f"requested {o.get('requested_bytes')}, api {o.get('api')}, view {o.get('view')}")
            print(f"    reason: {o.get('cause_reason')}")
            print(f"    framework: {json.dumps(f)}")
            print(f"    device_total_bytes {o.get('device_total_bytes')}, job_live_bytes {o.get('job_live_bytes')}")
            rows.append((trace_build, reader, pt, o))
    print()
    print("### PyTorch under set_per_process_memory_fraction: vramtrace oom against PyTorch's own figures")
    print()
    print("| trace of / read by | cause (rule) | in use: PyTorch's allocated / vramtrace's | limit: fraction x total / vramtrace's | request: PyTorch's / vramtrace's | match |")
    print("|---|---|---|---|---|---|")
    for tb, rb, pt, o in rows:
        if o is None:
            print(f"| {tb} / {rb} | no oom record read | {pt.get('allocated')} / - | {pt.get('allowed')} / - | {pt.get('requested')} / - | - |")
            continue
        f = o.get("framework") or {}
        got = (f.get("allocated_bytes"), f.get("allowed_or_total_bytes"), o.get("requested_bytes"))
        want = tuple(int(pt[k]) if pt.get(k, "").isdigit() else None for k in ("allocated", "allowed", "requested"))
        ok = got == want and o.get("cause") == "framework_limit" and o.get("cause_rule") == "framework_limit"
        print(f"| {tb} / {rb} | {o.get('cause')} ({o.get('cause_rule')}) | {want[0]} / {got[0]} | {want[1]} / {got[1]} | "
              f"{want[2]} / {got[2]} | {'yes' if ok else 'NO'} |")


# ---- 3. --stop-after-steps -----------------------------------------------------------------------------------


def records(path):
    """Every bridge record of a trace, in file order: (what, body as a dict or the raw text)."""
    import struct

    try:
        b = open(path, "rb").read()
    except OSError:
        return []
    if b[:8] != b"VRAMTRC\0":
        return []
    (hlen,) = struct.unpack_from("<I", b, 10)
    pos = 14 + hlen
    out = []
    while pos + 4 <= len(b):
        (flen,) = struct.unpack_from("<I", b, pos)
        if flen == 0 or pos + 4 + flen > len(b):
            break
        kind = b[pos + 4]
        payload = b[pos + 5:pos + 4 + flen]
        pos += 4 + flen
        if kind == 21:
            try:
                what, doc = wire_case.bridge21(payload)
            except (ValueError, IndexError, KeyError):
                continue
            try:
                out.append((what, json.loads(doc)))
            except ValueError:
                out.append((what, doc))
    return out


def stop(w):
    d = os.path.join(w, "stop")
    rc = rd(os.path.join(d, "stop.rc")).strip()
    secs = rd(os.path.join(d, "stop.seconds")).strip()
    recs = records(os.path.join(d, "stop.vtrace"))
    whats = collections.Counter(x for x, _ in recs)
    steps = [b for x, b in recs if x == "steps" and isinstance(b, dict)]
    stopped = [b for x, b in recs if x == "stopped"]
    last = steps[-1] if steps else {}
    txt = rd(os.path.join(d, "stop.report.txt"))
    line = next((l.strip() for l in txt.splitlines() if "STOPPED" in l), "(no STOPPED line)")
    rep = js(os.path.join(d, "stop.report.json")) or {}
    procs = rep.get("processes") or []
    out = rd(os.path.join(d, "stop.out"))
    print(f"bridge records: {dict(whats)}; steps records' optimizer counts: {[s.get('optimizer') for s in steps]}")
    print(f"stopped: {stopped}; program's stdout lines: {len(out.splitlines())} (its final JSON line: "
          f"{'yes' if out.strip().startswith('{') else 'no'})")
    print()
    print("### `vramtrace run --stop-after-steps 5` with the real bridge (HEAD)")
    print()
    print("| figure | seen |")
    print("|---|---|")
    print(f"| `run`'s exit code; seconds | {rc}; {secs} s |")
    print(f"| the bridge's `stopped` record | {json.dumps(stopped)} |")
    print(f"| its `steps` records: optimizer counts | {[s.get('optimizer') for s in steps]} (last: {json.dumps(last)[:200]}) |")
    print(f"| `report` text | {line} |")
    print(f"| `report --json`: partial, stopped; processes (ended, exit) | {rep.get('partial')}, {rep.get('stopped')}; "
          f"{[(p.get('ended'), p.get('exit')) for p in procs]} |")


# ---- 4. the ingest benchmark ---------------------------------------------------------------------------------


def parse_ingest(text):
    """The benchmark's table: {scenario: {mem, file, report, rss}} (a long name pushes the columns right)."""
    rows = {}
    row = re.compile(r"^(.*?)\s+(\d{4,})\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(.+?)\s+(\S+)$")
    for line in text.splitlines():
        m = row.match(line)
        if not m or line.startswith("scenario"):
            continue
        try:
            rows[m.group(1).strip()] = {"mem": float(m.group(4)), "file": float(m.group(6)),
                                        "report": float(m.group(8)) if m.group(8) != "n/a" else float("nan"),
                                        "rss": m.group(7)}
        except ValueError:
            pass
    return rows


def ingest(w, base="b433793"):
    d = os.path.join(w, "ingest")
    runs = {"base": [], "head": []}
    order = [os.path.basename(p) for p in sorted(glob.glob(os.path.join(d, "*-*.txt")),
                                                 key=lambda p: int(re.findall(r"-(\d+)\.txt$", p)[0]))]
    for name in order:
        b = name.split("-")[0]
        if b in runs:
            runs[b].append(parse_ingest(rd(os.path.join(d, name))))
    print("run order:", " ".join(order), "; seconds each:", rd(os.path.join(d, "seconds.txt")).split())
    scen = list(dict.fromkeys(s for b in runs.values() for r in b for s in r))
    print()
    print("### Ingest benchmark (10 M events a scenario), base %s against head, seconds, in run order" % base)
    print()
    print("| scenario (10 M events) | figure | base | head | medians base / head |")
    print("|---|---|---|---|---|")
    for s in scen:
        for fig, label in (("mem", "replay from memory"), ("report", "`report` end to end")):
            cols, meds = [], []
            for b in ("base", "head"):
                v = [r[s][fig] for r in runs[b] if s in r]
                cols.append(", ".join("%.3f" % x for x in v) or "-")
                meds.append(statistics.median(v) if v else None)
            m = " / ".join("-" if x is None else "%.3f" % x for x in meds)
            if None not in meds:
                m += " (%+.1f%%)" % ((meds[1] / meds[0] - 1) * 100)
            print("| %s | %s | %s | %s | %s |" % (s, label, cols[0], cols[1], m))
    rss = {b: [r[s]["rss"] for r in runs[b] for s in r] for b in runs}
    print()
    print("peak RSS column, base: %s" % rss["base"][:12])
    print("peak RSS column, head: %s" % rss["head"][:12])


if __name__ == "__main__":
    {"bridge": bridge, "fraction": fraction, "stop": stop, "ingest": ingest}[sys.argv[1]](sys.argv[2])

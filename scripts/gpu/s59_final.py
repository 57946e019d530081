#!/usr/bin/env python3
"""The tables of scripts/gpu/s59_final.sh (session 59: HEAD against BASE c6bf344), from its files. Standard library
only; the fraction and stop tables are scripts/gpu/s58_final.py's (the same layout of W).

    s59_final.py inproc W     the bridge's step cost inside one process: W/inproc/inproc-{head,base}-K.out
    s59_final.py oomcmp W     HEAD's `oom --json` of HEAD's and of BASE's fraction trace: the bridge's figures
                              (`framework`) and holders, field by field
    s59_final.py records W    the bridge's records in both fraction traces, record by record (times, pids aside)
    s59_final.py ingest W     the ingest benchmark's tables, W/ingest/{base,head}-N.txt, side by side
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s58_final  # noqa: E402  (parse_ingest, rd, js)

BASE = "c6bf344"


def inproc(w):
    rows = {}
    hooks = {}
    for f in sorted(glob.glob(os.path.join(w, "inproc", "inproc-*-*.out"))):
        name = os.path.basename(f)[len("inproc-"):-len(".out")]
        b = name.split("-")[0]
        for line in open(f, errors="replace"):
            if line.startswith("CASE "):
                d = json.loads(line[5:])
                d["run"] = name
                rows.setdefault((b, d["case"]), []).append(d)
            elif line.startswith(("HOOKS ", "NOBRIDGE", "COUNTS ")):
                hooks.setdefault(name, []).append(line.strip())
    for k, v in hooks.items():
        print(k, " ".join(v))
    cases = list(dict.fromkeys(c for _, c in rows))
    print()
    print("### The bridge's step hooks inside one process, on - off, ns per iteration (HEAD against BASE %s)" % BASE)
    print("(each process: the median of its block pairs' differences, [p10 .. p90] of them, (bootstrap 95% of the median))")
    print()
    print("| case | iterations a block | HEAD off ns/iter | HEAD on - off | BASE off ns/iter | BASE on - off | HEAD - BASE (medians) |")
    print("|---|---|---|---|---|---|---|")
    for c in cases:
        cells, med, offs, iters = [], {}, [], set()
        for b in ("head", "base"):
            v = rows.get((b, c), [])
            iters.update(d["iters"] for d in v)
            offs.append(" / ".join("%.0f" % d["off_ns"] for d in v) or "-")
            cells.append("; ".join("**%+.0f** [%+.0f .. %+.0f] (%+.0f .. %+.0f)" % (
                d["diff_med_ns"], d["diff_p10_ns"], d["diff_p90_ns"], d["ci95_ns"][0], d["ci95_ns"][1]) for d in v) or "-")
            med[b] = statistics.median(d["diff_med_ns"] for d in v) if v else None
        dd = "%+.0f" % (med["head"] - med["base"]) if None not in med.values() else "-"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (c, "/".join(str(i) for i in sorted(iters)), offs[0], cells[0],
                                                      offs[1], cells[1], dd))
    # Pooled: every block pair of a build's processes; a bootstrap of the difference of the two medians (pairs
    # drawn within each build). It counts the pairs' spread, not the spread between processes: the aa case
    # (hooks on in both arms, the same in both builds) shows what that adds.
    import random

    rnd = random.Random(1)
    print()
    print("| case | HEAD: pairs, median on - off | BASE: pairs, median on - off | HEAD - BASE, ns (bootstrap 95%) |")
    print("|---|---|---|---|")
    for c in cases:
        pool = {b: [x for d in rows.get((b, c), []) for x in d["diffs_ns"]] for b in ("head", "base")}
        if not all(pool.values()):
            continue
        mh, mb = statistics.median(pool["head"]), statistics.median(pool["base"])
        boots = sorted(statistics.median(rnd.choices(pool["head"], k=len(pool["head"])))
                       - statistics.median(rnd.choices(pool["base"], k=len(pool["base"]))) for _ in range(4000))
        print("| %s | %d, %+.0f | %d, %+.0f | **%+.0f** (%+.0f .. %+.0f) |" % (
            c, len(pool["head"]), mh, len(pool["base"]), mb, mh - mb, boots[100], boots[3899]))
    print()
    print("counters moved (optimizer, batches, scopes, reads) in the on / off arms:")
    for (b, c), v in sorted(rows.items()):
        for d in v:
            print("  %s %s: %s / %s; %.1f s" % (d["run"], c, d["counts_moved"]["on"], d["counts_moved"]["off"], d["seconds"]))


def _strip(o, drop=("t_ns", "time_ns", "pid", "elapsed_ms", "objects", "taken_at", "path", "snapshot", "device_free_bytes")):
    if isinstance(o, dict):
        return {k: _strip(v) for k, v in o.items() if k not in drop}
    if isinstance(o, list):
        return [_strip(x) for x in o]
    return o


def oomcmp(w):
    d = os.path.join(w, "fraction")
    docs = {t: s58_final.js(os.path.join(d, "%s.by-head.oom.json" % t)) for t in ("head", "base")}
    ooms = {t: s58_final.first_oom(docs[t]) for t in docs}
    print()
    print("### HEAD's `oom --json` of the fraction trace made by HEAD's bridge against BASE's")
    print()
    if None in ooms.values():
        print("an oom record is missing: %s" % {t: o is not None for t, o in ooms.items()})
        return
    print("| field | from HEAD's bridge | from BASE's bridge | same |")
    print("|---|---|---|---|")
    keys = sorted(set(ooms["head"]) | set(ooms["base"]))
    for k in keys:
        a, b = _strip(ooms["head"].get(k)), _strip(ooms["base"].get(k))
        sa, sb = json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)
        if k in ("framework", "holders", "cause", "cause_rule", "requested_bytes", "api", "view", "advice",
                 "cause_reason", "findings", "job_live_bytes", "device_total_bytes") or sa != sb:
            print("| %s | %s | %s | %s |" % (k, sa[:300], sb[:300], "yes" if sa == sb else "**no**"))
    fw = ooms["head"].get("framework") or {}
    print()
    print("HEAD's bridge: framework keys %s" % sorted(fw))
    h = ooms["head"].get("holders")
    print("holders (HEAD's bridge): %s" % json.dumps(h)[:1200])


def records(w):
    """The bridge's records in the two fraction traces (W/fraction/{head,base}/fraction.vtrace), in file order:
    the same kinds, keys and values, apart from times, pids, the walk's time and object count, and paths."""
    drop = ("t_ns", "time_ns", "pid", "elapsed_ms", "objects", "device_free_bytes", "path")

    def norm(b):
        if isinstance(b, dict):
            return {k: norm(v) for k, v in b.items() if k not in drop}
        if isinstance(b, list):
            return [norm(x) for x in b]
        return b

    got = {}
    for t in ("head", "base"):
        r = s58_final.records(os.path.join(w, "fraction", t, "fraction.vtrace"))
        got[t] = [(what, norm(b)) for what, b in r]
        print("%s's bridge: %d records, %s" % (t.upper(), len(r), dict((x, sum(1 for y, _ in r if y == x)) for x, _ in r)))
    same = got["head"] == got["base"]
    print("the same records, times, pids, walk time and count, paths aside: %s" % ("yes" if same else "NO"))
    for (a, x), (b, y) in zip(got["head"], got["base"]):
        if (a, x) != (b, y):
            print("  differs: HEAD %s %s / BASE %s %s" % (a, json.dumps(x)[:300], b, json.dumps(y)[:300]))


def ingest(w):
    s58_final.ingest(w, BASE)


if __name__ == "__main__":
    {"inproc": inproc, "oomcmp": oomcmp, "records": records, "ingest": ingest}[sys.argv[1]](sys.argv[2])

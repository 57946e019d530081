"""Slims a PyTorch snapshot kept by `vramtrace run --torch-history` into a CI fixture: every entry keeps only the
frames of the user's own files (the first of them), blocks keep none. The what-if reads sizes, addresses, times
and the user's line; nothing else changes.
    python3 slim_snapshot.py IN.pickle OUT.pickle
"""
import pickle
import sys

snap = pickle.load(open(sys.argv[1], "rb"))


def mine(frames):
    own = [f for f in frames or [] if "site-packages" not in f.get("filename", "") and "/lib/python" not in f.get("filename", "")]
    return own[:1]


KEEP = ("action", "addr", "size", "stream", "time_us", "device_free", "segment_pool_id")
for d, trace in enumerate(snap.get("device_traces", [])):
    slim = []
    for e in trace:
        x = {k: e[k] for k in KEEP if k in e}
        if e.get("action") in ("alloc", "oom"):
            x["frames"] = mine(e.get("frames"))
        slim.append(x)
    snap["device_traces"][d] = slim
for seg in snap.get("segments", []):
    seg["frames"] = []
    for b in seg.get("blocks", []):
        b["frames"] = mine(b.get("frames"))
with open(sys.argv[2], "wb") as f:
    p = pickle.Pickler(f, protocol=4)
    p.fast = True
    p.dump(snap)

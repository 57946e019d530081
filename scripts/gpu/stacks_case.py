#!/usr/bin/env python3
"""Programs and judges for scripts/gpu/stacks.sh (call sites on a real GPU). Usage: stacks_case.py MODE [ARGS]

Programs (run under `vramtrace run`):
  oom        6 GiB of "weights" (SITE-WEIGHTS), a few steps of a small MLP, 5 GiB of activations made in
             make_activations() (SITE-ACT), then 4 GiB tensors (SITE-GROW) until the allocation fails
  thread     128 MiB in the main thread (SITE-MAIN), then 256 MiB in a threading.Thread's target (SITE-THREAD)
  train      MLP 8 x Linear(4096, 4096) + ReLU, batch 256, fp32, AdamW: 20 warm-up steps, 200 timed steps
             (torch.cuda.synchronize() around each, time.perf_counter)
Every program prints `MARK name=lineno` for its marked lines (found by reading this file), `START ...`, and one
`RESULT k=v ...` line (no spaces in values); an error's message goes to a `MSG ...` line. Exit 3 (SKIP line) when
torch is missing, 4 when CUDA is unusable, 0 otherwise (an out-of-memory error is an expected outcome).

Judges (read the files a case left in WORK: NAME.out, NAME.report.json, NAME.oom.json, NAME.report.txt,
NAME.oom.txt) print table rows: `ROW<TAB>case<TAB>checked<TAB>expected<TAB>got<TAB>pass<TAB>note`:
  judge-oom NAME WORK         judge-thread NAME WORK
  judge-overhead WORK NONE_NAMES DEFAULT_NAMES (comma-separated case names)
  judge-native NAME WORK SOURCE [static]

The allocating lines call EMPTY(n): functools.partial(torch.empty, dtype=torch.uint8, device="cuda"), a C callable,
so the marked line is the innermost Python frame of the allocation. VT_STACKS_FAKE=1 swaps torch for cuMemAlloc_v2
through ctypes (for trying the script's flow on the simulated driver, libfakecuda, where torch is absent)."""
import functools
import json
import os
import re
import statistics
import sys
import threading
import time

MiB = 1 << 20
GiB = 1 << 30
WEIGHTS_BYTES = 6 * GiB
ACT_BYTES = 5 * GiB
GROW_BYTES = 4 * GiB
MAIN_BYTES = 128 * MiB
THREAD_BYTES = 256 * MiB
FAKE = os.environ.get("VT_STACKS_FAKE") == "1"
if FAKE:  # the simulated device is small
    WEIGHTS_BYTES, ACT_BYTES, GROW_BYTES = 3 * GiB, 5 * GiB // 2, 2 * GiB
ME = os.path.basename(__file__)


def out(line):
    print(line, flush=True)


def result(**kw):
    out("RESULT " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in kw.items()))


def marks():
    """{name: line} for every `# SITE-NAME` comment on a code line of this file."""
    m = {}
    with open(os.path.abspath(__file__), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            code, sep, comment = line.partition("#")
            if not sep or not code.strip():
                continue
            g = re.match(r"\s*SITE-([A-Z]+)\s*$", comment)
            if g:
                m[g.group(1)] = n
    return m


def print_marks():
    for k, v in sorted(marks().items()):
        out(f"MARK {k}={v}")


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:200]


# ---------------------------------------------------------------------------------------------------------------
# Backends


class FakeOOM(Exception):
    pass


class TorchBackend:
    def __init__(self):
        try:
            import torch
        except ImportError:
            out("SKIP torch is not installed")
            sys.exit(3)
        if not torch.cuda.is_available():
            out("FAIL torch.cuda.is_available() is False")
            sys.exit(4)
        self.torch = torch
        torch.cuda.init()
        torch.cuda.set_device(0)
        self.empty = functools.partial(torch.empty, dtype=torch.uint8, device="cuda")
        self.version = torch.__version__
        self.device = torch.cuda.get_device_name(0).replace(" ", "_")

    def check(self, t):
        return t

    def thread_init(self):
        self.torch.cuda.set_device(0)

    def mem(self):
        return self.torch.cuda.mem_get_info()

    def sync(self):
        self.torch.cuda.synchronize()

    def is_oom(self, e):
        t = getattr(self.torch, "OutOfMemoryError", None) or getattr(self.torch.cuda, "OutOfMemoryError", None)
        return (t is not None and isinstance(e, t)) or "out of memory" in str(e).lower()

    def stats(self):
        st = {}
        try:
            s = self.torch.cuda.memory_stats()
            st["reserved"] = s.get("reserved_bytes.all.current", -1)
            st["allocated"] = s.get("allocated_bytes.all.current", -1)
            st["segments_allocated"] = s.get("segment.all.allocated", -1)
            st["num_alloc_retries"] = s.get("num_alloc_retries", -1)
        except Exception as e:  # noqa: BLE001
            out(f"memory_stats failed: {e}")
        return st


class FakeBackend:
    """cuMemAlloc_v2 through ctypes, for the simulated driver."""

    def __init__(self):
        import ctypes

        self.ct = ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        self.cu = cu
        for name in ("cuInit", "cuDeviceGet", "cuCtxCreate_v2", "cuCtxSetCurrent", "cuMemGetInfo_v2"):
            getattr(cu, name).restype = ctypes.c_int
        cu.cuMemAlloc_v2.restype = ctypes.c_int
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        assert cu.cuInit(0) == 0, "cuInit"
        dev = ctypes.c_int()
        assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
        self.ctx = ctypes.c_void_p()
        assert cu.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, dev) == 0, "cuCtxCreate_v2"
        self.ptr = ctypes.c_uint64()
        # A C callable (no Python frame of its own): returns the CUresult.
        self.empty = functools.partial(cu.cuMemAlloc_v2, ctypes.byref(self.ptr))
        self.version = "fake"
        self.device = "simulated"

    def check(self, r):
        if r != 0:
            raise FakeOOM(f"CUDA error {r}: out of memory")
        return r

    def thread_init(self):
        self.cu.cuCtxSetCurrent(self.ctx)

    def mem(self):
        f, t = self.ct.c_size_t(), self.ct.c_size_t()
        self.cu.cuMemGetInfo_v2(self.ct.byref(f), self.ct.byref(t))
        return f.value, t.value

    def sync(self):
        pass

    def is_oom(self, e):
        return isinstance(e, FakeOOM)

    def stats(self):
        return {}


def backend():
    return FakeBackend() if FAKE else TorchBackend()


def start(bk, mode):
    free, total = bk.mem()
    out(f"START pid={os.getpid()} mode={mode} torch={bk.version} device={bk.device} free={free} total={total} "
        f"python={sys.version.split()[0]} "
        f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')} "
        f"VRAMTRACE_STACKS={os.environ.get('VRAMTRACE_STACKS', '')}")
    return free, total


# ---------------------------------------------------------------------------------------------------------------
# Programs


def small_mlp_steps(bk, steps=3):
    """A few training steps of a small MLP (its own allocations, under other call sites)."""
    if FAKE:
        return 0.0
    torch = bk.torch
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    model = model.to("cuda")  # SITE-MODEL
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    loss = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return float(loss.item())


def make_activations(bk, n):
    acts = EMPTY(n)  # SITE-ACT
    return bk.check(acts)


EMPTY = None


def prog_oom():
    global EMPTY
    bk = backend()
    EMPTY = bk.empty
    print_marks()
    free0, total0 = start(bk, "oom")
    weights = EMPTY(WEIGHTS_BYTES)  # SITE-WEIGHTS
    bk.check(weights)
    loss = small_mlp_steps(bk)
    acts = make_activations(bk, ACT_BYTES)
    held, err, st, fr = [], None, {}, None
    t0 = time.time()
    try:
        for _ in range(1024):
            t = EMPTY(GROW_BYTES)  # SITE-GROW
            held.append(bk.check(t))
    except Exception as e:  # noqa: BLE001
        err = e
        st = bk.stats()
        fr = bk.mem()
    bk.sync()
    el = time.time() - t0
    if err is None:
        result(error_type="none", tensors=len(held), grow_bytes=GROW_BYTES, weights_bytes=WEIGHTS_BYTES,
               act_bytes=ACT_BYTES, start_free=free0, start_total=total0)
    else:
        out(f"MSG {type(err).__name__}: {first_line(err)}")
        out(f"OOM caught after {len(held)} tensors of {GROW_BYTES} bytes: {type(err).__name__}")
        result(error_type=type(err).__name__, is_oom=int(bk.is_oom(err)), tensors=len(held), grow_bytes=GROW_BYTES,
               weights_bytes=WEIGHTS_BYTES, act_bytes=ACT_BYTES, held_bytes=len(held) * GROW_BYTES,
               start_free=free0, start_total=total0, free_at_oom=(fr or (None, None))[0],
               total_at_oom=(fr or (None, None))[1], seconds=f"{el:.2f}", loss=f"{loss:.4f}",
               **{k + "_at_oom": v for k, v in st.items()})
    del held, acts, weights
    return 0


def worker(bk, box):
    try:
        bk.thread_init()
        t = EMPTY(THREAD_BYTES)  # SITE-THREAD
        box.append(bk.check(t))
        box.append(threading.get_native_id())
    except Exception as e:  # noqa: BLE001
        box.append(e)


def prog_thread():
    global EMPTY
    bk = backend()
    EMPTY = bk.empty
    print_marks()
    start(bk, "thread")
    m = EMPTY(MAIN_BYTES)  # SITE-MAIN
    bk.check(m)
    box = []
    th = threading.Thread(target=worker, args=(bk, box), name="vt-worker")
    th.start()
    th.join(120)
    bk.sync()
    if th.is_alive() or not box or isinstance(box[0], Exception):
        err = box[0] if box else "worker did not finish"
        out(f"MSG worker: {err}")
        result(ok=0, main_tid=threading.get_native_id())
        return 0
    result(ok=1, main_tid=threading.get_native_id(), worker_tid=box[1], main_bytes=MAIN_BYTES,
           thread_bytes=THREAD_BYTES)
    return 0


def prog_train(warmup=20, steps=200):
    bk = backend()
    start(bk, "train")
    per, segs = [], (0, 0)
    if FAKE:  # the flow only: two allocations, then a CPU loop of a few ms
        keep = [bk.check(bk.empty(4 * MiB)), bk.check(bk.empty(4 * MiB))]
        out(f"fake: {len(keep)} allocations of 4 MiB")
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            sum(range(100000))
            if i >= warmup:
                per.append(time.perf_counter() - t0)
    else:
        torch = bk.torch
        nn = torch.nn
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.manual_seed(0)
        layers = []
        for _ in range(8):
            layers += [nn.Linear(4096, 4096, device="cuda"), nn.ReLU()]
        model = nn.Sequential(*layers)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(256, 4096, device="cuda")
        y = torch.randn(256, 4096, device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        s0 = bk.stats().get("segments_allocated", -1)
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            per.append(time.perf_counter() - t0)
        s1 = bk.stats().get("segments_allocated", -1)
        segs = (s0, s1)
    med = statistics.median(per) * 1e3
    mean = statistics.fmean(per) * 1e3
    result(steps=len(per), median_ms=f"{med:.4f}", mean_ms=f"{mean:.4f}", min_ms=f"{min(per) * 1e3:.4f}",
           max_ms=f"{max(per) * 1e3:.4f}", segments_before=segs[0], segments_after=segs[1],
           segments_timed=segs[1] - segs[0],
           max_memory_reserved=(bk.torch.cuda.max_memory_reserved() if not FAKE else 0))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Judges


def row(case, checked, expected, got, ok, note=""):
    def clean(s):
        return str(s).replace("\t", " ").replace("\n", " ").replace("|", "/")

    p = ok if isinstance(ok, str) else ("yes" if ok else "NO")
    print("ROW\t" + "\t".join(clean(x) for x in (case, checked, expected, got, p, note)), flush=True)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, f"{os.path.basename(path)} missing"
    except Exception as e:  # noqa: BLE001
        return None, f"{os.path.basename(path)} unreadable: {type(e).__name__}: {str(e)[:80]}"


def text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def program_fields(path):
    """RESULT fields and MARK lines of a program's output."""
    res, mk = {}, {}
    for line in text(path).splitlines():
        if line.startswith("RESULT "):
            res = dict(x.split("=", 1) for x in line[7:].split() if "=" in x)
        elif line.startswith("MARK "):
            k, _, v = line[5:].partition("=")
            if v.strip().isdigit():
                mk[k.strip()] = int(v)
    return res, mk


def gib(b):
    try:
        return f"{int(b) / GiB:.2f} GiB"
    except (TypeError, ValueError):
        return str(b)


class Sites:
    """A JSON answer's call_sites, by id, with the (file, line) of each one's chosen frame."""

    def __init__(self, doc):
        self.by_id = {}
        for s in (doc or {}).get("call_sites") or []:
            if isinstance(s, dict) and "id" in s:
                self.by_id[s["id"]] = s

    def get(self, i):
        return self.by_id.get(i) if i is not None else None

    @staticmethod
    def where(s):
        """(basename, line) of the site's frame, else parsed from its label; (None, None) when neither."""
        if not s:
            return None, None
        fr, i = s.get("frames") or [], s.get("site_frame")
        if isinstance(i, int) and 0 <= i < len(fr):
            f = fr[i]
            if f.get("file"):
                return os.path.basename(f["file"]), f.get("line")
        m = re.search(r"([\w.+-]+):(\d+)", s.get("label") or "")
        return (m.group(1), int(m.group(2))) if m else (None, None)

    def line_of(self, i, fname=ME):
        f, ln = self.where(self.get(i))
        return ln if f == fname else None

    def label(self, i):
        s = self.get(i)
        return s.get("label") if s else None


ALLOC_APIS = {1, 2, 3, 5, 6, 8}  # docs/TRACE-FORMAT.md: the allocating entry points


def trace_failures(path):
    """From the trace file itself (docs/TRACE-FORMAT.md): the allocation events that failed (kind 8 events, result
    != 0) as (pid, tid, api, size, result, stack id), and the Stack records' Python frames {(pid, id): [(file,
    function, line)]}."""

    def leb(b, pos):
        v, sh = 0, 0
        while True:
            x = b[pos]
            pos += 1
            v |= (x & 0x7F) << sh
            if not x & 0x80:
                return v, pos
            sh += 7

    def bvar(b, pos):
        x = b[pos]
        if x < 251:
            return x, pos + 1
        n = {251: 2, 252: 4, 253: 8, 254: 16}[x]
        return int.from_bytes(b[pos + 1:pos + 1 + n], "little"), pos + 1 + n

    def bstr(b, pos):
        n, pos = bvar(b, pos)
        return b[pos:pos + n].decode("utf-8", "replace"), pos + n

    with open(path, "rb") as f:
        b = f.read()
    if b[:8] != b"VRAMTRC\0":
        raise ValueError("not a vramtrace trace")
    pos = 14 + int.from_bytes(b[10:14], "little")
    fails, stacks, bad = [], {}, 0
    while pos + 5 <= len(b):
        flen = int.from_bytes(b[pos:pos + 4], "little")
        if flen == 0 or pos + 4 + flen > len(b):
            break
        kind, p = b[pos + 4], b[pos + 5:pos + 4 + flen]
        pos += 4 + flen
        try:
            if kind == 8:
                pid, q = leb(p, 0)
                n, q = leb(p, q)
                tid = 0
                for _ in range(n):
                    _, q = leb(p, q)
                    v, q = leb(p, q)
                    tid = (tid + ((v >> 1) ^ -(v & 1))) & 0xFFFFFFFF
                    api, _flags = p[q], p[q + 1]
                    q += 2
                    _, q = leb(p, q)  # device + 1
                    res, q = leb(p, q)
                    _, q = leb(p, q)  # addr
                    size, q = leb(p, q)
                    _, q = leb(p, q)  # aux
                    st, q = leb(p, q)
                    if api in ALLOC_APIS and res != 0:
                        fails.append((pid, tid, api, size, res, st))
            elif kind == 9:
                pid, q = bvar(p, 0)
                sid, q = bvar(p, q)
                n, q = bvar(p, q)
                for _ in range(n):
                    _, q = bvar(p, q)
                n, q = bvar(p, q)
                frames = []
                for _ in range(n):
                    fi, q = bstr(p, q)
                    fu, q = bstr(p, q)
                    ln, q = bvar(p, q)
                    frames.append((fi, fu, ln))
                stacks[(pid, sid)] = frames
        except (IndexError, KeyError):
            bad += 1
    return fails, stacks, bad


def site_list(sites, i):
    s = sites.get(i)
    return f"{s.get('label')!r}" if s else f"#{i}?"


def judge_oom(name, work):
    case = name
    base = os.path.join(work, name)
    res, mk = program_fields(base + ".out")
    own = marks()
    if mk and mk != own:
        row(case, "MARK lines = this file's marks", own, mk, False, "the program ran another copy of this file?")
    mk = own
    g, w, a = mk.get("GROW"), mk.get("WEIGHTS"), mk.get("ACT")
    grow_b = int(res.get("grow_bytes", GROW_BYTES))
    w_b = int(res.get("weights_bytes", WEIGHTS_BYTES))
    a_b = int(res.get("act_bytes", ACT_BYTES))
    at = f"{ME}:{g}"
    if not res:
        row(case, "program ran", "a RESULT line", "none", False, "see the log")
        return
    row(case, "program: OOM error caught", "an out-of-memory error",
        f"{res.get('error_type')} after {res.get('tensors')} x {gib(grow_b)}", res.get("is_oom") == "1",
        f"MARK GROW={g} WEIGHTS={w} ACT={a} MODEL={mk.get('MODEL')}; torch reserved at OOM "
        f"{gib(res.get('reserved_at_oom'))}, free {gib(res.get('free_at_oom'))} of {gib(res.get('total_at_oom'))}")
    doc, err = load(base + ".oom.json")
    if err:
        row(case, "vramtrace oom --json", "readable", err, False, "")
        return
    ooms = doc.get("ooms") or []
    row(case, "oom --json: OOMs analysed", ">= 1", f"{len(ooms)} (records {doc.get('oom_records')})",
        len(ooms) >= 1, f"causes {sorted({o.get('cause') for o in ooms})}; stacks {doc.get('stacks')}, "
        f"not kept {doc.get('stacks_not_kept')}; call_sites {len(doc.get('call_sites') or [])}")
    if not ooms:
        return
    sites = Sites(doc)
    o = ooms[0]
    # The failing allocation's own call site: whichever field this build names it by.
    skip = {"top_live", "live_by_call_site", "live_by_call_site_unlisted_bytes", "live_no_site_bytes"}
    keys = [k for k in o if k not in skip and ("site" in k.lower() or (isinstance(o[k], dict) and (
        "call_site" in o[k] or "site" in o[k])))]
    req, how = None, None
    for k in keys:
        v = o[k]
        if isinstance(v, dict):
            v = v.get("call_site", v.get("site", v.get("label", v.get("id"))))
        if isinstance(v, int) and not isinstance(v, bool):
            req, how = sites.get(v), f"ooms[0].{k}={v}"
        elif isinstance(v, str):
            req, how = {"label": v}, f"ooms[0].{k}"
        if req:
            break
    if req:
        f, ln = Sites.where(req)
        got = f"{f}:{ln}" if f else repr(req.get("label"))
        all_lines = []
        for oo in ooms:
            for k in keys:
                v = oo.get(k)
                v = v.get("call_site", v.get("site", v.get("label"))) if isinstance(v, dict) else v
                s = sites.get(v) if isinstance(v, int) else ({"label": v} if isinstance(v, str) else None)
                all_lines.append(Sites.where(s)[1])
        row(case, "OOM: the requesting allocation's site", at, got, f == ME and ln == g,
            f"{how}: {req.get('label')!r}; requested {gib(o.get('requested_bytes'))}; every OOM's: {all_lines}")
    else:
        row(case, "OOM: the requesting allocation's site", at, "no such field", False,
            f"ooms[0] has no field naming the failing allocation's call site (keys with 'site': "
            f"{keys or 'none'}; all keys: {','.join(list(o)[:8])}...); requested {gib(o.get('requested_bytes'))}")
    # The trace file itself: the failing allocation's stack, as the shim recorded it.
    try:
        fails, stacks, bad = trace_failures(base + ".vtrace")
        lines = []
        for pid, _tid, _api, size, rc, st in fails:
            fr = stacks.get((pid, st), [])
            mine = [ln for fi, _fu, ln in fr if os.path.basename(fi) == ME]
            lines.append((mine[0] if mine else (f"stack {st}, no {ME} frame" if st else "no stack"), size, rc))
        ok = bool(fails) and all(x[0] == g for x in lines)
        row(case, "trace file: failing allocations' recorded stacks", f"{ME}:{g} for each",
            ", ".join(f"{x[0]} ({gib(x[1])}, CUresult {x[2]})" for x in lines[:4]) or "no failed allocation event", ok,
            f"{len(fails)} failed allocation events (kind 8), {len(stacks)} Stack records"
            f"{f', {bad} undecodable frames' if bad else ''}; read by stacks_case.py, not by vramtrace")
    except Exception as e:  # noqa: BLE001
        row(case, "trace file: failing allocations' recorded stacks", f"{ME}:{g}", f"{type(e).__name__}: {e}"[:100],
            False, "stacks_case.py could not read the trace")
    # top_live: sizes and sites.
    tl = o.get("top_live") or []
    want = {grow_b: g, w_b: w, a_b: a}
    bad, seen = [], []
    for e in tl:
        ln = sites.line_of(e.get("call_site"))
        if ln is None and isinstance(e.get("site"), str):
            m = re.search(re.escape(ME) + r":(\d+)", e["site"])
            ln = int(m.group(1)) if m else None
        seen.append(f"{gib(e.get('bytes'))}@{ln if ln is not None else e.get('site')}")
        exp = want.get(e.get("bytes"))
        if exp is not None and ln != exp:
            bad.append(f"{gib(e.get('bytes'))} at {e.get('site')!r}, expected line {exp}")
    lines = {sites.line_of(e.get("call_site")) for e in tl}
    ok = bool(tl) and g in lines and w in lines and not bad
    row(case, "OOM top_live[]: sites of the largest live", f"GROW {g}, WEIGHTS {w} (+ ACT {a}) lines",
        ", ".join(seen[:5]) + (" ..." if len(seen) > 5 else ""), ok,
        ("; ".join(bad[:3]) + "; " if bad else "") + f"ACT line {'present' if a in lines else 'absent'}; "
        f"{len(tl)} listed, {o.get('live_count')} live")
    # live_by_call_site
    by = o.get("live_by_call_site")
    if by is None:
        row(case, "OOM live_by_call_site (by_site)", "present", "absent", False, f"keys: {','.join(o)}")
    else:
        tot = sum(b.get("bytes", 0) for b in by) + (o.get("live_by_call_site_unlisted_bytes") or 0) + \
            (o.get("live_no_site_bytes") or 0)
        desc = [f"{sites.line_of(b.get('call_site')) or site_list(sites, b.get('call_site'))}:"
                f"{b.get('count')}x={gib(b.get('bytes'))}" for b in by[:5]]
        top = by[0] if by else {}
        tensors = int(res.get("tensors", -1)) if res.get("tensors", "").isdigit() else -1
        gb = [b for b in by if sites.line_of(b.get("call_site")) == g]
        exact = bool(gb) and gb[0].get("bytes") == tensors * grow_b and gb[0].get("count") == tensors
        ok = bool(by) and sites.line_of(top.get("call_site")) == g and \
            top.get("bytes", 0) * 2 > (o.get("job_live_trace_bytes") or 0)
        row(case, "OOM by_site: GROW holds most bytes", f"line {g} first, > half of job_live; "
            f"{tensors} x {gib(grow_b)}", "; ".join(desc), ok,
            f"GROW exactly the program's {tensors} tensors: {'yes' if exact else 'NO'}; sum of by_site + unlisted + "
            f"no_site {tot} {'=' if tot == o.get('job_live_trace_bytes') else '!='} job_live_trace_bytes "
            f"{o.get('job_live_trace_bytes')}; no-site {gib(o.get('live_no_site_bytes'))}")
    # The report: call sites at the peak.
    rep, err = load(base + ".report.json")
    if err:
        row(case, "report --json: call_sites_at_peak", "readable", err, False, "")
    else:
        rs = Sites(rep)
        devs = [d for d in rep.get("devices") or [] if d.get("call_sites_at_peak")]
        d = max(devs, key=lambda d: d.get("peak_bytes", 0)) if devs else None
        if not d:
            row(case, "report: call_sites_at_peak", "present", "absent", False,
                f"call_sites {len(rep.get('call_sites') or [])}, stacks {rep.get('stacks')}")
        else:
            cp = d["call_sites_at_peak"]
            sl = cp.get("sites") or []
            ls = [rs.line_of(s.get("call_site")) for s in sl]
            tot = sum(s.get("bytes", 0) for s in sl) + (cp.get("unlisted_bytes") or 0) + (cp.get("no_site_bytes") or 0)
            ok = bool(ls) and ls[0] == g and w in ls
            row(case, "report: call_sites_at_peak (device %s)" % d.get("device"), f"GROW {g} first, WEIGHTS {w}",
                ", ".join(f"{ln if ln is not None else rs.label(s.get('call_site'))}={gib(s.get('bytes'))}"
                          for ln, s in list(zip(ls, sl))[:5]), ok,
                f"ACT {a} {'listed' if a in ls else 'NOT listed'}; sites+unlisted+no_site {tot} "
                f"{'=' if tot == d.get('peak_bytes') else '!='} peak {d.get('peak_bytes')}; "
                f"by_allocated first: {rs.label((rep.get('call_sites_by_allocated') or [None])[0])!r}; "
                f"events {rep.get('events')}, stacks {rep.get('stacks')}, dropped {rep.get('dropped_events')}")
    # Text reports.
    rt, ot = text(base + ".report.txt"), text(base + ".oom.txt")
    want_t = [f"{ME}:{g}", f"{ME}:{w}"]
    miss = [x for x in want_t if x not in rt] + [x + " (oom)" for x in want_t if x not in ot]
    row(case, "text report + oom name the lines", " and ".join(want_t) + " in both",
        "all present" if not miss else "missing " + ", ".join(miss), not miss and bool(rt) and bool(ot),
        f"report {len(rt)} chars, oom {len(ot)} chars; {ME}:{a} in oom text: {'yes' if f'{ME}:{a}' in ot else 'no'}")


def judge_thread(name, work):
    case = "sites-thread"
    base = os.path.join(work, name)
    res, _ = program_fields(base + ".out")
    mk = marks()
    t, m = mk.get("THREAD"), mk.get("MAIN")
    if res.get("ok") != "1":
        row(case, "program ran", "ok=1", res.get("ok", "no RESULT"), False, "see the log")
        return
    rep, err = load(base + ".report.json")
    if err:
        row(case, "report --json", "readable", err, False, "")
        return
    sites = Sites(rep)
    found = {}
    for s in sites.by_id.values():
        f, ln = Sites.where(s)
        if f == ME:
            found.setdefault(ln, []).append(s)
    ts, ms = found.get(t, []), found.get(m, [])
    tb = sum(s.get("allocated_bytes", 0) for s in ts)
    row(case, "worker thread's allocation: site", f"{ME}:{t} in worker, {THREAD_BYTES} bytes",
        "; ".join(f"{s.get('label')!r} {s.get('allocations')}x {s.get('allocated_bytes')}" for s in ts) or "none",
        bool(ts) and tb == THREAD_BYTES and all("worker" in (s.get("label") or "") for s in ts),
        f"main thread's line {m}: {[(s.get('label'), s.get('allocated_bytes')) for s in ms]}; worker tid "
        f"{res.get('worker_tid')}, main tid {res.get('main_tid')}; {ME} lines seen {sorted(k for k in found if k)}")
    if ts:
        fr = [f for f in ts[0].get("frames") or [] if f.get("kind") == "python"]
        names = [f"{os.path.basename(f.get('file') or '?')}:{f.get('function')}" for f in fr]
        boot = any((f.get("function") or "").endswith("_bootstrap_inner") for f in fr)
        mainish = any(f.get("function") in ("prog_thread", "main") and (f.get("file") or "").endswith(ME) for f in fr)
        row(case, "its Python frames are the worker's own", "worker <- threading run/_bootstrap_inner, not prog_thread",
            " <- ".join(names[:6]), boot and not mainish and bool(names) and names[0].endswith(":worker"),
            f"{len(fr)} Python frames, {len((ts[0].get('frames') or [])) - len(fr)} native")


def judge_overhead(work, none_names, default_names):
    case = "sites-overhead"

    def runs(names):
        out_ = []
        for n in names:
            res, _ = program_fields(os.path.join(work, n + ".out"))
            rep, _ = load(os.path.join(work, n + ".report.json"))
            rep = rep or {}
            allocs = sum(p.get("allocations", 0) for p in rep.get("processes") or [])
            out_.append({"name": n, "median": float(res["median_ms"]) if "median_ms" in res else None,
                         "mean": float(res["mean_ms"]) if "mean_ms" in res else None,
                         "segs": res.get("segments_timed"), "events": rep.get("events"), "allocs": allocs,
                         "stacks": rep.get("stacks"), "has_sites": "call_sites" in rep})
        return out_

    a, b = runs(none_names), runs(default_names)
    am = [r["median"] for r in a if r["median"] is not None]
    bm = [r["median"] for r in b if r["median"] is not None]
    if not am or not bm:
        row(case, "median step time: default vs --stacks none", "<= +1%", "runs failed", False,
            f"none {am}, default {bm}")
        return
    ma, mb = statistics.median(am), statistics.median(bm)
    pct = 100 * (mb - ma) / ma
    mean_a = statistics.median([r["mean"] for r in a if r["mean"] is not None])
    mean_b = statistics.median([r["mean"] for r in b if r["mean"] is not None])
    row(case, "median step time: default (stacks all) vs --stacks none", "<= +1.00%", f"{pct:+.2f}%", pct <= 1.0,
        f"none {ma:.3f} ms (runs {', '.join(f'{x:.3f}' for x in am)}); default {mb:.3f} ms (runs "
        f"{', '.join(f'{x:.3f}' for x in bm)}); means {mean_a:.3f} vs {mean_b:.3f} ms "
        f"({100 * (mean_b - mean_a) / mean_a:+.2f}%); 200 timed steps a run, 20 warm-up")
    segs = [r["segs"] for r in a + b]
    row(case, "driver allocations: steady state", "0 new segments in the timed steps",
        f"segments in timed steps {segs}", all(s == "0" for s in segs),
        "events/allocations per run: none " + ", ".join(f"{r['events']}/{r['allocs']}" for r in a) +
        "; default " + ", ".join(f"{r['events']}/{r['allocs']}" for r in b))
    ok = all(not r["stacks"] for r in a) and all(r["has_sites"] and r["stacks"] for r in b)
    row(case, "--stacks took effect", "none: stacks 0/absent; default: stacks > 0",
        "none " + ",".join(str(r["stacks"]) for r in a) + "; default " + ",".join(str(r["stacks"]) for r in b), ok,
        "report --json `stacks` per run; call_sites present with none: " +
        ",".join("yes" if r["has_sites"] else "no" for r in a))


def judge_native(name, work, source, static=False):
    case = "sites-native" + ("-static" if static else "")
    src = os.path.basename(source)
    want = {}
    with open(source, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            code = line.split("//", 1)[0]
            if re.search(r"\bcudaMalloc(Async)?\(\s*&", code):
                want[n] = code.strip()
    rep, err = load(os.path.join(work, name + ".report.json"))
    if err:
        row(case, "report --json", "readable", err, False, "")
        return
    sites = Sites(rep)
    got, other, deep = {}, [], {}
    for s in sites.by_id.values():
        f, ln = Sites.where(s)
        fr = s.get("frames") or []
        i = s.get("site_frame")
        fn = fr[i].get("function") if isinstance(i, int) and 0 <= i < len(fr) else None
        if f == src:
            got.setdefault(ln, []).append((s, fn))
        else:
            other.append(s.get("label"))
        for x in fr:  # a frame of the program's source anywhere in the stack
            if x.get("file") and os.path.basename(x["file"]) == src and x.get("line") in want:
                deep.setdefault(x["line"], []).append(s)
                break
    exp_b = {}
    try:  # the sizes of basic mode: cudaMalloc in a loop over sync_mib, cudaMallocAsync over async_mib, late 80
        body = open(source, encoding="utf-8").read()

        def arr(nm):
            m = re.search(nm + r"\[\d+\]\s*=\s*\{([^}]*)\}", body)
            return [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []

        ls = sorted(want)
        late = re.search(r"(\d+)\s*\*\s*MiB", want[ls[2]]) if len(ls) == 3 else None
        if late:
            exp_b = {ls[0]: sum(arr("sync_mib")) * MiB, ls[1]: sum(arr("async_mib")) * MiB,
                     ls[2]: int(late.group(1)) * MiB}
    except Exception:  # noqa: BLE001
        pass
    if static:
        row(case, f"static cudart: a frame of each stack is {src}:<line>", f"lines {sorted(want)}",
            f"lines {sorted(deep)}", sorted(deep) == sorted(want),
            f"chosen sites (static cudart lives in the executable, so the site may be inside it): "
            f"{sorted({s.get('label') for v in deep.values() for s in v})[:4]}")
        return
    desc = [f"{ln}: {fn} {sum(s.get('allocated_bytes', 0) for s, _ in v) // MiB} MiB" for ln, v in sorted(got.items(),
            key=lambda kv: kv[0] or 0)]
    fns_ok = all(fn and "main" in fn for v in got.values() for _, fn in v)
    row(case, f"shared cudart: sites are main at {src}:<cudaMalloc line>", f"lines {sorted(want)} in main",
        "; ".join(desc) or "none", sorted(k for k in got if k) == sorted(want) and fns_ok,
        f"labels {[s.get('label') for v in got.values() for s, _ in v][:3]}; other sites: {other[:3]}; "
        f"stacks {rep.get('stacks')}")
    if exp_b:
        gb = {ln: sum(s.get("allocated_bytes", 0) for s, _ in v) for ln, v in got.items()}
        row(case, "bytes allocated per source line", ", ".join(f"{k}: {v // MiB} MiB" for k, v in sorted(exp_b.items())),
            ", ".join(f"{k}: {v // MiB} MiB" for k, v in sorted(gb.items(), key=lambda kv: kv[0] or 0)),
            all(gb.get(k) == v for k, v in exp_b.items()), "from the program's size arrays")


def judge(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        row(args[0] if fn is not judge_overhead else "sites-overhead", "judge", "no error",
            f"{type(e).__name__}: {str(e)[:100]}", False, "stacks_case.py judge failed (see the log)")


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "oom":
        return prog_oom()
    if mode == "thread":
        return prog_thread()
    if mode == "train":
        return prog_train()
    if mode == "marks":
        print_marks()
        return 0
    if mode == "judge-oom":
        judge(judge_oom, argv[2], argv[3])
    elif mode == "judge-thread":
        judge(judge_thread, argv[2], argv[3])
    elif mode == "judge-overhead":
        judge(judge_overhead, argv[2], [x for x in argv[3].split(",") if x], [x for x in argv[4].split(",") if x])
    elif mode == "judge-native":
        judge(judge_native, argv[2], argv[3], argv[4], len(argv) > 5 and argv[5] == "static")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

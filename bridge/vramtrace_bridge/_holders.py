"""What keeps the CUDA tensors alive: a bounded walk of the program's objects, run only at an out-of-memory error,
at the exit of a job whose memory grew, or on request (never in steady state).

1. The live CUDA tensors, from `gc.get_objects()` (metadata reads only: no CUDA call), each storage counted once.
2. A breadth-first walk from the roots (user modules' globals, the frames of every thread) through containers
   and instances' attributes, to depth 6: a tensor's first (shortest) path names its holder, by the nearest
   named container on it (`kept`, `trainer.outputs`); a module's parameters and an optimizer's state by role.
3. The autograd graphs behind the tensors named there: their nodes' saved tensors (invisible to gc).
4. What remains: a few of the largest by `gc.get_referrers`: a reference cycle awaiting the collector, or held
   outside Python.
5. PyTorch's cache (reserved but free), from figures already read.
Every stage watches the clock and stops (partial) rather than go over the deadline, and a container is read to
MAX_ITEMS at most (partial past it). Walking reads what the type's own slots hold: an instance's dict through
the `__dict__` descriptor its class got from `type` (never one the class defines itself), slots through their
member descriptors, a class's flags, MRO and name through `type`'s own descriptors, a tensor's figures through
torch's base Tensor's descriptors (never a subclass's override): no code of the program's runs."""

import collections
import gc
import itertools
import os
import sys
import time
import types
from typing import Any, Dict, Optional

MAX_DEPTH = 6
MAX_HOLDERS = 16
MAX_UNREACHED = 20  # the largest unreached tensors asked of gc.get_referrers (one full pass each)
MAX_BATCH = 512  # the rest, asked together in one more pass
_CO_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED: a function's frame, whose f_locals is a copy
CHECK_EVERY = 1024  # objects between two looks at the clock
MAX_ITEMS = 100000  # a container's items read at most (a 50 M-int list is not copied)

# How a type is walked (cached per type: the walk classifies each type once).
_SKIP, _TENSOR, _SEQ, _DICT, _MODULE, _OPTIM, _INSTANCE = range(7)
_SEQ_BASES = (list, tuple, set, frozenset, collections.deque)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code, whose instances' __dict__ is plain data
# Packages whose globals are not the program's: their tensors are found through the program's own names.
_LIBRARY_PACKAGES = ("torch", "numpy", "vramtrace_bridge")

CACHE_NAME = "PyTorch's cache (reserved but free)"
UNREACHED_NAME = "not reached from the program's variables (native code, an unnamed autograd graph, CUDA graphs)"


class _Deadline(Exception):
    pass


# `type`'s own descriptors: a metaclass of the program's that defines `__flags__`, `__mro__` or `__name__` (a
# property) is never asked.
_TYPE_NS = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_FLAGS = type.__dict__["__flags__"]
_TYPE_NAME = type.__dict__["__name__"]
_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _lookup(tp, name):
    """The class attribute `name` of `tp`, read from its MRO's namespaces (no descriptor runs, no metaclass is
    asked); None where none has it."""
    try:
        for c in _TYPE_MRO.__get__(tp):
            ns = _TYPE_NS.__get__(c)
            if name in ns:
                return ns[name]
    except Exception:
        pass
    return None


def _inst_dict(obj):
    """An instance's (or a module's) own dict, through the C descriptor `type` made for its class; None where
    the class defines `__dict__` itself (a property of the program's would run)."""
    d = _lookup(type(obj), "__dict__")
    if type(d) not in _C_DESCRIPTORS:
        return None
    try:
        v = d.__get__(obj)
    except Exception:
        return None
    return v if type(v) is dict else None


def _read(desc, name, o):
    """A tensor's `name` through the base class's descriptor `desc`; where the base keeps it per instance (no
    descriptor: a plain attribute), from the instance's own dict."""
    if desc is not None and type(desc) in (_C_DESCRIPTORS + (property,)):
        return desc.__get__(o, type(o))
    d = _inst_dict(o)
    if d is not None and name in d:
        return d[name]
    raise AttributeError(name)


def _flags(tp):
    try:
        return _TYPE_FLAGS.__get__(tp)
    except Exception:
        return 0


class _Walk(object):
    def __init__(self, torch, deadline_s, device):
        self.t0 = time.monotonic()
        # A margin for what follows the last look at the clock (the result's sort, the record): the bound holds.
        self.end = self.t0 + max(0.0, deadline_s) * 0.95
        self.pass_s = 0.0  # one pass over the whole heap (gc.get_objects()), the cost of a gc.get_referrers
        self.deadline_s = deadline_s
        self.device = device
        self.partial = None  # the stage the deadline stopped, or None
        self.Tensor = torch.Tensor
        # torch's own descriptors and methods, read on any tensor: a subclass's override never runs.
        self.t_is_cuda = _lookup(torch.Tensor, "is_cuda")
        self.t_get_device = _lookup(torch.Tensor, "get_device")
        self.t_grad_fn = _lookup(torch.Tensor, "grad_fn")
        self.Module = _attr(torch, "nn", "Module")
        self.Optimizer = _attr(torch, "optim", "Optimizer")
        self.kinds = {}  # type -> how it is walked
        self.slots = {}  # type -> its __slots__ names
        self.saved_names = {}  # autograd node type -> its `_saved_*` attribute names
        self.objects = 0
        self.cuda = {}  # id(tensor) -> [tensor, storage key, bytes, reached]
        self.storage_bytes = {}  # storage key -> bytes
        self.counted = set()  # storage keys already counted under a holder
        self.holders = collections.OrderedDict()  # (kind, name, scope, what) -> [tensors, bytes, nodes, batches]
        self.visited = set()
        self.graph_roots = []  # (tensor, label) reached through variables, with a graph behind them
        self.later = []  # (obj, label, depth): walked after everything else (an optimizer's parameters)
        self.library_scopes = set()  # scopes of libraries' frames (a model's forward in progress)
        # Reading a node's saved tensors runs their unpack hooks: with torch.utils.checkpoint (non-reentrant) that
        # recomputes a forward (CUDA work, in an out-of-memory observer), with save_on_cpu a copy to the device.
        # Where such a hook is alive (find_tensors sees its function among the objects) the graphs are named and
        # counted, never unpacked. A program's own saved_tensors_hooks cannot be told: said in docs/OOM.md.
        self.unpack = True

    # ---- the clock ----


    def check(self, stage):
        if time.monotonic() > self.end:
            if self.partial is None:
                self.partial = stage
            raise _Deadline()

    def left(self, need_s=0.0):
        """Time remains (for `need_s` more, at least)."""
        return self.partial is None and time.monotonic() + need_s < self.end

    # ---- 1. the live CUDA tensors ----

    def find_tensors(self):
        t = time.monotonic()
        objs = gc.get_objects()
        self.pass_s = time.monotonic() - t
        n = len(objs)
        kinds = self.kinds
        try:
            for i in range(n):
                if not i & (CHECK_EVERY - 1):
                    self.objects = i
                    self.check("finding the CUDA tensors (%d of %d objects)" % (i, n))
                o = objs[i]
                tp = type(o)
                if tp is _FunctionType and self.unpack:
                    self.unpack = not _unpack_hook(o)
                k = kinds.get(tp)
                if k is None:
                    k = self.kind(tp)
                if k == _TENSOR:
                    self.add_tensor(o)
            self.objects = n
        finally:
            del objs

    def is_cuda(self, o):
        return _read(self.t_is_cuda, "is_cuda", o)

    def get_device(self, o):
        return self.t_get_device(o)

    def grad_fn(self, t):
        return _read(self.t_grad_fn, "grad_fn", t)

    def add_tensor(self, o):
        try:
            if not self.is_cuda(o):
                return
            if self.device is not None and self.get_device(o) != self.device:
                return
        except Exception:
            return
        key, nbytes = _storage(o)
        self.cuda[id(o)] = [o, key, nbytes, False]
        self.storage_bytes[key] = nbytes

    def kind(self, tp):
        try:
            if issubclass(tp, self.Tensor):
                k = _TENSOR
            elif issubclass(tp, dict):
                k = _DICT
            elif issubclass(tp, _SEQ_BASES):
                k = _SEQ
            elif self.Module is not None and issubclass(tp, self.Module):
                k = _MODULE
            elif self.Optimizer is not None and issubclass(tp, self.Optimizer):
                k = _OPTIM
            elif _flags(tp) & _HEAPTYPE and not issubclass(tp, type):
                k = _INSTANCE
            else:
                k = _SKIP
        except Exception:
            k = _SKIP
        self.kinds[tp] = k
        return k

    # ---- 2. from the roots ----

    def roots(self):
        """(value, label) for every user global and every local of every thread's frames; a label is
        (kind, name, scope, what)."""
        out = []
        mods = []
        for name, m in list(sys.modules.items()):
            if m is not None and _user_module(name, m):
                mods.append((name != "__main__", name, m))
        mods.sort(key=lambda x: x[:2])  # __main__ first
        for _, name, m in mods:
            d = _inst_dict(m)
            if d is None:
                continue
            items = list(itertools.islice(dict.items(d), MAX_ITEMS))
            scope = "global of %s" % name
            for k, v in items:
                if not k.startswith("__"):
                    out.append((v, ("variable", k, scope, _tname(v))))
        try:
            frames = list(sys._current_frames().items())
        except Exception:
            frames = []
        tail = []  # libraries' frames (torch's functions holding their arguments) after the program's own
        for _, f in frames:
            while f is not None:
                user = _user_frame(f)
                (out if user else tail).extend(self.frame_roots(f, not user))
                f = f.f_back
        # The last uncaught error's traceback (a notebook's failed cell, an interactive session) keeps the
        # failing functions' frames, and so their locals, alive after they ended.
        tb = getattr(sys, "last_traceback", None)
        seen_tb = 0
        while tb is not None and seen_tb < 256:
            seen_tb += 1
            f = tb.tb_frame
            user = _user_frame(f)
            (out if user else tail).extend(self.frame_roots(f, not user, " (kept by the last error's traceback)"))
            tb = tb.tb_next
        f = tb = None
        # The listing holds this very frame, whose locals hold the listing: a cycle that would keep every root
        # (the program's tensors) alive after the walk until the cyclic collector ran.
        frames.clear()
        return out + tail

    def frame_roots(self, f, library, why=""):
        try:
            code = f.f_code
            g = f.f_globals
            if str(g.get("__name__", "")).startswith("vramtrace_bridge") or code.co_name == "<module>":
                return []  # our own frames; a module's body: its locals are its globals
            scope = "local of %s() at %s:%d%s" % (code.co_name, os.path.basename(code.co_filename), f.f_lineno, why)
            if library:
                self.library_scopes.add(scope)
            loc = f.f_locals
            items = list(dict.items(loc))
            # Before 3.13 reading f_locals leaves a copy of the locals on the running frame until it returns:
            # it would keep this step's tensors alive after the walk (a serving loop that catches the error).
            # The walk holds what it needs; the copy is emptied (not under a tracer, which writes it back).
            if (sys.version_info < (3, 13) and code.co_flags & _CO_OPTIMIZED and type(loc) is dict
                    and f.f_trace is None and sys.gettrace() is None):
                loc.clear()
        except Exception:
            return []
        return [(v, ("variable", k, scope, _tname(v))) for k, v in items]

    def walk_roots(self):
        queue = collections.deque()
        for v, label in self.roots():
            queue.append((v, label, True, 0))
        self.bfs(queue, "walking from the program's variables")
        later, self.later = self.later, []
        self.bfs(collections.deque((o, label, False, d) for o, label, d in later), "walking optimizers' parameters")

    def bfs(self, queue, stage):
        """queue: (obj, label, named, depth). `named`: obj is the value of a variable or attribute path (its
        attributes extend the name); otherwise it is inside a container, and the container's label stays."""
        kinds = self.kinds
        visited = self.visited
        i = 0
        while queue:
            i += 1
            if not i & (CHECK_EVERY - 1):
                self.check(stage)
            obj, label, named, depth = queue.popleft()
            if id(obj) in visited:
                continue
            tp = type(obj)
            k = kinds.get(tp)
            if k is None:
                k = self.kind(tp)
            if k == _SKIP:
                continue
            visited.add(id(obj))
            if k == _TENSOR:
                self.reach(obj, label, queue, depth)
                continue
            if depth >= MAX_DEPTH:
                continue
            d = depth + 1
            if named:
                label = (label[0], label[1], label[2], _tname(obj))
            try:
                if k == _SEQ:
                    for base in _SEQ_BASES:
                        if issubclass(tp, base):
                            children = self.items(base.__iter__(obj), base.__len__(obj), stage)
                            break
                    for c in children:
                        if kinds.get(type(c)) != _SKIP:
                            queue.append((c, label, False, d))
                elif k == _DICT:
                    for key, v in self.items(dict.items(obj), dict.__len__(obj), stage):
                        if kinds.get(type(v)) != _SKIP:
                            queue.append((v, label, False, d))
                        if kinds.get(type(key)) == _TENSOR:
                            queue.append((key, label, False, d))
                elif k == _MODULE:
                    self.expand_module(obj, label, queue, d)
                elif k == _OPTIM:
                    self.expand_optimizer(obj, label, queue, d)
                else:
                    self.expand_instance(obj, tp, label, named, queue, d)
            except _Deadline:
                raise
            except Exception:
                continue

    def items(self, it, n, stage):
        """A container's items, MAX_ITEMS at most (the walk is then partial: it did not read them all)."""
        if n > MAX_ITEMS and self.partial is None:
            self.partial = "%s (a container of %d items read to %d)" % (stage, n, MAX_ITEMS)
        return list(itertools.islice(it, MAX_ITEMS))

    def expand_instance(self, obj, tp, label, named, queue, d):
        od = _inst_dict(obj)
        attrs = list(itertools.islice(dict.items(od), MAX_ITEMS)) if od is not None else []
        slots = self.slots.get(tp)
        if slots is None:
            slots = self.slots[tp] = _slot_names(tp)
        for s, desc in slots:
            try:
                attrs.append((s, desc.__get__(obj, tp)))
            except Exception:
                pass
        for a, v in attrs:
            if self.kinds.get(type(v)) == _SKIP:
                continue
            if named:
                queue.append((v, (label[0], "%s.%s" % (label[1], a), label[2], _tname(v)), True, d))
            else:
                queue.append((v, label, False, d))

    def expand_module(self, m, label, queue, d):
        """A module's parameters and buffers, and its submodules', under the module's own name; its other
        attributes as an instance's."""
        params = ("parameters", label[1], label[2], label[3])
        md = _inst_dict(m)
        if md is None:
            return
        attrs = list(itertools.islice(dict.items(md), MAX_ITEMS))
        for a, v in attrs:
            if a in ("_parameters", "_buffers") and issubclass(type(v), dict):
                for t in list(dict.values(v)):
                    if t is not None:
                        queue.append((t, params, False, d))
            elif a == "_modules" and issubclass(type(v), dict):
                for sub in list(dict.values(v)):
                    if sub is not None:
                        # Submodules' parameters are the top module's: one holder per model, not per layer,
                        # at the model's depth however deep the layers nest.
                        queue.append((sub, params, False, d - 1))
            elif self.kinds.get(type(v)) != _SKIP:
                if label[0] == "parameters":
                    queue.append((v, ("variable", label[1], label[2], label[3]), False, d))
                else:
                    queue.append((v, ("variable", "%s.%s" % (label[1], a), label[2], _tname(v)), True, d))

    def expand_optimizer(self, opt, label, queue, d):
        state = ("optimizer", label[1], label[2], label[3])
        od = _inst_dict(opt)
        if od is None:
            return
        st = dict.get(od, "state")
        groups = dict.get(od, "param_groups")
        if issubclass(type(st), dict):
            for v in list(dict.values(st)):
                queue.append((v, state, False, d))
        # The parameters it steps are the model's: named by the model when it is reached at all.
        if issubclass(type(groups), list):
            self.later.append((groups, ("parameters", label[1] + ".param_groups", label[2], label[3]), d))

    def reach(self, t, label, queue, depth):
        rec = self.cuda.get(id(t))
        if rec is not None and rec[0] is t and not rec[3]:
            rec[3] = True
            self.credit(label, rec[1])
        if label[0] == "variable":
            try:
                fn = self.grad_fn(t)
                if fn is not None:
                    self.graph_roots.append((t, label))
            except Exception:
                pass
        try:
            # A leaf's gradient is held with it; a non-leaf has none, and asking warns on the program's stderr.
            g = t.grad if t.is_leaf else None
        except Exception:
            g = None
        if g is not None and depth < MAX_DEPTH:
            queue.append((g, label, False, depth + 1))

    def credit(self, label, key):
        h = self.holders.get(label)
        if h is None:
            h = self.holders[label] = [0, 0, 0, 0]
        h[0] += 1
        if key not in self.counted:
            self.counted.add(key)
            h[1] += self.storage_bytes.get(key, 0)

    # ---- 3. autograd graphs ----

    def walk_graphs(self):
        seen = set()
        keep = []  # the node wrappers: ids of dropped ones can be reused
        for t, label in self.graph_roots:
            self.check("walking autograd graphs")
            try:
                root = self.grad_fn(t)
            except Exception:
                continue
            if root is None or id(root) in seen:
                continue
            glabel = ("graph", label[1], label[2], type(root).__name__)
            nodes, tensors, nbytes = self.walk_graph(root, seen, keep)
            # Unread (checkpointing can run), a graph is still named by the iterations it spans.
            if nbytes or tensors or (not self.unpack and _chain(root) > 1):
                h = self.holders.get(glabel)
                if h is None:
                    h = self.holders[glabel] = [0, 0, 0, 0]
                h[0] += tensors
                h[1] += nbytes
                h[2] += nodes
                h[3] = max(h[3], _chain(root))

    def walk_graph(self, root, seen, keep):
        nodes = tensors = nbytes = 0
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            keep.append(node)
            nodes += 1
            if not nodes & 255:
                self.check("walking autograd graphs")
            for name in self.node_saved_names(type(node)) if self.unpack else ():
                try:
                    v = getattr(node, name)  # a C++ node's getter: raises once backward() freed it
                except Exception:
                    continue
                for s in (v if type(v) in (tuple, list) else (v,)):
                    n = self.saved_tensor(s)
                    if n is not None:
                        tensors += 1
                        nbytes += n
            try:
                nxt = node.next_functions
            except Exception:
                nxt = ()
            for pair in nxt:
                try:
                    n = pair[0]
                except Exception:
                    continue
                if n is not None and id(n) not in seen:
                    stack.append(n)
        return nodes, tensors, nbytes

    def node_saved_names(self, tp):
        names = self.saved_names.get(tp)
        if names is None:
            try:
                names = [n for n in dir(tp) if n.startswith("_saved_")]
            except Exception:
                names = []
            self.saved_names[tp] = names
        return names

    def saved_tensor(self, s):
        """The bytes of a saved CUDA tensor whose storage nothing counted yet, else None."""
        try:
            if (self.kinds.get(type(s)) or self.kind(type(s))) != _TENSOR or not self.is_cuda(s):
                return None
            if self.device is not None and self.get_device(s) != self.device:
                return None
        except Exception:
            return None
        rec = self.cuda.get(id(s))
        if rec is not None and rec[0] is s:
            rec[3] = True
        key, nbytes = _storage(s)
        if key in self.counted:
            return None
        self.counted.add(key)
        self.storage_bytes.setdefault(key, nbytes)
        return nbytes

    # ---- 4. what no name reached ----

    def unreached(self):
        left = [rec for rec in self.cuda.values() if not rec[3]]
        if not left:
            return
        left.sort(key=lambda r: -r[2])
        cycle_types = []
        cycle = []
        ours = {id(self.cuda), id(left), id(self.graph_roots), id(cycle), id(cycle_types)}
        ours.update(id(rec) for rec in left)
        rest = []
        for i, rec in enumerate(left):
            # A full pass over the heap each (a few times get_objects): only while one surely fits.
            if i >= MAX_UNREACHED or not self.left(4 * self.pass_s):
                rest.extend(left[i:])
                break
            try:
                refs = gc.get_referrers(rec[0])
            except Exception:
                refs = []
            via = None
            for r in refs:
                if id(r) in ours or id(r) in self.visited or type(r).__name__ == "frame":
                    continue
                via = type(r).__name__
                break
            del refs
            if via is None:
                rest.append(rec)
            else:
                cycle.append(rec)
                if via not in cycle_types:
                    cycle_types.append(via)
        # The rest in one more pass: whatever refers to any of them (gc.get_referrers compares each referent
        # with every argument: a few hundred at most), then which of them each such referrer holds.
        if rest and self.left(4 * self.pass_s):
            batch = rest[:MAX_BATCH]
            by_id = {id(rec[0]): rec for rec in batch}
            ours.add(id(batch))
            ours.add(id(by_id))
            try:
                refs = gc.get_referrers(*[rec[0] for rec in batch])
            except Exception:
                refs = []
            ours.add(id(refs))
            held = set()
            for r in refs:
                if id(r) in ours or id(r) in self.visited or type(r).__name__ == "frame":
                    continue
                try:
                    inner = gc.get_referents(r)
                except Exception:
                    continue
                for x in inner:
                    if id(x) in by_id and id(x) not in held:
                        held.add(id(x))
                        via = type(r).__name__
                        if via not in cycle_types:
                            cycle_types.append(via)
            del refs
            cycle.extend(by_id[i] for i in held)
            rest = [rec for rec in rest if id(rec[0]) not in held]
        if cycle:
            name = "reference cycle through a %s, awaiting the garbage collector" % "/".join(cycle_types[:3])
            label = ("cycle", name, None, cycle_types[0])
            for rec in cycle:
                self.credit(label, rec[1])
        # The smaller ones (and any the clock left unasked) are not reached either way.
        for rec in rest:
            self.credit(("unreached", UNREACHED_NAME, None, None), rec[1])


_FunctionType = types.FunctionType
# Where PyTorch defines the saved-tensor hooks whose unpacking runs work: non-reentrant checkpointing (it
# recomputes the forward) and save_on_cpu (a copy back to the device).
_HOOK_MODULES = ("torch.utils.checkpoint", "torch.autograd.graph")


def _unpack_hook(f):
    """`f` is one of PyTorch's unpack hooks, alive: saved tensors somewhere run it when read."""
    try:
        # The hooks are closures made for each use (`..._checkpoint_hook.__init__.<locals>.unpack_hook`,
        # `save_on_cpu.__init__.<locals>.unpack_from_cpu`): a module's own functions are always alive.
        q = f.__qualname__
        return f.__module__ in _HOOK_MODULES and "unpack" in q and "<locals>" in q
    except Exception:
        return False


def _attr(torch, *path):
    o = torch
    for p in path:
        o = getattr(o, p, None)
        if o is None:
            return None
    return o


def _tname(v):
    try:
        return _TYPE_NAME.__get__(type(v))
    except Exception:
        return "?"


def _storage(t):
    """(key, bytes) of a tensor's storage: the key counts a storage shared by views once."""
    try:
        st = t.untyped_storage()
        key = st.data_ptr()
        nbytes = int(st.nbytes())
        if key:
            return key, nbytes
        return ("empty", id(t)), nbytes
    except Exception:
        pass
    try:
        return ("tensor", id(t)), int(t.element_size() * t.nelement())
    except Exception:
        return ("tensor", id(t)), 0


def _slot_names(tp):
    """(name, member descriptor) of every slot its classes declare: read through the declaring class's own
    descriptor, so a property a subclass puts over the name never runs."""
    out = []
    seen = set()
    try:
        for c in _TYPE_MRO.__get__(tp):
            ns = _TYPE_NS.__get__(c)
            s = ns.get("__slots__", ())
            if type(s) is str:
                s = (s,)
            if type(s) not in (tuple, list):
                continue
            for n in s:
                if type(n) is not str or n in ("__dict__", "__weakref__") or n in seen:
                    continue
                desc = ns.get(n)
                if type(desc) is types.MemberDescriptorType:
                    seen.add(n)
                    out.append((n, desc))
    except Exception:
        pass
    return out


def _chain(root):
    """How many nodes of the root's own type follow each other along first inputs: `total = total + loss` in a
    loop makes one per iteration."""
    tp = type(root)
    n = 0
    node = root
    seen = set()
    while node is not None and type(node) is tp and id(node) not in seen:
        seen.add(id(node))
        n += 1
        try:
            nxt = node.next_functions
            node = nxt[0][0] if nxt else None
        except Exception:
            break
    return n


_prefixes = None


def _library_dirs():
    """The standard library's and installed packages' directories, of this interpreter and of the one a virtual
    environment is made from (the directories under sys.prefix and sys.base_prefix that hold modules: a
    program of the user's may live elsewhere under /usr)."""
    global _prefixes
    if _prefixes is None:
        dirs = set()
        try:
            import sysconfig

            for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
                paths = sysconfig.get_paths(vars=scheme_vars)
                for key in ("stdlib", "platstdlib", "purelib", "platlib"):
                    if paths.get(key):
                        dirs.add(os.path.realpath(paths[key]) + os.sep)
        except Exception:
            for p in (sys.prefix, sys.base_prefix):
                dirs.add(os.path.realpath(p) + os.sep)
        _prefixes = tuple(dirs)
    return _prefixes


def _user_module(name, m):
    """__main__, or a module whose file is the program's: not the standard library's, not an installed
    package's, not torch's, numpy's or the bridge's."""
    if name == "__main__":
        return True
    if name.split(".", 1)[0] in _LIBRARY_PACKAGES:
        return False
    d = _inst_dict(m)
    if d is None:
        return False
    f = dict.get(d, "__file__")
    if type(f) is not str:
        return False  # builtin and frozen modules
    if "site-packages" in f or "dist-packages" in f:
        return False
    try:
        f = os.path.realpath(f)
    except Exception:
        return False
    return not f.startswith(_library_dirs())


def _user_frame(f):
    """Whether frame `f` runs the program's own code (its module is `__main__` or one of the program's)."""
    try:
        name = f.f_globals.get("__name__")
        mod = sys.modules.get(name)
        return name == "__main__" or (mod is not None and _user_module(name, mod))
    except Exception:
        return False


def walk(torch: Any, deadline_s: float = 1.0, device: Optional[int] = None,
         cache_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The holders of the live CUDA tensors (of `device`, or of every device). Returns a dict: elapsed_ms,
    objects, tensors, tensor_bytes, partial (the stage the deadline stopped, or None), holders: a list of dicts
    (kind, name, scope, what, tensors, bytes, and for graphs nodes, batches), largest first, at most 16. Never
    raises."""
    w = None
    try:
        w = _Walk(torch, deadline_s, device)
        for stage in (w.find_tensors, w.walk_roots, w.walk_graphs):
            stage()
        w.unreached()
    except _Deadline:
        pass
    except Exception as e:
        if w is None:
            return {"elapsed_ms": 0, "objects": 0, "tensors": 0, "tensor_bytes": 0, "holders": [],
                    "partial": "failed: %r" % (e,)}
        if w.partial is None:
            w.partial = "failed: %r" % (e,)
    return _result(w, cache_bytes)


def _result(w, cache_bytes):
    holders = []
    for (kind, name, scope, what), (tensors, nbytes, nodes, batches) in w.holders.items():
        if kind == "graph" and not nbytes and (w.unpack or batches < 2):
            continue  # nothing saved behind it (or, unread, a graph of one step)
        h = {"kind": kind, "name": name, "scope": scope, "what": what, "tensors": tensors, "bytes": nbytes}
        if scope in w.library_scopes:
            h["lib"] = True
        if kind == "graph":
            h["nodes"] = nodes
            if batches > 1:
                h["batches"] = batches
        holders.append(h)
    if cache_bytes is not None and cache_bytes > 0:
        holders.append({"kind": "cache", "name": CACHE_NAME, "scope": None, "what": "CUDACachingAllocator",
                        "tensors": 0, "bytes": int(cache_bytes)})
    holders.sort(key=lambda h: -h["bytes"])
    partial = w.partial
    if partial is not None and not partial.startswith("failed"):
        partial = "the %gs deadline stopped it while %s" % (w.deadline_s, partial)
    return {
        "elapsed_ms": int((time.monotonic() - w.t0) * 1000),
        "objects": w.objects,
        "tensors": len(w.cuda),
        "tensor_bytes": sum(r[2] for r in {r[1]: r for r in w.cuda.values()}.values()),
        "partial": partial,
        "holders": holders[:MAX_HOLDERS],
    }


def record(result, at, oom=None):
    """The `holders` record (bridge/schema.json): the walk's figures, its holders as a list."""
    holders = []
    for h in result["holders"]:
        one = {k: h[k] for k in ("kind", "name", "scope", "what", "tensors", "bytes")}
        if h["kind"] == "graph":
            one.update(nodes=h["nodes"], batches=h.get("batches"))
        if h.get("lib"):
            one["lib"] = True
        holders.append({k: v for k, v in one.items() if v is not None})
    out = {
        "at": at,
        "oom": oom,
        "elapsed_ms": result["elapsed_ms"],
        "objects": result["objects"],
        "tensors": result["tensors"],
        "tensor_bytes": result["tensor_bytes"],
        "holders": holders,
    }
    if result.get("partial"):
        out.update(partial=True, partial_reason=result["partial"])
    return out

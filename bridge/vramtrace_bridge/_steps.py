"""The program's iterations, counted from inside PyTorch without a torch call: the first optimizer's `step()`
calls (a global post-hook), the first dataset's DataLoader batches (a wrapped `__next__`) and, for a loop with
neither, the outermost `torch.no_grad` / `inference_mode` scopes the program's own code enters. Plain ints,
written by the program's threads and read by the sampler. What a step's boundary does (the allocator's reading,
`run --stop-after-steps`) is _torch.py's, called through `install`'s `on_boundary`."""

import functools
import sys
import time
import weakref
from typing import Any, Callable, Dict, Optional

from . import _holders, _hook


class First(object):
    """Counts the calls for one object only, the first seen (until it is collected: then the next one seen), so
    that several optimizers stepping in one iteration (a GAN), or a validation loader beside the training
    one, count one step an iteration."""

    __slots__ = ("ref", "ident")

    def __init__(self):
        self.ref = None
        self.ident = None

    def counts(self, obj):
        ref = self.ref
        if ref is not None:
            held = ref()
            if held is obj:
                return True
            if held is not None:
                return False
        elif self.ident is not None:
            return id(obj) == self.ident  # not weakly referenceable: its id, for good
        try:
            self.ref = weakref.ref(obj)
        except TypeError:
            self.ident = id(obj)
        return True


class Counters(object):
    """The program's step counters (written by its own threads, read by the sampler: plain ints)."""

    def __init__(self):
        self.optimizer = 0
        self.batches = 0
        # Outermost entries of torch.no_grad / torch.inference_mode (from a state with gradients on): the
        # iterations of a loop with neither an optimizer nor a DataLoader (a serving loop, an evaluation, a
        # generation), counted only while neither of those counts.
        self.scopes = 0
        self.t_ns = 0  # monotonic_ns of the latest step of either kind
        self.first_optimizer = First()
        self.first_loader = First()
        self.sent = (0, 0, 0)
        self.next_read_ns = 0  # no reading at a step's boundary before this (past the first BOUNDARY_FREE)
        self.reads = 0
        self.room_read = set()  # devices whose free memory was read at a step's boundary

    def index(self):
        """The step the program is in: optimizer steps once there are any (a step may take several batches),
        else batches, else scopes; None before any."""
        return self.optimizer or self.batches or self.scopes or None


counters = Counters()
# Patched or registered once per process, forks included (the hook and the patch survive a fork).
hooks = {"optimizer": False, "dataloader": False, "scopes": False}
# What a step's boundary does (_torch.py: the allocator's reading, the stop), called with the counter that
# moved ("optimizer", "batches", "scopes") and the counters; set by `install`.
_on_boundary: Optional[Callable[[str, "Counters"], None]] = None
# torch, for the scope hooks' checks of the grad mode; set by `install`.
_torch: Any = None


def reset():
    """In a forked child: its own counts from 0 (the hooks stay: they came with the copy)."""
    global counters
    counters = Counters()


def _boundary(counter, s):
    f = _on_boundary
    if f is not None:
        f(counter, s)


def on_optimizer_step(optimizer, args, kwargs):
    try:
        s = counters
        if s.first_optimizer.counts(optimizer):
            s.optimizer += 1
            s.t_ns = time.monotonic_ns()
            _boundary("optimizer", s)
    except Exception:
        pass


def count_batch(it):
    try:
        s = counters
        if s.first_loader.counts(it.__dict__.get("_dataset", it)):
            s.batches += 1
            s.t_ns = time.monotonic_ns()
            if not s.optimizer:  # optimizer steps, when there are any, are the steps read
                _boundary("batches", s)
    except Exception:
        pass


def count_scope():
    """An outermost no_grad / inference_mode scope the program's own code entered: an iteration of a loop that
    has no other count. Never a reason to stop (`--stop-after-steps`): a training script's evaluation before its
    first optimizer step would end it there."""
    try:
        s = counters
        s.scopes += 1
        if s.optimizer or s.batches:
            return
        s.t_ns = time.monotonic_ns()
        _boundary("scopes", s)
    except Exception:
        pass


# Modules whose frames enter a decorated function's scope for it (the caller is the one behind them).
_SCOPE_WRAPPERS = ("torch.utils._contextlib", "contextlib", "functools")
# module name -> whether its code is the program's (cached: a path is resolved once)
_user_modules: Dict[str, bool] = {}


def entered_by_program(depth):
    """Whether the frame `depth` up (the one that entered the scope), past torch's decorator wrappers, is the
    program's own code: torch moving a model's parameters (`.cuda()` enters no_grad once a parameter) and a
    library's own scopes are not the program's iterations."""
    try:
        f = sys._getframe(depth + 1)
        while f is not None and f.f_globals.get("__name__") in _SCOPE_WRAPPERS:
            f = f.f_back
        if f is None:
            return False
        name = f.f_globals.get("__name__")
        known = _user_modules.get(name)
        if known is None:
            known = _user_modules[name] = bool(_holders._user_module(name, sys.modules.get(name)))
        return known
    except Exception:
        return False


def hook_optimizer(mod):
    if hooks["optimizer"]:
        return
    register = getattr(mod, "register_optimizer_step_post_hook", None)  # PyTorch >= 2.0
    if register is None:
        return
    hooks["optimizer"] = True
    register(on_optimizer_step)


def _wrap_next(real):
    @functools.wraps(real)
    def __next__(self):
        out = real(self)  # a StopIteration (or anything else) goes through untouched
        count_batch(self)
        return out

    __next__._vramtrace = True
    return __next__


def hook_dataloader(mod):
    if hooks["dataloader"]:
        return
    cls = getattr(mod, "_BaseDataLoaderIter", None)
    real = getattr(cls, "__next__", None) if cls is not None else None
    if real is None or getattr(real, "_vramtrace", False):
        return
    hooks["dataloader"] = True
    cls.__next__ = _wrap_next(real)


def _wrap_scope_enter(real, torch):
    """`__enter__` of no_grad / inference_mode, counting the entries made with gradients on and outside inference
    mode (a scope inside another is the same iteration). One C call more per entry."""
    grad_on = getattr(torch, "is_grad_enabled", None)
    inference = getattr(torch, "is_inference_mode_enabled", None)

    @functools.wraps(real)
    def __enter__(self):
        try:
            outer = grad_on is not None and grad_on() and not (inference is not None and inference())
        except Exception:
            outer = False
        out = real(self)
        if outer and entered_by_program(1):
            count_scope()
        return out

    __enter__._vramtrace = True
    return __enter__


def hook_grad_mode(mod):
    if hooks["scopes"]:
        return
    torch = _torch
    if torch is None:
        return
    hooks["scopes"] = True
    for name in ("no_grad", "inference_mode"):
        cls = getattr(mod, name, None)
        real = getattr(cls, "__enter__", None) if cls is not None else None
        if real is not None and not getattr(real, "_vramtrace", False):
            cls.__enter__ = _wrap_scope_enter(real, torch)


def install(torch, on_boundary):
    """Counts the program's steps from now on (each hook once per process), `on_boundary` called at each step's
    boundary."""
    global _torch, _on_boundary
    _torch = torch
    _on_boundary = on_boundary
    _hook.when_imported("torch.optim.optimizer", hook_optimizer)
    _hook.when_imported("torch.utils.data.dataloader", hook_dataloader)
    _hook.when_imported("torch.autograd.grad_mode", hook_grad_mode)

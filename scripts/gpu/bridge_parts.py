"""The Python bridge's inner parts, for the GPU scripts that time or switch them from inside a traced process
(bridge_case.py, verdicts_case.py, holds_case.py). The bridge moved them between builds; the scripts run against
any of them (a proof compares a build with an older one), so each part is looked up where the build keeps it:
  - since 2026-11-29 (5e92c73): `_torch.py` split into `_sampler`, `_oom`, `_snapshot`, `_settings`, `_state`;
  - since 2026-11-29 (079bdad): the step counters in `_steps.counters`;
  - before: all of it in `_torch.py` (`_state`, `_start_sampler`, `_oom_unsafe`, ...).
The bridge itself is loaded by `vramtrace run`'s sitecustomize: these only find what is already imported."""

import importlib
import sys

# part -> (module, name) in the split bridge, then (module, name) in `_torch.py` before it.
PARTS = {
    "sample_device": (("_sampler", "sample_device"), ("_torch", "sample_device")),
    "start_sampler": (("_sampler", "start"), ("_torch", "_start_sampler")),
    "interval_ms": (("_settings", "interval_ms"), ("_torch", "_interval_ms")),
    "oom_unsafe": (("_oom", "_oom_unsafe"), ("_torch", "_oom_unsafe")),
    "segment_figures": (("_oom", "segment_figures"), ("_torch", "segment_figures")),
    "dump": (("_snapshot", "dump"), ("_torch", "_dump")),
    "backend": (("_settings", "backend"), ("_torch", "_backend")),
    "thread_name": (("_oom", "_thread_name"), ("_torch", "_thread_name")),
    "conf_value": (("_settings", "conf_value"), ("_torch", "_conf_value")),
}


def module(name):
    """The bridge's module `name` (`_sampler`, ...), or None where this build has none by that name."""
    full = "vramtrace_bridge." + name
    if "vramtrace_bridge" not in sys.modules:
        return None  # no bridge in this process: nothing is imported from elsewhere
    if full in sys.modules:
        return sys.modules[full]
    try:
        return importlib.import_module(full)
    except ImportError:
        return None


def owner(part):
    """(module, attribute name) holding `part` in this build."""
    for mod, attr in PARTS[part]:
        m = module(mod)
        if m is not None and hasattr(m, attr):
            return m, attr
    raise LookupError("the bridge has no %s in this build" % part)


def get(part):
    m, attr = owner(part)
    return getattr(m, attr)


def state():
    """The bridge's state dict (the sampler's thread, whether the history is armed, ...)."""
    s = module("_state")
    if s is not None and hasattr(s, "state"):
        return s.state
    return module("_torch")._state


def optimizer_steps():
    """The bridge's own count of optimizer steps (proof its hook ran), or '-' without the bridge."""
    steps = module("_steps")
    if steps is None or module("_torch") is None:
        return "-"
    counters = getattr(steps, "counters", steps)
    return getattr(counters, "optimizer", "?")


def boundary_reads():
    """How many times a step's boundary read the allocator, or '?'."""
    steps = module("_steps")
    return getattr(getattr(steps, "counters", steps), "reads", "?")

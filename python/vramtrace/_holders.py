"""`vramtrace.holders()`: the bridge's walk of what keeps the CUDA tensors alive (vramtrace_bridge/_holders.py),
run now, in this process, and handed back as plain data that holds no tensor."""

import html
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

from . import _units


@dataclass(frozen=True)
class Holder:
    """One holder: `kind` is variable, parameters, optimizer, graph, cycle, unreached or cache (docs/OOM.md);
    `name` what the program calls it (`kept`, `model`, `trainer.outputs`), `scope` where that name lives
    (`global of __main__`, a function's local), `what` its type; `tensors` and `bytes` counted once per
    storage. `nodes` and `batches`: an autograd graph's nodes and the iterations it spans."""

    kind: str
    name: str
    scope: Optional[str]
    what: Optional[str]
    tensors: int
    bytes: int
    nodes: Optional[int] = None
    batches: Optional[int] = None
    library: bool = False


@dataclass(frozen=True)
class Holders:
    """The walk: its holders, largest first (at most 16), the live CUDA tensors and their bytes (each storage
    once), the objects looked at, how long it took, and `partial` (why it stopped early), or None."""

    holders: List[Holder] = field(default_factory=list)
    tensors: int = 0
    tensor_bytes: int = 0
    objects: int = 0
    elapsed_ms: int = 0
    partial: Optional[str] = None

    def __iter__(self) -> Iterator[Holder]:
        return iter(self.holders)

    def __len__(self) -> int:
        return len(self.holders)

    def rows(self) -> List[List[str]]:
        """The table a person reads: name, bytes, tensors, kind."""
        return [[_label(h), _units.size(h.bytes), str(h.tensors) if h.kind != "cache" else "", h.kind]
                for h in self.holders]

    def summary(self) -> str:
        s = "%d CUDA tensors, %s, held by:" % (self.tensors, _units.size(self.tensor_bytes))
        if not self.holders:
            s = "%d CUDA tensors: nothing holds GPU memory." % self.tensors
        return s

    def footer(self) -> Optional[str]:
        if self.partial:
            return "partial: %s" % self.partial
        return None

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.holders:
            lines.append(_units.table(["NAME", "BYTES", "TENSORS", "KIND"], self.rows(), right=(1, 2)))
        foot = self.footer()
        if foot:
            lines.append(foot)
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        out = ["<div class=\"vramtrace\"><p>%s</p>" % html.escape(self.summary())]
        if self.holders:
            out.append(_units.html_table(["name", "bytes", "tensors", "kind"], self.rows(), right=(1, 2)))
        foot = self.footer()
        if foot:
            out.append("<p>%s</p>" % html.escape(foot))
        out.append("</div>")
        return "".join(out)


def _label(h: Holder) -> str:
    if h.kind == "cache" or not h.scope:
        return h.name
    what = "%s, " % h.what if h.what and h.kind == "variable" else ""
    return "%s (%s%s)" % (h.name, what, h.scope)


def holders(deadline_s: float = 1.0, device: Optional[int] = None) -> Holders:
    """What keeps the CUDA tensors of this process alive now (of `device`, or of every device), largest first,
    with PyTorch's cache (reserved but free) as a holder of its own. The bridge's walk, bounded by `deadline_s`
    (past it: `partial` says where it stopped). Works in any process with PyTorch, traced or not; without torch
    imported there is no CUDA tensor, and the answer is empty. Runs no code of the program's and no CUDA call."""
    torch = sys.modules.get("torch")
    if torch is None:
        return Holders()
    from vramtrace_bridge import _holders as walk  # the traced process's own (first on its path), else ours

    got = walk.walk(torch, deadline_s, device, _cache_bytes(torch, device))
    return Holders(
        holders=[
            Holder(
                kind=h["kind"],
                name=h["name"],
                scope=h.get("scope"),
                what=h.get("what"),
                tensors=int(h.get("tensors") or 0),
                bytes=int(h.get("bytes") or 0),
                nodes=h.get("nodes"),
                batches=h.get("batches"),
                library=bool(h.get("lib")),
            )
            for h in got["holders"]
        ],
        tensors=int(got["tensors"]),
        tensor_bytes=int(got["tensor_bytes"]),
        objects=int(got["objects"]),
        elapsed_ms=int(got["elapsed_ms"]),
        partial=got.get("partial"),
    )


def _cache_bytes(torch: Any, device: Optional[int]) -> Optional[int]:
    """PyTorch's reserved but free bytes, from its own counters (no CUDA call); None before CUDA is initialised."""
    try:
        if not torch.cuda.is_initialized():
            return None
        devices = [device] if device is not None else list(range(torch.cuda.device_count()))
    except Exception:
        return None
    total = 0
    for d in devices:
        try:  # a device this process never used has no figures
            s = torch.cuda.memory_stats(d)
            total += max(0, s.get("reserved_bytes.all.current", 0) - s.get("allocated_bytes.all.current", 0))
        except Exception:
            pass
    return total

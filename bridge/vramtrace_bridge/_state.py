"""The PyTorch side's state in this process, one dict for all of its modules (_torch.py, _sampler.py, _history.py,
_oom.py, _walks.py, _exit.py): what attached, the sampler's thread and the figures it last sent, the history's
ring, the exit's and the walks' flags. Each module reads and writes it as `_state.state[...]`, never through a
name of its own (`from ._state import state` would keep the dict a fork's reset or a test replaced); `lock`
guards the attach and the sampler's start. `note` sends a `note` record and swallows its errors. Imports only
_shim: any module of the PyTorch side may import this one."""

import threading
from typing import Any, Dict

from . import _shim

state: Dict[str, Any] = {
    "torch": None,
    "attached": False,
    "pid": None,
    "thread": None,
    "last": {},  # device -> tuple of the last values sent
    "active": set(),  # devices seen holding memory
    "ooms": 0,
    "history": 0,  # entries of the ring while PyTorch keeps the history (armed), else 0
    "arming": None,  # Arming: when to keep it
    "exit_done": False,
    "peaks": {},  # device -> the most (allocated peak, reserved peak) sent
    "stop_steps": 0,  # VRAMTRACE_STOP_STEPS: end the process at the boundary of this step (0: never)
    "stopping": False,
}
lock = threading.RLock()


def note(device, text):
    try:
        _shim.record("note", device, {"text": text})
    except Exception:
        pass

"""A stand-in for torch, for the bridge's tests: the few APIs the bridge uses, with PyTorch's semantics
(queued lazy calls run at CUDA initialisation, before `is_initialized()` turns true; an observer called with
(device, alloc, allowed_or_total, device_free) before the error is raised), over a toy caching allocator whose
segments come from the real (or simulated) driver through ctypes, so the shim sees them."""

__version__ = "0.0-fake"

from . import cuda  # noqa: E402,F401
from . import _C  # noqa: E402,F401
from ._tensor import Tensor, empty_cuda  # noqa: E402,F401
from . import nn  # noqa: E402,F401
from . import optim  # noqa: E402,F401  (as torch's own __init__ does; torch.utils.data comes when the program asks)
from . import autograd  # noqa: E402,F401
from .autograd.grad_mode import no_grad, inference_mode  # noqa: E402,F401


class OutOfMemoryError(RuntimeError):
    pass

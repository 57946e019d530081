"""PyTorch's grad mode, as far as the bridge sees it: `no_grad` and `inference_mode`, as context managers and as
decorators (each call of a decorated function enters a fresh scope, as `_DecoratorContextManager` does), over a
per-thread state that `torch.is_grad_enabled()` and `torch.is_inference_mode_enabled()` read."""

import threading

import torch

_tls = threading.local()


def is_grad_enabled():
    return getattr(_tls, "grad", True)


def is_inference_mode_enabled():
    return getattr(_tls, "inference", False)


from torch.utils._contextlib import _Decorating  # noqa: E402

class no_grad(_Decorating):
    def __init__(self):
        self._args = ()
        self.prev = False

    def __enter__(self):
        self.prev = is_grad_enabled()
        _tls.grad = False

    def __exit__(self, *exc):
        _tls.grad = self.prev


class inference_mode(_Decorating):
    def __init__(self, mode=True):
        self._args = (mode,)
        self.mode = mode

    def __enter__(self):
        self.prev = (is_grad_enabled(), is_inference_mode_enabled())
        if self.mode:
            _tls.grad = False
            _tls.inference = True

    def __exit__(self, *exc):
        _tls.grad, _tls.inference = self.prev


torch.is_grad_enabled = is_grad_enabled
torch.is_inference_mode_enabled = is_inference_mode_enabled

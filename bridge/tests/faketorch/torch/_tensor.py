"""Tensors, storages and autograd nodes as the bridge's holders walk reads them: metadata only (is_cuda,
untyped_storage().data_ptr()/nbytes(), requires_grad, grad_fn, grad), no allocator behind them."""

import itertools

_ptrs = itertools.count(1 << 44, 1 << 24)


class UntypedStorage(object):
    def __init__(self, nbytes, ptr=None):
        self._nbytes = nbytes
        self._ptr = next(_ptrs) if ptr is None else ptr

    def data_ptr(self):
        return self._ptr

    def nbytes(self):
        return self._nbytes


class Tensor(object):
    """`Tensor(nbytes)` is a CUDA tensor of its own storage; `view()` shares it; device="cpu" is not CUDA."""

    def __init__(self, nbytes=4, device="cuda:0", storage=None, requires_grad=False, grad_fn=None):
        self._storage = storage if storage is not None else UntypedStorage(nbytes)
        self.is_cuda = device.startswith("cuda")
        self._device = int(device.split(":")[1]) if ":" in device else (0 if self.is_cuda else -1)
        self.requires_grad = requires_grad or grad_fn is not None
        self.grad_fn = grad_fn
        self._grad = None

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def grad(self):
        if not self.is_leaf:
            # PyTorch's own warning (TensorBody.h): the bridge must never trigger it.
            import warnings

            warnings.warn(
                "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed.",
                UserWarning,
                stacklevel=2,
            )
        return self._grad

    @grad.setter
    def grad(self, value):
        self._grad = value

    def untyped_storage(self):
        return self._storage

    def get_device(self):
        return self._device

    def element_size(self):
        return 4

    def nelement(self):
        return self._storage.nbytes() // 4

    def view(self):
        return Tensor(device="cuda:%d" % self._device if self.is_cuda else "cpu", storage=self._storage)


class Parameter(Tensor):
    def __init__(self, nbytes=4, device="cuda:0"):
        Tensor.__init__(self, nbytes, device, requires_grad=True)


class Node(object):
    """An autograd node: `next_functions` as ((node, index), ...); saved tensors as `_saved_*` attributes,
    which raise once `release()` (backward) freed them."""

    def __init__(this, next_nodes=(), **saved):  # `this`: a node saves its `self` operand as `_saved_self`
        this.next_functions = tuple((n, 0) for n in next_nodes)
        this._vals = {"_saved_" + k: v for k, v in saved.items()}
        this._released = False

    def release(self):
        self._released = True

    def name(self):
        return type(self).__name__


def _saved(name):
    def get(self):
        if self._released:
            raise RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                               "tensors after they have already been freed)")
        return self._vals.get(name)

    return property(get)


class AddBackward0(Node):
    _saved_alpha = _saved("_saved_alpha")


class MulBackward0(Node):
    _saved_self = _saved("_saved_self")
    _saved_other = _saved("_saved_other")


class CatBackward0(Node):
    _saved_tensors = _saved("_saved_tensors")  # a tuple of tensors


class AccumulateGrad(Node):
    def __init__(self, variable):
        Node.__init__(self)
        self.variable = variable


class _Backed(Tensor):
    """A CUDA tensor whose bytes come from the stand-in caching allocator (cuda.empty), so allocated and reserved
    move with it and the driver sees its segments; freed when the object goes."""

    def __init__(self, nbytes, device=0, requires_grad=False, grad_fn=None):
        from . import cuda

        block = cuda.empty(nbytes, device)
        Tensor.__init__(self, device="cuda:%d" % device, storage=UntypedStorage(nbytes, block[0]),
                        requires_grad=requires_grad, grad_fn=grad_fn)
        self._block = block

    def __del__(self):
        try:
            from . import cuda

            cuda.release(self._block, self._device)
        except Exception:
            pass


def empty_cuda(nbytes, device=0, requires_grad=False, grad_fn=None):
    """`torch.empty(n, device="cuda")`, for end-to-end programs on the simulated driver."""
    return _Backed(nbytes, device, requires_grad, grad_fn)

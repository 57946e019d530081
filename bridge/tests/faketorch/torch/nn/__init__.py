from .._tensor import Parameter  # noqa: F401


class Module(object):
    """Parameters, buffers and submodules in their own dicts, as torch.nn.Module keeps them."""

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for d in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[d]:
                return self.__dict__[d][name]
        raise AttributeError(name)

    def register_buffer(self, name, tensor):
        self._buffers[name] = tensor

    def cuda(self):
        """As torch's `_apply`: each parameter moved under its own `torch.no_grad()` scope."""
        import torch

        for m in [self] + list(self._modules.values()):
            for _name in list(m._parameters):
                with torch.no_grad():
                    pass
        return self

    def parameters(self):
        for p in self._parameters.values():
            yield p
        for m in self._modules.values():
            for p in m.parameters():
                yield p

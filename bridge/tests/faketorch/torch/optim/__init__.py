from .optimizer import Optimizer  # noqa: F401


class SGD(Optimizer):
    pass


class Adam(Optimizer):
    pass

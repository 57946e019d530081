from . import grad_mode  # noqa: F401

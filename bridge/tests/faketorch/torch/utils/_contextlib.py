"""PyTorch's decorator machinery for its context managers (torch/utils/_contextlib.py): a decorated function's
every call enters a fresh scope from here, as `_DecoratorContextManager` does."""

import functools


class _Decorating(object):
    def __call__(self, func):
        @functools.wraps(func)
        def decorate_context(*args, **kwargs):
            with self.__class__(*self._args):
                return func(*args, **kwargs)

        return decorate_context

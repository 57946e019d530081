import collections

_global_optimizer_post_hooks = collections.OrderedDict()


def register_optimizer_step_post_hook(hook):
    """PyTorch >= 2.0: hook(optimizer, args, kwargs) after every optimizer's step()."""
    key = len(_global_optimizer_post_hooks)
    _global_optimizer_post_hooks[key] = hook
    return key


class Optimizer(object):
    def __init__(self, params):
        self.param_groups = [{"params": list(params), "lr": 0.1}]
        self.state = collections.defaultdict(dict)

    def step(self, *args, **kwargs):
        out = self._step()
        for hook in list(_global_optimizer_post_hooks.values()):
            hook(self, args, kwargs)
        return out

    def _step(self):
        from .._tensor import Tensor

        for g in self.param_groups:
            for p in g["params"]:
                s = self.state[p]
                if not s:  # the state is made at the first step, and kept
                    n = p.untyped_storage().nbytes()
                    s["exp_avg"] = Tensor(n)
                    s["exp_avg_sq"] = Tensor(n)

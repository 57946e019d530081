"""A parent that imports torch but never initialises CUDA, and children that do: one forked, one spawned
(multiprocessing), each allocating 64 MiB through the fake torch. Prints each child's pid."""
import multiprocessing as mp
import sys

import torch  # noqa: F401  (the bridge's import hook sees it in the parent; fork children inherit it)


def child(q):
    import torch

    t = torch.cuda.empty(64 << 20)
    q.put(__import__("os").getpid())
    torch.cuda.release(t)


if __name__ == "__main__":
    pids = []
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        pids.append(q.get(timeout=60))
        p.join(60)
        if p.exitcode != 0:
            sys.exit(10 + (p.exitcode or 0))
    print("children", *pids)

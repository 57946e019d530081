"""Training steps on the stand-in torch that keep each step's output in a global list (`kept`), under a cap:
the bridge counts the optimizer's steps, reads allocated bytes at each step's boundary and, at the
out-of-memory error, walks what holds the tensors. argv: MiB kept a step (0: 512 bytes), steps, ms a step, mode
(`keep` or `small`: the list; `steady`: nothing kept; `graph`: a running total of losses that keeps each step's
graph)."""

import sys
import time

import torch

kept_mib, steps, step_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "keep"
MIB = 1 << 20

torch.cuda.init()
weights = torch.empty_cuda(64 * MIB)
model = torch.nn.Module()
model.weight = torch.nn.Parameter(4)
opt = torch.optim.SGD([model.weight])
kept = []
total = None


def step(i):
    global total
    act = torch.empty_cuda(96 * MIB)  # the step's activations, freed at its end
    out = torch.empty_cuda(kept_mib * MIB if kept_mib else 512)
    if mode in ("keep", "small"):  # small: MIB 0, a 512-byte tensor a step (a loss kept without .item())
        kept.append(out)
    elif mode == "graph":
        # total = total + loss, without no_grad: the loss's node saved the step's output, and the chain of
        # additions keeps every step's graph.
        loss = torch._tensor.MulBackward0(self=out)
        prev = () if total is None else (total.grad_fn,)
        total = torch.empty_cuda(512, grad_fn=torch._tensor.AddBackward0(next_nodes=prev + (loss,)))
    time.sleep(step_ms / 1000.0)
    del act
    opt.step()


try:
    for i in range(steps):
        step(i)
except torch.OutOfMemoryError as e:
    print("OOM after", len(kept), "kept:", e, file=sys.stderr)
    sys.exit(3)
print("done", len(kept))

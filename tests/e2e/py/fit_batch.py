"""A training loop on the stand-in torch whose memory follows its batch, for `vramtrace fit`: 64 MiB of
weights, and each step two layers' activations and an output of 1 MiB per sample each, freed at the step's end. It runs until something stops it (the program has no steps flag of its own).

argv: --batch N [--mode plain|paths|nostep|loader]
- paths: past a batch of 12 the step also asks a 16 MiB workspace from a line of its own (a library choosing
  another kernel by size);
- nostep: the same work with no optimizer and no DataLoader, for ever;
- loader: no optimizer, the steps are a DataLoader's batches (an evaluation loop);
- paths100: the workspace of `paths` past a batch of 100 (a path the first pair does not take, the answer does);
- late: past a batch of 250 the step also holds a 100 MiB buffer, which runs below 250 cannot show;
- cudnn: past a batch of 200 each step first asks a 2 GiB workspace and, refused, goes on without one (cuDNN
  trying its next algorithm: PyTorch raises the error and catches it itself)."""

import sys
import time

import torch

args = sys.argv[1:]
batch = int(args[args.index("--batch") + 1])
mode = args[args.index("--mode") + 1] if "--mode" in args else "plain"
MIB = 1 << 20

torch.cuda.init()
weights = torch.empty_cuda(64 * MIB)
model = torch.nn.Module()
model.weight = torch.nn.Parameter(4)
opt = torch.optim.SGD([model.weight])


def layer(x):
    """A layer's output, whose graph saves its input, as a training step's forward does."""
    return torch.empty_cuda(batch * MIB, grad_fn=torch._tensor.MulBackward0(self=x))


def step():
    # The input and two layers' outputs, 1 MiB a sample each.
    out = layer(layer(torch.empty_cuda(batch * MIB)))
    if (mode == "paths" and batch > 12) or (mode == "paths100" and batch > 100):
        ws = torch.empty_cuda(16 * MIB)
        del ws
    if mode == "cudnn" and batch > 200:
        try:
            ws = torch.empty_cuda(2048 * MIB)
            del ws
        except torch.OutOfMemoryError:
            pass
    if mode == "late" and batch > 250:
        big = torch.empty_cuda(100 * MIB)
        del big
    time.sleep(0.005)
    del out


if mode == "loader":
    from torch.utils.data import DataLoader

    for _ in DataLoader(range(10 ** 9)):
        step()
else:
    while True:
        step()
        if mode != "nostep":
            opt.step()

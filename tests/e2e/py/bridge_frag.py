"""One large cached segment carved into tensors, every other one freed, then a request no free block can serve
(the issue's fragmentation case, on the fake torch of bridge/tests/faketorch and the simulated driver).
Exits 3 after PyTorch's OutOfMemoryError, as a training script that does not catch it would fail."""
import sys

import torch

GiB = 1 << 30


def carve():
    big = torch.cuda.empty(10 * GiB)
    torch.cuda.release(big)
    return [torch.cuda.empty(GiB) for _ in range(10)]  # the line that keeps the tensors


kept = carve()
for t in kept[::2]:
    torch.cuda.release(t)
try:
    torch.cuda.empty(8 * GiB)
except torch.OutOfMemoryError:
    sys.exit(3)

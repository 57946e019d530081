"""A parent that initialised CUDA (through the fake torch) forks a child that exits normally: the child's copy of
the allocator's figures is the parent's, so the bridge must say nothing for it. Prints the child's pid."""
import os
import sys

import torch

t = torch.cuda.empty(256 << 20)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # atexit handlers inherited from the parent run here
os.waitpid(pid, 0)
print("child", pid)
torch.cuda.release(t)

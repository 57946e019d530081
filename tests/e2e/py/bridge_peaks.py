"""A step's activations that live between two of the bridge's samples (allocated and freed in microseconds), on
the fake torch of bridge/tests/faketorch: PyTorch's own peak counter has them, the samples cannot. With `reset`
the program then takes its counter back (torch.cuda.reset_peak_memory_stats(), as benchmarks and per-epoch
reports do) before the sampler looks again. Prints PyTorch's figures as `PEAK allocated reserved`.
    python3 bridge_peaks.py plain|reset"""
import sys
import time

import torch

MiB = 1 << 20

base = torch.cuda.empty(64 * MiB)
time.sleep(0.1)  # the sampler has seen the weights
t = torch.cuda.empty(448 * MiB)  # the activations
torch.cuda.release(t)
print("PEAK", torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), flush=True)
if sys.argv[1] == "reset":
    torch.cuda.reset_peak_memory_stats()
time.sleep(0.1)

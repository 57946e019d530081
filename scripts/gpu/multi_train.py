"""A DDP training job for scripts/gpu/multi.sh: one process a GPU (torchrun), NCCL all-reduce, a few steps.
Each rank prints `RESULT rank=R device=D reserved=N allocated=N total=N free=N` (its own figures, with
torch.cuda.mem_get_info(), i.e. what the cap makes the driver report), and with --oom-rank R that rank then
allocates 1 GiB tensors until torch.OutOfMemoryError (printed as `OOM rank=R held=N`)."""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--oom-rank", type=int, default=-1)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    free0, total0 = torch.cuda.mem_get_info()
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(6)]).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for _ in range(a.steps):
        x = torch.randn(512, a.width, device="cuda")
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    dist.barrier()
    print(f"RESULT rank={rank} device={local} reserved={torch.cuda.max_memory_reserved()} "
          f"allocated={torch.cuda.max_memory_allocated()} total={total0} free={free0}", flush=True)
    if rank == a.oom_rank:
        held = []
        try:
            while True:
                held.append(torch.empty(1 << 28, dtype=torch.float32, device="cuda"))  # 1 GiB
        except torch.OutOfMemoryError:
            print(f"OOM rank={rank} held={len(held)} reserved={torch.cuda.max_memory_reserved()}", flush=True)
        del held
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

"""Step times of data-parallel training on one machine (scripts/gpu-check.sh
runs it): fpt.torch.DistributedOptimizer (under fptrun), DDP over gloo, and
the step without communication, for an MLP of --params parameters on
DEVICE (cuda, else cpu).

    fptrun -np 2 python gpu_bench.py fpt      # a worker of fpt's run
    python gpu_bench.py ddp --workers 2       # spawns DDP's processes
    python gpu_bench.py none                  # one process, no exchange

Each prints one line "RESULT <system> <workers> <ms per step>" (worker 0
for fpt and DDP); fpt also prints "PINNED <ms> <share>": the pinned copies
of the gradients (to host and back) timed alone, and their share of fpt's step.
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

DEVICE = torch.device(os.environ.get("DEVICE", "cuda" if torch.cuda.is_available() else "cpu"))


def model(params):
    """An MLP of about params parameters: width w, 4 layers of w x w."""
    w = max(16, int((params / 4) ** 0.5))
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                         nn.Linear(w, w)).to(DEVICE), w


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def timed(m, opt, w, steps, warmup, batch):
    x = torch.randn(batch, w, device=DEVICE)
    y = torch.randn(batch, w, device=DEVICE)
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    sync()
    return 1e3 * (time.perf_counter() - t0) / steps


def pinned_copies(m, reps=10):
    """ms to copy every gradient to a pinned host buffer and back."""
    n = sum(p.numel() for p in m.parameters())
    dev = torch.empty(n, device=DEVICE)
    host = torch.empty(n, pin_memory=DEVICE.type == "cuda")
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        host.copy_(dev, non_blocking=True)
        dev.copy_(host, non_blocking=True)
    sync()
    return 1e3 * (time.perf_counter() - t0) / reps


def run_fpt(a):
    import fpt
    import fpt.torch

    fpt.start()
    m, w = model(a.params)
    opt = fpt.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4), m.named_parameters(),
                                         bucket_bytes=a.bucket_bytes,
                                         compression=None if a.compression == "none" else a.compression)
    fpt.torch.broadcast_parameters(m.state_dict())
    ms = timed(m, opt, w, a.steps, a.warmup, a.batch)
    if fpt.rank() == 0:
        label = "fpt" if a.compression == "none" else "fpt+" + a.compression
        print("RESULT %s %d %.2f %d" % (label, fpt.num_workers(), ms, sum(p.numel() for p in m.parameters())),
              flush=True)
        pc = pinned_copies(m)
        print("PINNED %.2f %.3f" % (pc, pc / ms), flush=True)
    fpt.finalize()


def ddp_worker(rank, a, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // a.workers))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=a.workers)
    m, w = model(a.params)
    ddp = DDP(m, device_ids=[DEVICE.index or 0] if DEVICE.type == "cuda" else None)
    ms = timed(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4), w, a.steps, a.warmup, a.batch)
    if rank == 0:
        print("RESULT ddp-gloo %d %.2f %d" % (a.workers, ms, sum(p.numel() for p in m.parameters())), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("system", choices=["fpt", "ddp", "none"])
    p.add_argument("--workers", type=int, default=2, help="DDP's processes")
    p.add_argument("--params", type=int, default=21_000_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-bytes", type=int, default=25 << 20)
    p.add_argument("--compression", default="none", choices=["none", "bf16", "fp16"])
    a = p.parse_args()
    if a.system == "fpt":
        run_fpt(a)
    elif a.system == "ddp":
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(ddp_worker, args=(a, port), nprocs=a.workers)
    else:
        m, w = model(a.params)
        ms = timed(m, torch.optim.SGD(m.parameters(), lr=1e-4), w, a.steps, a.warmup, a.batch)
        print("RESULT none 1 %.2f %d" % (ms, sum(p.numel() for p in m.parameters())), flush=True)


if __name__ == "__main__":
    sys.exit(main())

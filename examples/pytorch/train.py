"""Trains the example's convolutional network on a synthetic dataset with
fpt: each worker takes its share of every batch, DistributedOptimizer
averages the gradients over the workers.

    fptrun -np 2 --servers 2 python examples/pytorch/train.py --epochs 3

prints each epoch's loss, throughput and time per step. --compression bf16
(or fp16) sends the gradients as 16-bit values; --compression both trains
the model twice in the same run, without and then with the bf16 wire,
from the same start, and prints both loss curves and step times. --device
cuda trains on the GPU (every worker on cuda:0, or on --device cuda:N).
--single trains the same model on
whole batches in one process, without fpt (the reference the tests
compare with). --hash prints a hash of the parameters after every step,
--save writes them (float32 or float64, native order, in
model.parameters() order) to a file ({rank} in the name is replaced).
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Net, dataset  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096, help="dataset size")
    p.add_argument("--batch", type=int, default=128, help="global batch, split over the workers")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--width", type=int, default=1, help="channel multiplier")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--single", action="store_true", help="one process on whole batches, no fpt")
    p.add_argument("--compression", default="none", choices=["none", "bf16", "fp16", "both"],
                   help="the gradients' wire type (both: none, then bf16, in one run)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--hash", action="store_true", help="print the parameters' hash after every step")
    p.add_argument("--save", help="write the final parameters here ({rank} is replaced)")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    device = torch.device(a.device)
    wires = ["none", "bf16"] if a.compression == "both" else [a.compression]
    rank, workers = 0, 1
    if not a.single:
        import fpt
        import fpt.torch

        fpt.start()
        rank, workers = fpt.rank(), fpt.num_workers()
    # Every run's model and optimizer are made before any trains: fpt's keys
    # are all declared before the first push.
    runs = []
    for wire in wires:
        torch.manual_seed(a.seed)
        model = Net(a.width).to(dtype).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
        if not a.single:
            opt = fpt.torch.DistributedOptimizer(opt, model.named_parameters(),
                                                 compression=None if wire == "none" else wire)
            fpt.torch.broadcast_parameters(model.state_dict(), root_rank=0)
            fpt.torch.broadcast_optimizer_state(opt, root_rank=0)
        runs.append((wire, model, opt))
    if a.batch % workers:
        sys.exit("train.py: --batch %d is not a multiple of the %d workers" % (a.batch, workers))
    x, y = dataset(a.samples, a.seed, dtype=dtype)
    x, y = x.to(device), y.to(device)
    share = a.batch // workers
    print("rank %d of %d: %d parameters, batch %d (%d here), %d samples, on %s"
          % (rank, workers, sum(q.numel() for q in runs[0][1].parameters()), a.batch, share, a.samples, device),
          flush=True)
    for wire, model, opt in runs:
        train(a, model, opt, x, y, rank, share, "" if len(runs) == 1 else " [wire %s]" % wire)
    model = runs[-1][1]
    if a.save:
        flat = torch.cat([q.detach().cpu().reshape(-1) for q in model.parameters()])
        flat.numpy().tofile(a.save.replace("{rank}", str(rank)))
    if not a.single:
        fpt.finalize()


def train(a, model, opt, x, y, rank, share, label):
    step = 0
    done = False
    cuda = x.is_cuda
    for epoch in range(1, a.epochs + 1):
        if cuda:
            torch.cuda.synchronize()
        start, total, batches = time.perf_counter(), 0.0, 0
        for b in range(0, a.samples - a.batch + 1, a.batch):
            lo = b + rank * share  # this worker's disjoint share of the batch
            loss = F.cross_entropy(model(x[lo:lo + share]), y[lo:lo + share])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            total += loss.item()
            batches += 1
            if a.hash:
                h = hashlib.sha256(b"".join(q.detach().cpu().numpy().tobytes() for q in model.parameters()))
                print("step %d loss %.6f params %s" % (step, loss.item(), h.hexdigest()[:16]), flush=True)
            if a.steps and step >= a.steps:
                done = True
                break
        if cuda:
            torch.cuda.synchronize()
        secs = time.perf_counter() - start
        print("epoch %d: loss %.4f, %.0f samples/s, %.2f ms per step (rank %d)%s"
              % (epoch, total / max(batches, 1), batches * a.batch / secs, 1e3 * secs / max(batches, 1), rank, label),
              flush=True)
        if done:
            break


if __name__ == "__main__":
    main()

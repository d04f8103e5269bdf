"""fpt against what a PyTorch user would pick instead: the example's model
and data, 2 workers on this machine, trained with fpt (fptrun, 2 servers,
DistributedOptimizer) and with torch.nn.parallel.DistributedDataParallel
over gloo, one after the other in the same run:

    python examples/pytorch/compare.py [--steps 40] [--width 1] [--repeat 3]

In an emulated network (root; one host per worker, each with a server,
the scheduler and gloo's rendezvous on host 0), each host prints its own
figures:

    FPT_CLUSTER_SECRET=$(openssl rand -hex 16) bin/fpt netem --hosts 1gbit,100mbit -- \
        /usr/bin/python3 examples/pytorch/compare.py --netem-host --width 8

prints, per system, the time per step and the communication time per step:
the step time minus the time of the same step without communication (a
copy of the model trained locally in the same process, interleaved with
the distributed steps), averaged over the workers.
"""

import argparse
import copy
import os
import re
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import Net, dataset  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))


def timed_steps(dist_model, dist_opt, local_model, local_opt, x, y, a, rank, workers):
    """Alternates a distributed step and a local one over the same batch
    share; returns (ms per distributed step, ms per local step) after the
    warm-up."""
    share = a.batch // workers
    dist, local = [], []
    for i in range(a.warmup + a.steps):
        b = (i * a.batch) % (a.samples - a.batch + 1)
        xs, ys = x[b + rank * share:b + (rank + 1) * share], y[b + rank * share:b + (rank + 1) * share]
        for model, opt, out in ((dist_model, dist_opt, dist), (local_model, local_opt, local)):
            t = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(xs), ys).backward()
            opt.step()
            if i >= a.warmup:
                out.append(time.perf_counter() - t)
    return 1e3 * statistics.mean(dist), 1e3 * statistics.mean(local)


def worker(a):
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = Net(a.width)
    local = copy.deepcopy(model)
    x, y = dataset(a.samples, a.seed)
    if a.role == "fpt":
        import fpt
        import fpt.torch

        fpt.start()
        rank, workers = fpt.rank(), fpt.num_workers()
        opt = fpt.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters())
        fpt.torch.broadcast_parameters(model.state_dict())
    else:
        import torch.distributed as dist

        rank, workers = a.rank, 2
        dist.init_process_group("gloo", init_method="tcp://%s" % a.master, rank=rank, world_size=workers)
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step_ms, local_ms = timed_steps(model, opt, local, torch.optim.SGD(local.parameters(), lr=0.01), x, y, a,
                                    rank, workers)
    print("RESULT %s rank=%d step_ms=%.3f local_ms=%.3f" % (a.role, rank, step_ms, local_ms), flush=True)
    if a.role == "fpt":
        fpt.finalize()
    else:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RESULT = re.compile(r"RESULT (\w+) rank=(\d) step_ms=([0-9.]+) local_ms=([0-9.]+)")


def collect(out, role):
    rows = [(float(m.group(3)), float(m.group(4))) for m in RESULT.finditer(out) if m.group(1) == role]
    if len(rows) != 2:
        sys.exit("compare.py: %s run gave %d results, want 2:\n%s" % (role, len(rows), out[-4000:]))
    step = statistics.mean(r[0] for r in rows)
    return step, step - statistics.mean(r[1] for r in rows)


def run_gloo(me, flags):
    master = "127.0.0.1:%d" % free_port()
    procs = [subprocess.Popen([sys.executable, me, "--role", "gloo", "--rank", str(r), "--master", master] + flags,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    out = "".join(pr.communicate()[0] for pr in procs)
    if any(pr.returncode for pr in procs):
        sys.exit("compare.py: the gloo run failed:\n" + out[-4000:])
    return out


def run_fpt(me, flags):
    env = dict(os.environ, FPT_PYTHON=sys.executable, PS_VERBOSE=os.environ.get("PS_VERBOSE", "0"))
    run = subprocess.run([os.path.join(REPO, "scripts", "fptrun"), "-np", "2", "--servers", "2", "python", me,
                          "--role", "fpt"] + flags, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode:
        sys.exit("compare.py: the fpt run failed:\n" + run.stdout[-4000:])
    return run.stdout


def netem_host(a, me, flags, params):
    """This emulated host's share: a gloo worker of rank FPT_NETEM_HOST,
    then an fpt worker and server (and the scheduler on host 0)."""
    host, root, iface = int(os.environ["FPT_NETEM_HOST"]), os.environ["FPT_NETEM_ROOT"], os.environ["FPT_NETEM_IFACE"]
    gloo = subprocess.run([sys.executable, me, "--role", "gloo", "--rank", str(host), "--master", root + ":29500"] +
                          flags, env=dict(os.environ, GLOO_SOCKET_IFNAME=iface),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if gloo.returncode:
        sys.exit("compare.py: the gloo run failed:\n" + gloo.stdout[-4000:])
    env = dict(os.environ, FPT_PYTHON=sys.executable, PS_VERBOSE="0", DMLC_INTERFACE=iface)
    run = subprocess.run([os.path.join(REPO, "scripts", "fptrun"), "--root", root + ":9091"] +
                         (["--scheduler"] if host == 0 else []) +
                         ["-s", "1", "-w", "1", "-np", "2", "--servers", "2", "python", me, "--role", "fpt"] + flags,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode:
        sys.exit("compare.py: the fpt run failed:\n" + run.stdout[-4000:])
    decisions = [ln for ln in run.stdout.splitlines() if "lb decision" in ln]
    for ln in decisions[-1:]:
        print(ln)
    for role, out in (("gloo", gloo.stdout), ("fpt", run.stdout)):
        m = RESULT.search(out)
        step, local = float(m.group(3)), float(m.group(4))
        print("host %d %-5s %.2f ms per step, %.2f ms communication per step (%d parameters)"
              % (host, role, step, step - local, params))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=1, help="channel multiplier of the model")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs of each system, alternated (the median is shown)")
    p.add_argument("--role", choices=["fpt", "gloo"], help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--netem-host", action="store_true",
                   help="run this host's share in fpt netem (see the doc)")
    a = p.parse_args()
    if a.role:
        return worker(a)
    flags = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--width", str(a.width), "--batch", str(a.batch),
             "--samples", str(a.samples), "--seed", str(a.seed)]
    me = os.path.abspath(__file__)
    params = sum(q.numel() for q in Net(a.width).parameters())

    if a.netem_host:
        return netem_host(a, me, flags, params)
    gloo, fpt = [], []
    for _ in range(a.repeat):  # alternated, so that both see the same load
        gloo.append(collect(run_gloo(me, flags), "gloo"))
        fpt.append(collect(run_fpt(me, flags), "fpt"))
    g_step, g_comm = (statistics.median(r[k] for r in gloo) for k in (0, 1))
    f_step, f_comm = (statistics.median(r[k] for r in fpt) for k in (0, 1))
    print("model: %d parameters (%.2f MB float32), batch %d over 2 workers, %d steps after %d warm-up, 1 thread each;"
          " median of %d alternated runs" % (params, params * 4 / 1e6, a.batch, a.steps, a.warmup, a.repeat))
    print("%-28s %12s %22s" % ("", "ms per step", "communication ms/step"))
    print("%-28s %12.2f %22.2f" % ("DDP over gloo (2 procs)", g_step, g_comm))
    print("%-28s %12.2f %22.2f" % ("fpt (2 workers, 2 servers)", f_step, f_comm))
    print("fpt / gloo: step time %.2fx, communication %.2fx" % (f_step / g_step, f_comm / g_comm if g_comm > 0 else
                                                                 float("nan")))


if __name__ == "__main__":
    main()

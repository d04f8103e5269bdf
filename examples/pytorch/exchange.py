"""One data-parallel step's gradient exchange, fpt against gloo: W workers
on this machine each hold a step's gradients of a given size, cut into
DDP's 25 MB buckets, and exchange them (fpt: fptrun with W servers, one
fpt.push_pull of every bucket, then a wait; gloo: an asynchronous
torch.distributed.all_reduce per bucket, then a wait). Every value a worker
gets back is checked exactly. For each size and worker count, one run of
each system, alternated, prints the median and 90th percentile of a step's
exchange time on worker 0, beside those of the floor: the same exchange
through plain TCP sockets to worker 0, which sums with torch and sends the
sums back (no library, one socket per worker: what the machine's cores and
loopback allow a step in Python):

    python examples/pytorch/exchange.py [--sizes 4K,1M,25M,100M] [--workers 2,4] [--steps 30] [--warmup N] [--json]
                                        [--network] [--bind-cores]

fpt runs as fptrun runs a job on one machine: its workers sum on their
host (FPT_LOCAL_AGGREGATION=auto), and the LB sums every partition on the
group's leader, in shared memory, while that measures no slower than the
even split over the servers (docs/local-aggregation.md, "One host").
With --network every worker's push goes over loopback to the servers
instead (FPT_LOCAL_AGGREGATION=off), as between machines. With
--bind-cores every system's workers are bound alike, each to its own
slice of the cores (fptrun --bind-cores; gloo's and the floor's ranks to
the same slices).

With --breakdown, fpt runs alone, traced (FPT_TRACE_FILE, and worker 0's
own step spans), and each size prints where worker 0's steps spent their
time: bin/fpt trace breakdown over the run's trace files (docs/latency.md).
"""

import argparse
import glob
import json
import os
import re
import socket
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import REPO, free_port  # noqa: E402

BUCKET = 25 * 10**6  # DDP's default bucket_cap_mb


def parse_size(s):
    """'4K', '1M', '25M', '100M' or a byte count: bytes, a multiple of 4."""
    units = {"K": 1 << 10, "M": 10**6, "G": 10**9}
    s = s.strip().upper()
    n = int(float(s[:-1]) * units[s[-1]]) if s and s[-1] in units else int(s)
    if n <= 0:
        raise argparse.ArgumentTypeError("size %r is not positive" % s)
    return n - n % 4 or 4


def buckets(nbytes):
    """The float32 element counts of a step's buckets."""
    elems, out = nbytes // 4, []
    while elems > 0:
        out.append(min(elems, BUCKET // 4))
        elems -= out[-1]
    return out


def check(bufs, workers, step):
    """Every worker pushed rank+1+step: the sum is exact in float32."""
    want = workers * (workers + 1) // 2 + workers * step
    for b in bufs:
        if not bool((b == want).all()):
            bad = (b != want).nonzero()[0].item()
            sys.exit("exchange.py: step %d: element %d is %r, want %d" % (step, bad, b[bad].item(), want))


def worker(a):
    torch.set_num_threads(1)
    sizes = buckets(a.bytes)
    grads = [torch.empty(n) for n in sizes]
    sums = [torch.empty(n) for n in sizes]
    times = []
    if a.system == "fpt":
        import fpt

        fpt.start()
        rank, workers = fpt.rank(), fpt.num_workers()
        keys = list(range(len(sizes)))
        for k, n in zip(keys, sizes):
            fpt.declare(k, 4 * n, fpt.FLOAT32, priority=-k)
        for k, g in zip(keys, grads):
            g.zero_()
            fpt.init(k, g)
        spans = []  # (iteration, Unix µs, µs): --breakdown's step spans
        for step in range(a.warmup + a.steps):
            for g in grads:
                g.fill_(rank + 1 + step)
            wall, t = time.time_ns() // 1000, time.perf_counter()
            fpt.wait_all([fpt.push_pull(k, g, s, priority=-k) for k, g, s in zip(keys, grads, sums)])
            if step >= a.warmup:
                times.append(time.perf_counter() - t)
                spans.append((step + 1, wall, round(1e6 * times[-1])))  # iteration 0 is the init round
            check(sums, workers, step)
        if a.trace_dir and rank == 0:
            write_steps(os.path.join(a.trace_dir, "steps-worker0.json"), fpt.my_id(), spans)
    elif a.system == "tcp":
        rank, workers = a.rank, a.workers
        times = tcp_steps(a, rank, workers, grads, sums)
    else:
        import torch.distributed as dist

        rank, workers = a.rank, a.workers
        dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=rank, world_size=workers)
        for step in range(a.warmup + a.steps):
            for g in grads:
                g.fill_(rank + 1 + step)
            t = time.perf_counter()
            for w in [dist.all_reduce(g, async_op=True) for g in grads]:
                w.wait()
            if step >= a.warmup:
                times.append(time.perf_counter() - t)
            check(grads, workers, step)
    if rank == 0:
        print("RESULT %s %s" % (a.system, ",".join("%.4f" % (1e3 * t) for t in times)), flush=True)
    if a.system == "fpt":
        fpt.finalize()
    elif a.system == "gloo":
        dist.destroy_process_group()


def tcp_steps(a, rank, workers, grads, sums):
    """The floor's steps: every other worker sends its buckets to worker 0
    over a TCP socket of its own; worker 0 sums them into its sums with
    torch and sends those back. Worker 0's times, in seconds."""
    host, port = a.master.rsplit(":", 1)

    def view(t):
        return memoryview(t.numpy()).cast("B")

    if rank == 0:
        with socket.create_server((host, int(port))) as srv:
            peers = [srv.accept()[0] for _ in range(workers - 1)]
        inbox = [[torch.empty_like(g) for g in grads] for _ in peers]
    else:
        peers = [tcp_connect(host, int(port))]
    for c in peers:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for step in range(a.warmup + a.steps):
        for g in grads:
            g.fill_(rank + 1 + step)
        t = time.perf_counter()
        if rank == 0:
            for c, bufs in zip(peers, inbox):
                for b in bufs:
                    recv_all(c, view(b))
            for i, (g, s) in enumerate(zip(grads, sums)):
                torch.add(g, inbox[0][i], out=s)
                for bufs in inbox[1:]:
                    s.add_(bufs[i])
            for c in peers:
                for s in sums:
                    c.sendall(view(s))
        else:
            for g in grads:
                peers[0].sendall(view(g))
            for s in sums:
                recv_all(peers[0], view(s))
        if step >= a.warmup:
            times.append(time.perf_counter() - t)
        check(sums, workers, step)
    for c in peers:
        c.close()
    return times


def tcp_connect(host, port, timeout=30):
    """A connection to worker 0's listener, which may not be up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def recv_all(c, mv):
    """Fills mv from c."""
    while mv:
        n = c.recv_into(mv)
        if n == 0:
            sys.exit("exchange.py: worker 0's peer closed its socket mid-step")
        mv = mv[n:]


def write_steps(path, node_id, spans):
    """Worker node_id's step spans as a trace file fpt trace breakdown and
    merge read: Unix microseconds, like the nodes' own."""
    pid = 1000000 + node_id
    evs = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": "steps of worker id %d" % node_id, "fpt_clock": "unix_us", "role": "step",
                     "node_id": node_id}}]
    evs += [{"name": "step", "cat": "fpt", "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 1,
             "args": {"iteration": it}} for it, ts, dur in spans]
    with open(path, "w") as f:
        json.dump(evs, f)


def breakdown(me, workers, flags, warmup, as_json, fpt_env):
    """One traced fpt run; prints fpt trace breakdown of worker 0's steps."""
    d = tempfile.mkdtemp(prefix="fpt-breakdown-")
    try:
        env = dict(fpt_env, FPT_TRACE_FILE=os.path.join(d, "trace-{role}{rank}.json"), FPT_TRACE_ITERS="%d-" % (warmup + 1))
        run(me, "fpt", workers, flags + ["--trace-dir", d], env)
        files = sorted(glob.glob(os.path.join(d, "*.json")))
        args = [os.path.join(REPO, "bin", "fpt"), "trace", "breakdown"] + (["-json"] if as_json else []) + files
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.exit("exchange.py: fpt trace breakdown failed:\n" + r.stdout)
        return r.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)


RESULT = re.compile(r"RESULT (\w+) ([0-9.,]+)")


def run(me, system, workers, flags, extra_env=None, cores=None):
    """One run of system with workers workers: worker 0's times in ms.
    cores, if given, is each rank's slice of the cores (fpt's: fptrun
    --bind-cores, which deals the same slices)."""
    if system in ("gloo", "tcp"):
        master = "127.0.0.1:%d" % free_port()
        procs = [subprocess.Popen([sys.executable, me, "--system", system, "--rank", str(r), "--workers",
                                   str(workers), "--master", master] + flags,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  preexec_fn=(lambda c=cores[r]: os.sched_setaffinity(0, c)) if cores else None)
                 for r in range(workers)]
        out = "".join(pr.communicate()[0] for pr in procs)
        failed = any(pr.returncode for pr in procs)
    else:
        env = dict(os.environ, FPT_PYTHON=sys.executable, PS_VERBOSE=os.environ.get("PS_VERBOSE", "0"),
                   **(extra_env or {}))
        r = subprocess.run([os.path.join(REPO, "scripts", "fptrun")] + (["--bind-cores"] if cores else []) + [
                            "-np", str(workers), "--servers", str(workers),
                            "python", me, "--system", "fpt", "--workers", str(workers)] + flags,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, failed = r.stdout, r.returncode != 0
    m = RESULT.search(out)
    if failed or m is None or m.group(1) != system:
        sys.exit("exchange.py: the %s run with %d workers failed:\n%s" % (system, workers, out[-4000:]))
    return [float(t) for t in m.group(2).split(",")]


def p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def warmup_steps(warmup, nbytes):
    """The untimed steps before a run's timed ones: warmup if set, else 20,
    or for small steps as many as move 128 MiB a worker, at most 200. On
    one host the LB times the even split over the servers over several of
    its reports (a worker's are 10 ms apart) before it moves every
    partition to the group's leader: 4 KiB steps take 40 to 110 of
    them."""
    if warmup is not None:
        return warmup
    return max(20, min(200, (128 << 20) // nbytes))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4K,1M,25M,100M", help="a step's gradient bytes, comma-separated")
    p.add_argument("--workers", default="2,4", help="worker counts, comma-separated")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int,
                   help="untimed steps first (default: 20, or as many as move 128 MiB a worker, at most 200: "
                        "the LB's first split takes effect within them)")
    p.add_argument("--json", action="store_true", help="one JSON object per row instead of a table")
    p.add_argument("--network", action="store_true",
                   help="fpt's workers push over loopback to the servers (FPT_LOCAL_AGGREGATION=off) "
                        "instead of summing on their host")
    p.add_argument("--bind-cores", action="store_true",
                   help="bind each worker of every system to its own slice of the cores (fptrun --bind-cores)")
    p.add_argument("--breakdown", action="store_true",
                   help="fpt only, traced: where worker 0's step time goes (fpt trace breakdown)")
    p.add_argument("--system", choices=["fpt", "gloo", "tcp"], help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=parse_size, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--trace-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.breakdown and a.bind_cores:
        p.error("--bind-cores binds the comparison's workers; --breakdown runs fpt alone, unbound")
    if a.system:
        a.workers = int(a.workers)
        a.warmup = warmup_steps(a.warmup, a.bytes)
        return worker(a)
    me = os.path.abspath(__file__)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    counts = [int(w) for w in a.workers.split(",")]
    fpt_env = {"FPT_LOCAL_AGGREGATION": "off" if a.network else "auto"}
    if a.breakdown:
        for workers in counts:
            for nbytes in sizes:
                warmup = warmup_steps(a.warmup, nbytes)
                flags = ["--bytes", str(nbytes), "--steps", str(a.steps), "--warmup", str(warmup)]
                out = breakdown(me, workers, flags, warmup, a.json, fpt_env)
                if a.json:
                    print(json.dumps(dict(json.loads(out), workers=workers, bytes=nbytes)), flush=True)
                else:
                    print("== %d workers, %d bytes a step" % (workers, nbytes))
                    print(out, flush=True)
        return
    if not a.json:
        print("worker 0's exchange of one step (ms), %d steps after the warm-up, one run each, alternated; "
              "tcp: the floor (plain sockets to worker 0)" % a.steps)
        print("%8s %12s %11s %9s %11s %9s %10s %9s %9s %8s" % (
            "workers", "bytes", "fpt median", "fpt p90", "gloo median", "gloo p90", "tcp median", "tcp p90",
            "fpt/gloo", "fpt/tcp"))
    if a.bind_cores:
        sys.path.insert(0, os.path.join(REPO, "python"))
        from fpt.run import core_slices
    for workers in counts:
        cores = core_slices(os.sched_getaffinity(0), workers) if a.bind_cores else None
        for nbytes in sizes:
            flags = ["--bytes", str(nbytes), "--steps", str(a.steps), "--warmup", str(warmup_steps(a.warmup, nbytes))]
            tcp = run(me, "tcp", workers, flags, cores=cores)
            gloo = run(me, "gloo", workers, flags, cores=cores)
            fpt = run(me, "fpt", workers, flags, fpt_env, cores=cores)
            row = {"workers": workers, "bytes": nbytes, "local_aggregation": fpt_env["FPT_LOCAL_AGGREGATION"],
                   "bind_cores": a.bind_cores}
            for name, times in (("fpt", fpt), ("gloo", gloo), ("tcp", tcp)):
                row[name + "_median_ms"] = round(statistics.median(times), 3)
                row[name + "_p90_ms"] = round(p90(times), 3)
            row["fpt_over_gloo"] = round(row["fpt_median_ms"] / row["gloo_median_ms"], 3)
            row["fpt_over_tcp"] = round(row["fpt_median_ms"] / row["tcp_median_ms"], 3)
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print("%8d %12d %11.2f %9.2f %11.2f %9.2f %10.2f %9.2f %9.2f %8.2f" % (
                    workers, nbytes, row["fpt_median_ms"], row["fpt_p90_ms"], row["gloo_median_ms"],
                    row["gloo_p90_ms"], row["tcp_median_ms"], row["tcp_p90_ms"], row["fpt_over_gloo"],
                    row["fpt_over_tcp"]), flush=True)


if __name__ == "__main__":
    main()

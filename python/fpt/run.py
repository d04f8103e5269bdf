"""fptrun: starts an fpt job on this machine, or prints each host's share
of one across machines.

    fptrun -np 2 --servers 2 python train.py --epochs 3

starts the scheduler and the servers (fpt's bin/fpt) and the workers (the
command) with the DMLC_* environment, a fresh FPT_CLUSTER_SECRET unless
one is given, and PYTHONPATH reaching this package. Each line of output
gets its process's name: [scheduler], [server0], [worker1] (a worker's
rank as fpt assigned it once the worker has started; [worker.i] before
that, i its launch index). When any process fails, the others are
stopped and fptrun exits non-zero; Ctrl-C stops them all. A worker that
fails under FPT_ON_WORKER_LOSS=continue or wait, or a server under
FPT_ON_SERVER_LOSS=retry, is the exception: the job goes on without it,
the others run to their end, and fptrun still exits non-zero.

A command starting with python or python3 runs the interpreter FPT_PYTHON
names; without it, the first python3 on PATH that imports torch, then
/usr/bin/python3 if that one does (Debian's python3-torch installs there),
else the first python3 on PATH.

Under a cluster engine (Slurm's srun, Open MPI's mpirun, a Kubernetes
Indexed Job or JobSet: SLURM_PROCID, OMPI_COMM_WORLD_RANK or
JOB_COMPLETION_INDEX set) fptrun runs this task's share only, as
`fpt run` maps the engine's tasks (docs/running.md): the command as a
worker, with RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, or a
server, or a server and the scheduler; -np, --servers, -s and -w are the
engine's then. Every task needs the same FPT_CLUSTER_SECRET (or
FPT_CLUSTER_SECRET_FILE).

    srun --nodes 2 --ntasks-per-node 5 fptrun python train.py

Across machines, as scripts/run_test.sh: the same --root HOST:PORT and
FPT_CLUSTER_SECRET on every host, --scheduler on one, -s/-w this host's
share, -np/--servers the whole job's sizes. --hosts h1,h2,... prints those
commands, one per host.

--bind-cores binds each worker started here to its own share of fptrun's
cores (os.sched_getaffinity: what taskset or a cgroup left it), cut into
as many contiguous slices as workers here, or one core each, dealt round
robin, where the workers outnumber the cores. A worker's threads (fpt's
and the program's) then wake each other on its own cores, and no other
worker's take their place; processes the worker starts (a DataLoader's)
inherit its share. The servers and the scheduler keep
every core. Under a cluster engine the engine binds (srun --cpu-bind).

    fptrun [-np W] [--servers S] [--root HOST:PORT] [--scheduler] [-s N] [-w N]
           [--secret S | --secret-file F] [--hosts H1,H2,...] [--port P]
           [--bind-cores] [--print-python] [--] command [args...]
"""

import argparse
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The scheduler and servers leave once every worker has finalized; this
# long after the last worker exited, they are stuck.
SERVE_AFTER_WORKERS = 60
# A worker whose program failed closes its connections before its process
# is gone (its threads end after its sockets close), so the scheduler may
# see the loss and exit first; a worker failing this long after the
# scheduler reported a failure (exited 1) is the one to name.
CULPRIT_GRACE = 2.0


def _repo():
    """The source tree this file is in (python/fpt/run.py)."""
    return os.path.normpath(os.path.join(HERE, "..", ".."))


def _imports_torch(python):
    try:
        return subprocess.run([python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_python(env=os.environ):
    """(interpreter, imports torch) by the documented rule: FPT_PYTHON,
    else the first of python3 on PATH and /usr/bin/python3 that imports
    torch, else python3 on PATH."""
    if env.get("FPT_PYTHON"):
        return env["FPT_PYTHON"], _imports_torch(env["FPT_PYTHON"])
    first = shutil.which("python3", path=env.get("PATH"))
    for cand in (first, "/usr/bin/python3"):
        if cand and os.path.exists(cand) and _imports_torch(cand):
            return cand, True
    return first or sys.executable, False


def find_fpt(env=os.environ):
    """bin/fpt (scheduler and servers): FPT_BIN, the one the wheel carries,
    the source tree's bin/fpt, or fpt on PATH."""
    if env.get("FPT_BIN"):
        return env["FPT_BIN"]
    packaged = os.path.join(HERE, "_native", "fpt")
    if os.path.exists(packaged):
        return packaged
    built = os.path.join(_repo(), "bin", "fpt")
    if os.path.exists(built):
        return built
    found = shutil.which("fpt")
    if found:
        return found
    raise SystemExit("fptrun: bin/fpt not found: run scripts/build.sh, or set FPT_BIN to fpt's path")


# A task of a cluster engine's job has one of these set (fpt run's
# mapping, launch/engine.Detect, reads the rest).
ENGINE_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "JOB_COMPLETION_INDEX")


def engine_task(env=os.environ):
    """The engine variable that makes this process a task of an engine's
    job, or None."""
    return next((v for v in ENGINE_VARS if env.get(v)), None)


def child_command(env, command):
    """The command a child runs, and env set for it: this package first on
    PYTHONPATH, and a command of "python" or "python3" run by the
    interpreter find_python picks (also named in FPT_PYTHON)."""
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE)] + [x for x in [env.get("PYTHONPATH")] if x])
    command = list(command)
    if os.path.basename(command[0]) in ("python", "python3"):
        command[0], _ = find_python(env)
        env["FPT_PYTHON"] = command[0]
    return command


def run_engine_task(a, secret):
    """Becomes `fpt run -- command`, which takes this task's role from the
    engine: the same bin/fpt and the same interpreter rule as fptrun's own
    jobs."""
    env = dict(os.environ)
    if secret:
        env["FPT_CLUSTER_SECRET"] = secret
        env.pop("FPT_CLUSTER_SECRET_FILE", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    command = child_command(env, a.command)
    fpt_bin = find_fpt(env)
    sys.stdout.flush()
    os.execve(fpt_bin, [fpt_bin, "run", "--"] + command, env)


def free_port():
    """A port free on loopback with the next one free too (the data port
    of a node sits next to its control port)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
            return port
        except OSError:
            continue
    raise SystemExit("fptrun: no free port pair found")


_ENV_HELP = """environment read:
  FPT_PYTHON            the interpreter for a command that starts with python
                        or python3 (default: the first python3 on PATH, then
                        /usr/bin/python3, that imports torch)
  FPT_BIN               the bin/fpt that runs the scheduler and servers
                        (default: the wheel's, else the source tree's)
  FPT_LIB               the libfpt.so the workers' fpt package loads (default:
                        the wheel's, else the source tree's build/lib)
  FPT_CLUSTER_SECRET, FPT_CLUSTER_SECRET_FILE
                        the job's secret (default: a new one per job)
  FPT_LOCAL_AGGREGATION a job started whole on this machine (no --root, no
                        cluster engine) defaults to auto: its workers sum on
                        the host, in shared memory; off sends every worker's
                        push over loopback to the servers
  every other DMLC_*, PS_* and FPT_* variable reaches every node unchanged:
  bin/fpt -h lists them"""


def parse(argv):
    p = argparse.ArgumentParser(prog="fptrun", description="Runs an fpt job (see fpt/run.py's doc).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_ENV_HELP,
                                usage=__doc__.split("    fptrun [", 1)[1].join(["fptrun [", ""]).strip())
    p.add_argument("-np", "--num-workers", dest="workers", type=int, default=None, help="workers in the job")
    p.add_argument("--servers", "--num-servers", dest="servers", type=int, default=None, help="servers in the job")
    p.add_argument("--root", help="the scheduler's HOST:PORT (default: 127.0.0.1 and a free port)")
    p.add_argument("--scheduler", action="store_true", help="run the scheduler here (with --root)")
    p.add_argument("-s", dest="here_servers", type=int, help="servers on this host (with --root)")
    p.add_argument("-w", dest="here_workers", type=int, help="workers on this host (with --root)")
    p.add_argument("--secret", help="the job's secret (default: FPT_CLUSTER_SECRET, else a new one)")
    p.add_argument("--secret-file", help="a file holding the job's secret")
    p.add_argument("--hosts", help="comma-separated hosts: print each one's fptrun command and exit")
    p.add_argument("--port", type=int, default=9091, help="the scheduler's port with --hosts (default 9091)")
    p.add_argument("--bind-cores", action="store_true",
                   help="bind each worker here to its own slice of fptrun's cores (servers and scheduler keep all)")
    p.add_argument("--print-python", action="store_true",
                   help="print the interpreter python commands run; exit 3 if it cannot import torch")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker's command")
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    env = os.environ
    if a.workers is None:
        a.workers = int(env.get("DMLC_NUM_WORKER", 2))
    if a.servers is None:
        a.servers = int(env.get("DMLC_NUM_SERVER", 2))
    if a.workers < 1 or a.servers < 1:
        p.error("-np and --servers must be at least 1")
    if not a.print_python and not a.command:
        p.error("no worker command given")
    if a.bind_cores and not hasattr(os, "sched_setaffinity"):
        p.error("--bind-cores needs os.sched_setaffinity (Linux)")
    if a.bind_cores and not a.hosts and a.root is None and engine_task():
        p.error("--bind-cores under a cluster engine (%s is set): the engine binds tasks (srun --cpu-bind)"
                % engine_task())
    return a


def core_slices(cores, n):
    """The cores of each of n workers under --bind-cores: cores, sorted,
    cut into n contiguous slices as even as can be (the first ones a core
    larger), or one core each, dealt round robin, where n is larger."""
    cores = sorted(cores)
    if n > len(cores):
        return [[cores[i % len(cores)]] for i in range(n)]
    size, larger = divmod(len(cores), n)
    out, at = [], 0
    for i in range(n):
        k = size + (1 if i < larger else 0)
        out.append(cores[at:at + k])
        at += k
    return out


def cpu_list(cores):
    """cores in the kernel's cpu-list form: 0-3,8."""
    runs = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)


def hosts_plan(a, secret):
    """The fptrun command of every host: the scheduler on the first,
    servers and workers dealt round robin."""
    hosts = [h for h in a.hosts.split(",") if h]
    servers = [0] * len(hosts)
    workers = [0] * len(hosts)
    for i in range(a.servers):
        servers[i % len(hosts)] += 1
    for i in range(a.workers):
        workers[i % len(hosts)] += 1
    root = a.root or "%s:%d" % (hosts[0], a.port)
    lines = []
    for i, h in enumerate(hosts):
        args = ["fptrun", "--root", root] + (["--scheduler"] if i == 0 else []) + [
            "-s", str(servers[i]), "-w", str(workers[i]), "-np", str(a.workers), "--servers", str(a.servers)] + (
            ["--bind-cores"] if a.bind_cores else []) + ["--"]
        lines.append("%s: FPT_CLUSTER_SECRET=%s %s" % (h, secret, " ".join(shlex.quote(x) for x in args + a.command)))
    return lines


class Job:
    """The processes of this host's share, their output and their end."""

    def __init__(self):
        self.procs = []  # (name, Popen)
        self.lock = threading.Lock()
        self.readers = {}  # pid -> the threads copying its output

    def start(self, name, argv, env, rank_fd=False, cores=None):
        env = dict(env)
        pass_fds = ()
        label = {"name": name, "fd": None}
        if rank_fd:
            label["fd"], wfd = os.pipe()
            env["FPTRUN_RANK_FD"] = str(wfd)
            pass_fds = (wfd,)
        try:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=pass_fds, start_new_session=True,
                                    preexec_fn=lambda: _in_child(cores))
        finally:
            if rank_fd:
                os.close(wfd)
        for src, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            t = threading.Thread(target=self._copy, args=(src, dst, label), daemon=True)
            t.start()
            self.readers.setdefault(proc.pid, []).append(t)
        self.procs.append((label, proc))
        return proc

    @staticmethod
    def _relabel(label):
        """Takes the worker's rank from its pipe once fpt.start() wrote it
        (before the worker printed the line at hand, so it is there)."""
        fd = label["fd"]
        if fd is None or not select.select([fd], [], [], 0)[0]:
            return
        data = os.read(fd, 64).strip()
        os.close(fd)
        label["fd"] = None
        if data.isdigit():
            label["name"] = "worker" + data.decode()

    def _copy(self, src, dst, label):
        for line in iter(src.readline, b""):
            with self.lock:
                self._relabel(label)
                dst.write("[%s] %s" % (label["name"], line.decode("utf-8", "replace")))
                if not line.endswith(b"\n"):
                    dst.write("\n")
                dst.flush()
        src.close()

    def stop(self, grace=3.0):
        """SIGTERM to every process group still running, SIGKILL after grace."""
        for _, p in self.procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, p in self.procs:
            # The group too: a worker's own children must not outlive it.
            _signal_group(p, signal.SIGKILL)
            p.wait()
        self.flush()

    def flush(self, pid=None):
        for p, threads in self.readers.items():
            if pid is None or p == pid:
                for t in threads:
                    t.join(2)


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _in_child(cores):
    """In the child, before it runs its command: bound to cores (None:
    left as it is), and killed with fptrun."""
    if cores is not None:
        os.sched_setaffinity(0, cores)
    _die_with_parent()


def _die_with_parent():
    """In the child: SIGKILL when fptrun dies, however it dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.print_python:
        py, torch = find_python()
        print(py)
        if not torch:
            print("fptrun: %s cannot import torch (set FPT_PYTHON, or apt-get install python3-torch)" % py,
                  file=sys.stderr)
            return 3
        return 0
    secret = a.secret or os.environ.get("FPT_CLUSTER_SECRET")
    if a.secret_file:
        with open(a.secret_file) as f:
            secret = f.read().strip()
    if a.hosts:
        for line in hosts_plan(a, secret or secrets.token_hex(16)):
            print(line)
        return 0

    if a.root is None and engine_task():
        run_engine_task(a, secret)
    share = a.root is not None
    if share:
        host, _, port = a.root.rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit("fptrun: --root must be HOST:PORT, not %r" % a.root)
        run_sched = a.scheduler
        here_s = a.here_servers if a.here_servers is not None else 0
        here_w = a.here_workers if a.here_workers is not None else 0
        if not secret and not host.startswith("127.") and host != "localhost":
            raise SystemExit("fptrun: a job across machines needs the same secret on every host: "
                             "set FPT_CLUSTER_SECRET or pass --secret/--secret-file")
    else:
        host, port = "127.0.0.1", str(free_port())
        run_sched, here_s, here_w = True, a.servers, a.workers

    env = dict(os.environ)
    if not share:
        # Every process of the job is on this machine: its workers sum here
        # (docs/local-aggregation.md, "One host"), unless told otherwise.
        env.setdefault("FPT_LOCAL_AGGREGATION", "auto")
    env.update(DMLC_PS_ROOT_URI=host, DMLC_PS_ROOT_PORT=port, DMLC_NUM_SERVER=str(a.servers),
               DMLC_NUM_WORKER=str(a.workers), FPT_CLUSTER_SECRET=secret or secrets.token_hex(16),
               PYTHONUNBUFFERED="1")
    env.pop("FPT_CLUSTER_SECRET_FILE", None)
    command = child_command(env, a.command)
    fpt_bin = find_fpt(env) if (run_sched or here_s) else None

    job = Job()
    stopping = []

    def on_signal(sig, _frame):
        stopping.append(sig)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cores, bound = [None] * here_w, ""
    if a.bind_cores and here_w:
        cores = core_slices(os.sched_getaffinity(0), here_w)
        bound = "; workers bound to cores " + " | ".join(cpu_list(c) for c in cores)
    print("fptrun: %d servers and %d workers, scheduler at %s:%s; here:%s %d servers, %d workers; "
          "FPT_LOCAL_AGGREGATION=%s%s"
          % (a.servers, a.workers, host, port, " scheduler," if run_sched else "", here_s, here_w,
             env.get("FPT_LOCAL_AGGREGATION", "off"), bound), flush=True)
    try:
        if run_sched:
            job.start("scheduler", [fpt_bin], dict(env, DMLC_ROLE="scheduler"))
        for i in range(here_s):
            job.start("server%d" % i, [fpt_bin], dict(env, DMLC_ROLE="server"))
        for i in range(here_w):
            job.start("worker.%d" % i, command, dict(env, DMLC_ROLE="worker"), rank_fd=True, cores=cores[i])
    except OSError as e:
        job.stop()
        print("fptrun: cannot start %s: %s" % (command[0], e), file=sys.stderr)
        return 1

    def survivable(name):
        # The job goes on without this node (the scheduler decides; a
        # failure it cannot survive ends every other process anyway).
        return (name.startswith("worker") and env.get("FPT_ON_WORKER_LOSS") in ("continue", "wait")
                or name.startswith("server") and env.get("FPT_ON_SERVER_LOSS") == "retry")

    status = 0
    lost = []
    # Workers first: when a worker's failure ends the servers too, the
    # worker is the one to name.
    running = job.procs[::-1]
    workers_done = None  # when the last worker exited 0
    while running and not stopping:
        time.sleep(0.05)
        if here_w and workers_done is None and not any(lb["name"].startswith("worker") for lb, _ in running):
            workers_done = time.monotonic()
        if workers_done is not None and time.monotonic() - workers_done > SERVE_AFTER_WORKERS:
            print("fptrun: %s still running %d s after the workers finished; stopping them"
                  % (", ".join(lb["name"] for lb, _ in running), SERVE_AFTER_WORKERS), file=sys.stderr, flush=True)
            status = 1
            break
        for entry in list(running):
            label, p = entry
            code = p.poll()
            if code is None:
                continue
            running.remove(entry)
            if code != 0 and survivable(label["name"]):
                job.flush(p.pid)
                print("fptrun: %s exited with status %d; the job goes on without it" % (label["name"], code),
                      file=sys.stderr, flush=True)
                lost.append("%s (status %d)" % (label["name"], code))
                continue
            if code != 0:
                if label["name"] == "scheduler" and code > 0:
                    label, p, code = _culprit(label, p, code, running)
                job.flush(p.pid)  # its last words before fptrun's
                print("fptrun: %s exited with status %d; stopping the others" % (label["name"], code),
                      file=sys.stderr, flush=True)
                status = code if code > 0 else 1
                running = []
                break
    if stopping:
        print("fptrun: interrupted; stopping every process", file=sys.stderr, flush=True)
        status = 128 + stopping[0]
    job.stop()
    if status == 0 and lost:
        print("fptrun: the others finished cleanly; the job went on without %s" % ", ".join(lost),
              file=sys.stderr, flush=True)
        status = 1
    elif status == 0:
        print("fptrun: all %d processes finished cleanly" % len(job.procs), flush=True)
    return status


def _culprit(label, p, code, running):
    """The process to name for a failure the scheduler reported (label is
    the scheduler's): a worker of running that exits non-zero within
    CULPRIT_GRACE, else the scheduler. A server's or a killed process's
    failure is named at once: the workers failing after it fail for it."""
    end = time.monotonic() + CULPRIT_GRACE
    workers = [e for e in running if e[0]["name"].startswith("worker")]
    while workers and time.monotonic() < end:
        for entry in list(workers):
            wcode = entry[1].poll()
            if wcode is None:
                continue
            workers.remove(entry)
            if wcode != 0:
                running.remove(entry)
                return entry[0], entry[1], wcode
        time.sleep(0.02)
    return label, p, code


if __name__ == "__main__":
    sys.exit(main())

"""Checks of the fpt bindings that run as a worker of a real cluster
(tests/python_test.go starts them):

    fpt_checks.py basic   every call's error path, round trips with NumPy and
                          PyTorch, buffers kept alive while a request uses
                          them, nothing left after finalize: "BINDINGS PASS"
    fpt_checks.py optimizer  fpt.torch's buckets give the same training as one
                          push per gradient
    fpt_checks.py join    fpt.torch training that a third worker joins: it
                          gets the others' model, numbers its steps from
                          start_iteration(); every worker prints its final
                          parameters' hash ("join params ...")
    fpt_checks.py dead    pushes and pulls until a node dies: the wait raises
                          ClusterError (printed), exit status 1
    fpt_checks.py raise   worker rank 1 raises after a few iterations
    fpt_checks.py loop    pushes and pulls for ever (to be interrupted)
"""

import ctypes
import gc
import os
import sys
import threading
import time
import weakref

import numpy as np
import torch

import fpt

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def raises(exc, what, fn, *args):
    try:
        fn(*args)
    except exc as e:
        check(True, "%s raises %s: %s" % (what, exc.__name__, e))
        return e
    except Exception as e:  # noqa: BLE001 - the wrong exception is the failure reported
        check(False, "%s raised %s (%s), want %s" % (what, type(e).__name__, e, exc.__name__))
        return None
    check(False, "%s raised nothing, want %s" % (what, exc.__name__))
    return None


def basic():
    check(fpt.role() == "worker" and fpt.num_workers() == 2, "role and sizes readable before start")
    raises(fpt.StateError, "rank before start", fpt.rank)
    raises(fpt.StateError, "declare before start", fpt.declare, 1, 64)
    raises(fpt.StateError, "push before start", fpt.push, 1, np.zeros(16, np.float32))
    raises(fpt.StateError, "set_params_source before start", fpt.set_params_source, lambda it, k: b"")
    raises(fpt.StateError, "start_iteration before start", fpt.start_iteration)
    raises(fpt.StateError, "joined before start", fpt.joined)
    threads_before = threading.active_count()
    fpt.start()
    r = fpt.rank()
    check(r in (0, 1), "rank %d" % r)
    check(fpt.my_id() == 9 + 2 * r, "my_id is ps-lite's 9+2r")
    check(fpt.group_ids(fpt.GROUP_WORKERS) == [9, 11], "group_ids of the workers")
    raises(fpt.ArgumentError, "group_ids of no node", fpt.group_ids, 100)
    raises(fpt.ArgumentError, "barrier_group(0)", fpt.barrier_group, 0)
    raises(fpt.ArgumentError, "declare with dtype int8", fpt.declare, 7, 64, "int8")
    raises(fpt.SizeError, "declare of a partial element", fpt.declare, 7, 15, "float32")

    big = 2 << 20  # elements of key 3: 8 MiB, several partitions
    fpt.declare(1, 16 * 4, "float32", priority=1)
    fpt.declare(2, 16 * 8, fpt.FLOAT64)
    fpt.declare(3, big * 4, torch.float32)
    fpt.declare(4, 8 * 2, "float16")
    fpt.declare(5, 4 * 4, "float32")
    fpt.declare(6, 4 * 4, "float32")
    fpt.declare(8, 16 * 4, "float32")  # never initialised nor pushed
    raises(fpt.StateError, "push before the key's init", fpt.push, 1, np.zeros(16, np.float32))
    a = np.full(16, 10.0 * (r + 1), np.float32)
    fpt.init(1, a)
    check((a == 10).all(), "init gives worker 0's values (numpy)")
    t = torch.full((16,), 5.0 * (r + 1), dtype=torch.float64)
    fpt.init(2, t)
    check(bool((t == 5).all()), "init gives worker 0's values (torch float64)")
    fpt.init(3, torch.zeros(big))
    fpt.init(4, np.zeros(8, np.float16))
    fpt.init([5, 6], np.zeros(8, np.float32))
    check(not fpt.joined() and fpt.start_iteration() == 1, "a worker that started the job did not join it; "
          "its first push after init is iteration 1")
    params_source()

    # Error paths of push and pull.
    raises(fpt.SizeError, "push of the wrong size", fpt.push, 1, np.zeros(8, np.float32))
    raises(fpt.UnknownKeyError, "push of an undeclared key", fpt.push, 12345, np.zeros(16, np.float32))
    raises(fpt.UnknownKeyError, "multi-key push with an undeclared key", fpt.push, [5, 12345], np.zeros(8, np.float32))
    raises(fpt.SizeError, "multi-key push of the wrong total", fpt.push, [5, 6], np.zeros(9, np.float32))
    raises(fpt.ArgumentError, "push of float32 into a float64 key", fpt.push, 2, np.zeros(32, np.float32))
    raises(fpt.ArgumentError, "push of a non-contiguous tensor", fpt.push, 1, torch.zeros(16, 2)[:, 0])
    raises(fpt.ArgumentError, "push of an int64 tensor", fpt.push, 2, torch.zeros(16, dtype=torch.int64))
    ro = np.zeros(16, np.float32)
    ro.flags.writeable = False
    raises(fpt.ArgumentError, "pull into a read-only array", fpt.pull, 1, ro)
    got = np.zeros(16, np.float32)
    fpt.pull(1, got).wait()
    check((got == 10).all(), "pull after init, before any push, gives the init's values (Gluon's broadcast)")
    raises(fpt.StateError, "pull of a key neither initialised nor pushed", fpt.pull, 8, np.zeros(16, np.float32))
    raises(fpt.StateError, "declare after the first push", lambda: (fpt.push(6, np.zeros(4, np.float32)).wait(),
                                                                     fpt.declare(77, 64)))
    s6 = np.zeros(4, np.float32)
    fpt.pull(6, s6).wait()  # the sum of that push, to keep key 6 in step

    # Round trips: every worker pushes rank+1, the sums are exact.
    x = np.full(16, r + 1, np.float32)
    out = np.zeros(16, np.float32)
    h, s = fpt.push(1, x), fpt.pull(1, out)
    fpt.wait_all([h, s])
    check((out == 3).all(), "numpy float32 push/pull sum")
    check(fpt.num_workers_at(1) == 2, "num_workers_at: both workers' pushes make up key 1's iteration 1")
    check(fpt.rank_at(1) == r, "rank_at is rank while no worker was lost")
    tt, to = torch.full((16,), r + 1.0, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)
    fpt.wait_all([fpt.push(2, tt), fpt.pull(2, to)])
    check(bool((to == 3).all()), "torch float64 push/pull sum")
    hx, ho = torch.full((8,), r + 1.5, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    fpt.wait_all([fpt.push(4, hx), fpt.pull(4, ho)])
    check(bool((ho == 4).all()), "float16 push/pull sum")
    mk = np.array([r + 1] * 4 + [10 * (r + 1)] * 4, np.float32)
    mo = np.zeros(8, np.float32)
    fpt.wait_all([fpt.push([5, 6], mk), fpt.pull([5, 6], mo)])
    check((mo[:4] == 3).all() and (mo[4:] == 30).all(), "two keys end to end in one buffer")
    ba = bytearray(np.full(16, r + 1, np.float32).tobytes())
    bo = bytearray(64)
    fpt.wait_all([fpt.push(1, ba), fpt.pull(1, bo)])
    check((np.frombuffer(bo, np.float32) == 3).all(), "bytearray push/pull (raw bytes)")
    # push_pull: one request, the sums into another buffer or in place.
    po = np.zeros(16, np.float32)
    fpt.push_pull(1, x, po).wait()
    check((po == 3).all() and (x == r + 1).all(), "numpy float32 push_pull into another buffer")
    y = np.full(16, r + 1, np.float32)
    fpt.push_pull(1, y, y).wait()
    check((y == 3).all(), "push_pull in place")
    tp = torch.zeros(16, dtype=torch.float64)
    fpt.push_pull(2, tt, tp).wait()
    check(bool((tp == 3).all()), "torch float64 push_pull")
    mp = np.zeros(8, np.float32)
    fpt.push_pull([5, 6], mk, mp).wait()
    check((mp[:4] == 3).all() and (mp[4:] == 30).all(), "push_pull of two keys end to end")
    raises(fpt.SizeError, "push_pull into an output of the wrong size", fpt.push_pull, 1, x, np.zeros(8, np.float32))
    raises(fpt.ArgumentError, "push_pull into a read-only output", fpt.push_pull, 1, x, ro)
    raises(fpt.ArgumentError, "push_pull of float64 into float32", fpt.push_pull, 1, x, np.zeros(8, np.float64))

    # Requests take no callback: their completion wakes fpt_wait itself,
    # not a goroutine that calls into Python to set an Event.
    real, given = fpt._node._lib, []

    class Spy:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name in ("fpt_push", "fpt_pull", "fpt_push_pull"):
                return lambda *a: (given.append(a[-3]), fn(*a))[1]
            return fn

    fpt._node._lib = Spy()
    try:
        hp = fpt.push(1, ba)
        sp = fpt.pull(1, bo)
        fpt.wait_all([hp, sp])
        pp = fpt.push_pull(1, ba, bo)
        pp.wait()
    finally:
        fpt._node._lib = real
    check(len(given) == 3 and not any(given), "push, pull and push_pull pass the library no callback")
    check(hp.done() and sp.done() and pp.done() and not fpt._node.pending,
          "waited requests are done and held no more")
    # A push never waited for lets go of its tensor once a sweep sees it done.
    tmp = np.full(16, r + 1, np.float32)
    ref, unwaited = weakref.ref(tmp), fpt.push(1, tmp)
    del tmp, unwaited
    fpt.wait_all([fpt.pull(1, bo)])
    for _ in range(500):
        fpt._node.sweep()
        gc.collect()
        if ref() is None:
            break
        time.sleep(0.01)
    check(ref() is None and not fpt._node.pending, "an unwaited push's tensor is let go once it is done")

    # A tensor whose last reference goes while its push is in flight: the
    # package holds it, so the memory is not reused before it was sent.
    fpt.barrier()
    if r == 1:
        time.sleep(1)  # worker 0's requests wait for this worker's push

    def push_temporary():
        tmp = torch.full((big,), float(r + 1))
        return fpt.push(3, tmp, priority=-1), weakref.ref(tmp)

    h, ref = push_temporary()
    gc.collect()
    junk = [torch.full((big,), 1e6) for _ in range(4)]  # would reuse a freed tensor's memory
    result = torch.zeros(big)
    s = fpt.pull(3, result)
    fpt.wait_all([h, s])
    del junk
    check(bool((result == 3).all()), "a pushed tensor dropped by its owner mid-push was sent intact")
    h = None
    gc.collect()
    check(ref() is None, "the package let go of the tensor once the push completed")

    # A pull's tensor dropped before the sum arrives: still alive until then.
    fpt.barrier()
    mine = torch.full((big,), float(r + 1))
    h = fpt.push(3, mine) if r == 0 else None

    def pull_temporary():
        tmp = torch.zeros(big)
        return fpt.pull(3, tmp), weakref.ref(tmp)

    if r == 0:
        s, ref = pull_temporary()
        gc.collect()
        check(ref() is not None and not s.done(), "a pull's tensor stays alive while the pull waits")
        fpt.barrier()  # now worker 1 pushes
        fpt.wait_all([h, s])
        s = None
        gc.collect()
        check(ref() is None, "the package let go of the pull's tensor once it completed")
    else:
        fpt.barrier()
        h = fpt.push(3, mine)
        fpt.wait_all([h, fpt.pull(3, torch.zeros(big))])

    fpt.finalize()
    check(not fpt._node.pending, "no request held after finalize")
    check(threading.active_count() == threads_before, "no Python thread left after finalize (%d, %d before start)"
          % (threading.active_count(), threads_before))
    raises(fpt.StateError, "push after finalize", fpt.push, 1, np.zeros(16, np.float32))
    raises(fpt.StateError, "barrier after finalize", fpt.barrier)
    raises(fpt.StateError, "finalize twice", fpt.finalize)
    if failures:
        print("BINDINGS FAIL: %d checks failed" % len(failures), flush=True)
        sys.exit(1)
    print("BINDINGS PASS", flush=True)


def params_source():
    """The parameters source as the library calls it (no worker joins this
    job, so the checks call the registered function pointer): the bytes
    fn gives land in dst; a wrong size or dtype, or an exception, is a
    non-zero status, never an exception into the library."""
    got = []

    def src(iteration, key):
        got.append((iteration, key))
        if key == 99:
            raise RuntimeError("no parameters for key 99")
        return {1: np.arange(16, dtype=np.float32), 2: torch.arange(16, dtype=torch.float64),
                5: np.zeros(3, np.float32), 6: np.zeros(2, np.float64)}[key]

    fpt.set_params_source(src)
    call = fpt._node.params_cb
    dst = (ctypes.c_char * 128)()
    check(call(None, 7, 1, ctypes.addressof(dst), 64) == 0 and got == [(7, 1)] and
          (np.frombuffer(dst, np.float32, 16) == np.arange(16)).all(), "params source: numpy bytes copied")
    check(call(None, 7, 2, ctypes.addressof(dst), 128) == 0 and
          (np.frombuffer(dst, np.float64, 16) == np.arange(16)).all(), "params source: torch bytes copied")
    check(call(None, 7, 5, ctypes.addressof(dst), 16) == 1, "params source: the wrong size is a non-zero status")
    check(call(None, 7, 6, ctypes.addressof(dst), 16) == 1, "params source: the wrong dtype is a non-zero status")
    check(call(None, 7, 99, ctypes.addressof(dst), 16) == 1, "params source: an exception is a non-zero status")
    fpt.set_params_source(None)
    check(fpt._node.params_cb is None, "set_params_source(None) removes it")


def optimizer():
    """fpt.torch.DistributedOptimizer with one bucket, one per gradient and
    several (the gradients set to None between steps, so they are copied
    into place): the same parameters bit for bit after 5 steps. Every
    optimizer is made before the first push (keys are declared up front)."""
    import hashlib

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "pytorch"))
    from model import Net, dataset
    import fpt.torch
    import torch.nn.functional as F

    fpt.start()
    r = fpt.rank()
    runs = []
    for bucket, none in ((1 << 20, False), (0, False), (1000, True)):
        torch.manual_seed(1)
        m = Net(2)
        opt = fpt.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                                             m.named_parameters(), bucket_bytes=bucket)
        fpt.torch.broadcast_parameters(m.state_dict())
        runs.append((m, opt, none))
    # One more, whose momentum buffers exist before it is wrapped (a step
    # on local gradients) and are broadcast: it can be joined after
    # training, the others (buffers made while training) cannot.
    torch.manual_seed(1)
    m3 = Net(2)
    opt3 = torch.optim.SGD(m3.parameters(), lr=0.05, momentum=0.9)
    for q in m3.parameters():
        q.grad = torch.ones_like(q)
    opt3.step()
    opt3 = fpt.torch.DistributedOptimizer(opt3, m3.named_parameters())
    fpt.torch.broadcast_parameters(m3.state_dict())
    fpt.torch.broadcast_optimizer_state(opt3)
    raises(ValueError, "broadcast_parameters from rank 1", fpt.torch.broadcast_parameters, {}, 1)
    m0, opt0, _ = runs[0]

    def source_is_param(m, opt, when):
        key, want = opt._fpt_keys[0], next(m.parameters()).detach().numpy().tobytes()
        check(fpt.torch.params_source(5, key).numpy().tobytes() == want,
              "fpt.torch's source gives a gradient key's parameter (%s)" % when)
        dst = (ctypes.c_char * len(want))()
        check(fpt._node.params_cb(None, 5, key, ctypes.addressof(dst), len(want)) == 0 and bytes(dst) == want,
              "the registered source copies the parameter's bytes (%s)" % when)

    source_is_param(m0, opt0, "before training")
    check(len(fpt.torch._sources) == fpt.torch._keys.next - fpt.torch.KEY_BASE,
          "every key fpt.torch declared (gradients and broadcasts) has a source")
    raises(KeyError, "fpt.torch's source for a key it did not declare", fpt.torch.params_source, 5, 3)
    check(opt0._fpt_iteration == fpt.start_iteration() == 1, "steps numbered from start_iteration()")
    x, y = dataset(512, 1)
    hashes = []
    for m, opt, none in runs + [(m3, opt3, False)]:
        for i in range(5):
            lo = i * 64 + r * 32
            opt.zero_grad(set_to_none=none)
            F.cross_entropy(m(x[lo:lo + 32]), y[lo:lo + 32]).backward()
            opt.step()
        hashes.append(hashlib.sha256(b"".join(q.detach().numpy().tobytes() for q in m.parameters())).hexdigest()[:16])
    hashes.pop()  # m3 started elsewhere
    source_is_param(m3, opt3, "after 5 steps, the momentum buffers broadcast")
    p3 = next(m3.parameters())
    buf = opt3.state[p3]["momentum_buffer"].numpy().tobytes()

    def value(get):  # None from the gradient keys of the runs that refuse
        try:
            return get().numpy().tobytes()
        except RuntimeError:
            return None

    check(any(value(get) == buf for get in fpt.torch._sources.values()),
          "a broadcast optimizer state key gives the momentum buffer as it is now")
    e = raises(RuntimeError, "the source after 5 steps with momentum buffers made while training",
               fpt.torch.params_source, 5, opt0._fpt_keys[0])
    check(e is not None and "only 0 were broadcast" in str(e), "it says the optimizer's state was not broadcast")
    dst = (ctypes.c_char * 8)()
    check(fpt._node.params_cb(None, 5, opt0._fpt_keys[0], ctypes.addressof(dst), 8) == 1,
          "the registered source refuses: a joiner fails rather than step differently from the others")
    check(opt0._fpt_iteration == 6, "5 steps: iteration %d next, want 6" % opt0._fpt_iteration)
    check(len(runs[0][1]._fpt_buckets) == 1 and len(runs[1][1]._fpt_buckets) == 6 and
          len(runs[2][1]._fpt_buckets) > 1, "bucket counts %s" % [len(o._fpt_buckets) for _, o, _ in runs])
    check(len(set(hashes)) == 1, "one bucket, one per gradient, several: same parameters %s" % hashes)
    print("optimizer params %s" % hashes[0], flush=True)
    fpt.finalize()
    if failures:
        sys.exit(1)
    print("OPTIMIZER PASS", flush=True)


def join(steps=60):
    """The example's network trained with fpt.torch, the same batch on
    every worker. Each worker starts from its own random weights: only the
    handover can make a joiner's parameters the others'. Plain SGD: state
    the optimizer makes while training (momentum buffers) is not handed
    over (optimizer checks that such a job refuses a joiner)."""
    import hashlib

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "pytorch"))
    from model import Net, dataset
    import fpt.torch
    import torch.nn.functional as F

    fpt.start()
    r = fpt.rank()
    torch.manual_seed(100 + r)
    m = Net(1)
    opt = fpt.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05), m.named_parameters())
    fpt.torch.broadcast_parameters(m.state_dict())
    start = fpt.start_iteration()
    check(fpt.joined() == (r >= 2), "joined() is %s on rank %d" % (fpt.joined(), r))
    if fpt.joined():
        print("rank %d joined at iteration %d" % (r, start), flush=True)
    x, y = dataset(256, 1)
    for step in range(start, steps + 1):
        lo = (step * 32) % 224
        opt.zero_grad()
        F.cross_entropy(m(x[lo:lo + 32]), y[lo:lo + 32]).backward()
        opt.step()
        n = fpt.num_workers_at(step)
        print("step %d over %d workers" % (step, n), flush=True)
        # The rest of a step, long until the third worker is in: room for
        # its process to start.
        time.sleep(0.2 if n < 3 else 0.01)
    check(opt._fpt_iteration == steps + 1, "the steps ended at iteration %d" % (opt._fpt_iteration - 1))
    print("join params %s" % hashlib.sha256(b"".join(q.detach().numpy().tobytes() for q in m.parameters()))
          .hexdigest()[:16], flush=True)
    fpt.finalize()
    if failures:
        sys.exit(1)
    print("JOIN PASS", flush=True)


def loop(raise_at=None):
    """Iterations of push and pull; rank 1 raises at raise_at."""
    fpt.start()
    r = fpt.rank()
    fpt.declare(1, 1 << 16, "float32")
    fpt.init(1, np.zeros(1 << 14, np.float32))
    x = np.ones(1 << 14, np.float32)
    out = np.zeros_like(x)
    i = 0
    while True:
        i += 1
        if raise_at is not None and r == 1 and i == raise_at:
            print("worker rank 1 raising at iteration %d" % i, flush=True)
            raise RuntimeError("a bug in the training script")
        try:
            fpt.wait_all([fpt.push(1, x), fpt.pull(1, out)])
        except fpt.ClusterError as e:
            print("ClusterError raised: %s" % e, file=sys.stderr, flush=True)
            sys.exit(1)
        print("iteration %d/inf" % i, flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "basic"
    {"basic": basic, "optimizer": optimizer, "join": join, "dead": loop, "loop": loop, "raise": lambda: loop(raise_at=4)}[mode]()

"""fpt from Python: bindings over libfpt, fpt's C library (include/fpt.h),
with the standard library's ctypes.

One node per process, as in the C library::

    import fpt
    fpt.start()                       # joins the cluster DMLC_* describes
    fpt.declare(0, g.nbytes, "float32", priority=0)
    h = fpt.push(0, g)                # FPTPush, asynchronous
    s = fpt.pull(0, out)              # FPTPull: the sum over the workers
    h.wait(); s.wait()
    fpt.finalize()

Tensors are PyTorch CPU tensors, NumPy arrays or other buffer-protocol
objects, passed without copying; the package keeps each one alive until
its request completes. Failures raise FPTError subclasses carrying fpt's
message; a dead node makes waits raise ClusterError (within
PS_HEARTBEAT_TIMEOUT), never hang. fpt.torch has the PyTorch optimizer
wrapper; fpt.run is the launcher (fptrun).
"""

import atexit
import os
import ctypes
import itertools
import sys
import threading
import traceback

from . import _buffers, _lib
from ._version import __version__
from ._buffers import BFLOAT16, FLOAT16, FLOAT32, FLOAT64

__all__ = [
    "FPTError", "ArgumentError", "StateError", "UnknownKeyError", "SizeError", "ConfigError",
    "ClusterError", "InternalError", "Request", "FLOAT32", "FLOAT64", "FLOAT16", "BFLOAT16",
    "start", "finalize", "role", "rank", "num_workers", "num_workers_at", "rank_at", "num_servers", "set_tensors_per_iteration",
    "set_params_source", "start_iteration", "joined",
    "declare", "declared", "init", "broadcast", "push", "pull", "push_pull", "wait_all", "allreduce", "barrier", "my_id", "group_ids",
    "barrier_group", "GROUP_SCHEDULER", "GROUP_SERVERS", "GROUP_WORKERS",
]

GROUP_SCHEDULER, GROUP_SERVERS, GROUP_WORKERS = 1, 2, 4
_ROLES = {1: "scheduler", 2: "server", 3: "worker"}


class FPTError(Exception):
    """A failed fpt call: status is the fpt_status code, message fpt's."""

    def __init__(self, status, message, name=None):
        super().__init__(status, message)
        self.status, self.message = status, message
        self.name = name or str(status)  # libfpt's fpt_status_name

    def __str__(self):
        return "%s: %s" % (self.name, self.message)


class ArgumentError(FPTError, ValueError):
    """FPT_ERR_ARG: a bad argument (also a buffer fpt cannot take)."""


class StateError(FPTError, RuntimeError):
    """FPT_ERR_STATE: before start, after finalize, or out of order."""


class UnknownKeyError(FPTError, KeyError):
    """FPT_ERR_KEY: a key that was not declared."""


class SizeError(FPTError, ValueError):
    """FPT_ERR_SIZE: a length that disagrees with the key's declaration."""


class ConfigError(FPTError):
    """FPT_ERR_CONFIG: a missing or malformed DMLC_*/PS_*/FPT_* variable."""


class ClusterError(FPTError, ConnectionError):
    """FPT_ERR_CLUSTER: a node died, the cluster timed out or terminated."""


class InternalError(FPTError):
    """FPT_ERR_INTERNAL: a bug in fpt."""


_ERRORS = {_lib.ERR_ARG: ArgumentError, _lib.ERR_STATE: StateError, _lib.ERR_KEY: UnknownKeyError,
           _lib.ERR_SIZE: SizeError, _lib.ERR_CONFIG: ConfigError, _lib.ERR_CLUSTER: ClusterError,
           _lib.ERR_INTERNAL: InternalError}


def _error(status, message):
    if status == _lib.ERR_CLUSTER:
        _node.cluster_failed = True
    name = _node.lib.fpt_status_name(status).decode("ascii")
    return _ERRORS.get(status, FPTError)(status, message, name)


class Request:
    """An asynchronous push or pull. wait() blocks until it completed and
    raises its failure. The tensor stays referenced until then.

    Requests take no callback: wait() blocks in the library's fpt_wait with
    the GIL released, which the request's completion wakes directly (a
    callback would add a goroutine, a foreign thread taking the GIL and a
    Python wake-up to every step)."""

    __slots__ = ("op", "keys", "ts", "_buf", "_rid", "_settled", "_waited")

    def __init__(self, op, keys, buf, rid):
        self.op, self.keys, self._buf, self._rid = op, keys, buf, rid
        self.ts = None
        self._settled = self._waited = False

    def done(self):
        """Whether the request has completed (successfully or not)."""
        if not self._settled and _node.settled(self.ts):
            self._release()
        return self._settled

    def _release(self):
        """The library is done with the tensor: let it go."""
        self._settled, self._buf = True, None
        with _node.lock:
            _node.pending.pop(self._rid, None)

    def wait(self):
        """Blocks until the request completed; raises its error (only the
        first wait of a failed request raises, as fpt_wait reports it once)."""
        if self._waited:
            return
        self._waited = True
        st = _node.lib.fpt_wait(self.ts)
        msg = _node.last_error() if st != _lib.OK else ""
        self._release()
        if st != _lib.OK:
            raise _error(st, "%s of keys %s: %s" % (self.op, self.keys, msg))

    def __repr__(self):
        return "<fpt.Request %s keys=%s ts=%s %s>" % (self.op, self.keys, self.ts,
                                                     "done" if self.done() else "pending")


class _Node:
    """The process's node: the library, what was declared, and the
    requests in flight (each holding its tensor until it is seen done)."""

    def __init__(self):
        self._lib = None
        self.lock = threading.Lock()
        self.declared = {}  # key -> (bytes, dtype)
        self.initialized = set()  # keys fpt_init gave a starting value
        self.pushed = False  # declarations must all come before the first push
        self.pending = {}  # request id -> Request, until seen done (waited, done(), or a sweep)
        self.ids = itertools.count(1)
        self.started = self.finalized = False
        self.failed = False  # an uncaught exception is ending the program
        self.cluster_failed = False  # a call raised ClusterError already
        self.params_cb = None  # the registered parameters source, kept alive

    @property
    def lib(self):
        if self._lib is None:
            self._lib = _lib.load()
        return self._lib

    def last_error(self):
        return (self.lib.fpt_last_error() or b"").decode("utf-8", "replace")

    def check(self, status):
        if status != _lib.OK:
            raise _error(status, self.last_error())

    def settled(self, ts):
        """Whether request ts completed (fpt_test); True once the library
        cannot tell any more (finalized or failed): it holds nothing then."""
        done = ctypes.c_int()
        return self.lib.fpt_test(ts, ctypes.byref(done)) != _lib.OK or bool(done.value)

    def sweep(self):
        """Lets go of the tensors of requests done and never waited for, so
        that a program that does not wait for every push holds no more than
        SWEEP_AT of them."""
        with self.lock:
            reqs = list(self.pending.values())
        for req in reqs:
            if req.ts is not None and self.settled(req.ts):
                req._release()

    def submit(self, op, keys, buf, call):
        """Runs call(callback, user_data, ts_out) for a new request that
        holds buf until it completes. The request has no callback: its
        waiter is woken by the library itself."""
        if len(self.pending) >= SWEEP_AT:
            self.sweep()
        rid = next(self.ids)
        req = Request(op, keys, buf, rid)
        with self.lock:
            self.pending[rid] = req
        ts = ctypes.c_int64()
        status = call(_lib.NO_CALLBACK, None, ctypes.byref(ts))
        if status != _lib.OK:
            with self.lock:
                self.pending.pop(rid, None)
            raise _error(status, self.last_error())
        req.ts = ts.value
        return req


# How many requests may hold their tensors, unwaited, before submit looks
# for those done.
SWEEP_AT = 256

_node = _Node()


def _int_out(fn):
    v = ctypes.c_int()
    _node.check(fn(ctypes.byref(v)))
    return v.value


def start():
    """Joins the cluster as the node the environment (DMLC_ROLE, ...)
    describes; a worker or server returns once every node has joined."""
    _node.check(_node.lib.fpt_start())
    _node.started = True
    _tell_launcher()


def _tell_launcher():
    """Under fptrun, a worker tells it its rank (which the scheduler
    assigned) through the pipe FPTRUN_RANK_FD names, for its output's label."""

    fd = os.environ.pop("FPTRUN_RANK_FD", None)
    if fd is None or not fd.isdigit():
        return
    try:
        if role() == "worker":
            os.write(int(fd), b"%d\n" % rank())
        os.close(int(fd))
    except (OSError, FPTError):
        pass


def finalize():
    """Leaves the cluster: a worker waits for its requests; the scheduler
    and servers serve until every worker finalized. Every callback has
    returned, and every tensor has been released, when it returns."""
    _node.finalized = True
    status = _node.lib.fpt_finalize()
    with _node.lock:
        left, _node.pending = list(_node.pending.values()), {}
    for req in left:  # completed (fpt_finalize waited for them)
        req._settled, req._buf = True, None
    _node.check(status)


def role():
    """"scheduler", "server" or "worker" (readable before start)."""
    return _ROLES[_int_out(_node.lib.fpt_role)]


def rank():
    """This node's rank among the workers (or the servers)."""
    return _int_out(_node.lib.fpt_rank)


def num_workers():
    return _int_out(_node.lib.fpt_num_workers)


def num_workers_at(iteration):
    """How many workers' pushes the sums of a key's iteration add up (its
    n-th push is iteration n, init is 0): what to divide them by to average.
    num_workers(), unless a worker left (FPT_ON_WORKER_LOSS=continue or wait)
    or joined the job; final once a pull of that iteration is done."""
    return _int_out(lambda out: _node.lib.fpt_num_workers_at(iteration, out))


def rank_at(iteration):
    """This worker's rank among the num_workers_at(iteration) workers whose
    pushes make up that iteration's sums: rank() until a worker is lost,
    then dense again over the workers left (what to shard data by)."""
    return _int_out(lambda out: _node.lib.fpt_rank_at(iteration, out))


def num_servers():
    return _int_out(_node.lib.fpt_num_servers)


def _params_trampoline(fn):
    """fn as the library calls a parameters source (fpt_params_fn): copies
    what fn returns into dst; 0, or 1 after printing why it failed (the
    joining worker is told the code, not the message)."""

    def call(ctx, iteration, key, dst, nbytes):
        try:
            v = _buffers.view(fn(iteration, key), False, "parameters source")
            if v.nbytes != nbytes:
                raise SizeError(_lib.ERR_SIZE, "the parameters source gave %d bytes for key %d, declared as %d"
                                % (v.nbytes, key, nbytes))
            d = _node.declared.get(key)
            if d is not None and v.dtype is not None and v.dtype != d[1]:
                raise ArgumentError(_lib.ERR_ARG, "the parameters source gave %s for key %d, declared %s"
                                    % (_buffers.DTYPE_NAMES[v.dtype], key, _buffers.DTYPE_NAMES[d[1]]))
            if nbytes:
                ctypes.memmove(dst, v.ptr, nbytes)
            return 0
        except BaseException:  # noqa: BLE001 - nothing may cross into the library
            print("fpt: the parameters source failed for key %d at iteration %d (the joining worker fails):"
                  % (key, iteration), file=sys.stderr)
            traceback.print_exc()
            return 1

    return call


def set_params_source(fn):
    """Makes this worker joinable: registers fn as the source of the
    parameters a worker joining the running job starts from (the library
    holds sums, not parameters). fn(iteration, key) returns key's
    parameters as they are at the start of iteration, before its sums are
    applied: a bytes-like object, NumPy array or CPU torch tensor of exactly
    the key's declared bytes (and dtype); or raises, which fails the joiner.
    It is called on one worker only, once per declared key, during its
    first push of the join iteration, on the thread calling fpt.push (a
    program that pushes an iteration's gradients before applying its sums
    has the right values then); it must not push, pull or wait. On the
    joiner, init returns those parameters instead of worker 0's values, and
    start_iteration() says where its training starts. Register it before
    the first push; None removes it. fpt.torch registers the model's."""
    cb = None if fn is None else _lib.PARAMS_FN(_params_trampoline(fn))
    _node.check(_node.lib.fpt_set_params_source(ctypes.cast(cb, ctypes.c_void_p) if cb else None, None))
    _node.params_cb = cb


def start_iteration():
    """The iteration of this worker's first push after init: 1 on a worker
    that started with the job, the iteration it joined at on one that
    joined a running job (known once init has returned)."""
    v = ctypes.c_uint64()
    _node.check(_node.lib.fpt_start_iteration(ctypes.byref(v)))
    return v.value


def joined():
    """Whether this worker joined a running job (rather than starting
    with it): its init returned the parameters another worker's source
    gave, and its training starts at start_iteration()."""
    return _int_out(_node.lib.fpt_joined) != 0


def my_id():
    """This node's ps-lite id (scheduler 1, server r 8+2r, worker r 9+2r)."""
    return _int_out(_node.lib.fpt_my_id)


def group_ids(group_or_id):
    """The ids of the nodes of a group (GROUP_* combined with |) or node."""
    n = ctypes.c_size_t()
    _node.check(_node.lib.fpt_group_ids(group_or_id, None, 0, ctypes.byref(n)))
    ids = (ctypes.c_int * max(n.value, 1))()
    _node.check(_node.lib.fpt_group_ids(group_or_id, ids, n.value, ctypes.byref(n)))
    return list(ids[: n.value])


def barrier():
    """Blocks until every worker called it."""
    _node.check(_node.lib.fpt_barrier())


def barrier_group(group):
    """ps::Postoffice::Barrier over the servers and/or workers of group."""
    _node.check(_node.lib.fpt_barrier_group(group))


def set_tensors_per_iteration(n):
    _node.check(_node.lib.fpt_set_tensors_per_iteration(n))


def declare(key, nbytes, dtype=FLOAT32, priority=0, compression=None, _late=False):
    """Declares a tensor: key, size in bytes, dtype (FLOAT32/"float32",
    FLOAT64, FLOAT16, BFLOAT16, or a NumPy/torch dtype), priority (larger
    first). compression="bf16" or "fp16" makes a float32 key travel as
    16-bit values (half the bytes): each push rounds them, aggregators sum
    in float32 and round the sum once, each pull widens it back; the calls
    still take float32 buffers of nbytes. Every worker declares the same
    tensors before any of them pushes."""
    code = _buffers.dtype_code(dtype)
    if _node.pushed and key not in _node.declared and not _late:
        raise StateError(_lib.ERR_STATE, "fpt_declare: key %d declared after the first push: every worker "
                         "declares all its keys before any push" % key)
    if code is None:
        raise ArgumentError(_lib.ERR_ARG, "fpt_declare: dtype %r is not one of fpt's (%s)"
                            % (dtype, _buffers.SUMMABLE))
    if compression not in _buffers.WIRES:
        raise ArgumentError(_lib.ERR_ARG, "fpt_declare: compression %r is none of None, \"bf16\" and \"fp16\""
                            % (compression,))
    wire = _buffers.WIRES[compression]
    if wire and code != FLOAT32:
        raise ArgumentError(_lib.ERR_ARG, "fpt_declare: key %d: compression %r takes float32 values, not %s"
                            % (key, compression, _buffers.DTYPE_NAMES[code]))
    if wire:
        _node.check(_node.lib.fpt_declare_wire(key, nbytes, code, priority, wire))
    else:
        _node.check(_node.lib.fpt_declare(key, nbytes, code, priority))
    _node.declared[key] = (nbytes, code)


def declared(key):
    """(bytes, dtype code) of a declared key, or None."""
    return _node.declared.get(key)


def _tensors(op, keys, buf, writable):
    """The C arrays of keys and lens and the View of buf for a call. One
    key takes the whole buffer (the library checks the size); several
    keys lie end to end in their declared sizes."""
    single = isinstance(keys, int)
    keys = [keys] if single else [int(k) for k in keys]
    try:
        v = _buffers.view(buf, writable, op)
    except (TypeError, ValueError) as e:
        raise ArgumentError(_lib.ERR_ARG, str(e)) from None
    if single:
        lens = [v.nbytes]
    else:
        lens = []
        for k in keys:
            d = _node.declared.get(k)
            if d is None:
                raise UnknownKeyError(_lib.ERR_KEY, "%s: key %d is not declared" % (op, k))
            lens.append(d[0])
        if sum(lens) != v.nbytes:
            raise SizeError(_lib.ERR_SIZE, "%s: the keys' declared sizes add up to %d bytes, the buffer has %d"
                            % (op, sum(lens), v.nbytes))
    for k in keys:
        d = _node.declared.get(k)
        if d is not None and v.dtype is not None and d[1] != v.dtype:
            raise ArgumentError(_lib.ERR_ARG, "%s: key %d is declared %s, the buffer holds %s"
                                % (op, k, _buffers.DTYPE_NAMES[d[1]], _buffers.DTYPE_NAMES[v.dtype]))
    return keys, (ctypes.c_uint64 * len(keys))(*keys), (ctypes.c_uint64 * len(lens))(*lens), v


def init(keys, buf):
    """Sets the keys' starting values on every worker to worker 0's: buf
    holds worker 0's values when it returns. Collective; blocks. On a worker
    that joined a running job, buf holds the keys' parameters from another
    worker's source instead (see set_params_source)."""
    keys, ck, cl, v = _tensors("fpt_init", keys, buf, True)
    _node.check(_node.lib.fpt_init(ck, len(keys), v.ptr, cl))
    _node.initialized.update(keys)


def broadcast(keys, buf=None, root=0, name=None):
    """init for keys that no iteration pushes again (a model's buffers, an
    optimizer's state): every worker gets worker 0's values in buf, and the
    iterations after it complete without these keys; pushing one of them
    raises. Collective; blocks.

    broadcast(tensor, root=0, name=None), without keys: gives every worker
    worker 0's values of tensor (CPU or CUDA, any size), in place, over a
    key fpt makes from name (None: the call's place among this process's
    unnamed broadcasts). Every worker calls it for the same names in the
    same order; root must be 0."""
    if buf is None and not isinstance(keys, int) and not _is_key_list(keys):
        from . import _collective

        return _collective.broadcast(keys, root=root, name=name)
    keys, ck, cl, v = _tensors("fpt_broadcast", keys, buf, True)
    _node.check(_node.lib.fpt_broadcast(ck, len(keys), v.ptr, cl))
    _node.initialized.update(keys)


def push(keys, buf, priority=0):
    """FPTPush of the keys' values in buf (one key, or several end to end):
    returns a Request; buf must not change until it is done. With
    FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue it is done only
    once every worker has the iteration's sums (a retry may push buf again):
    push all of an iteration's keys before waiting for any of them."""
    keys, ck, cl, v = _tensors("fpt_push", keys, buf, False)
    fresh = [k for k in keys if k in _node.declared and k not in _node.initialized]
    if fresh and _node.started:
        # The library takes a key's first push as its init round (worker
        # 0's value, not a sum): refuse rather than return a wrong sum.
        raise StateError(_lib.ERR_STATE, "fpt_push: keys %s were never given starting values with fpt.init "
                         "(a key's first push would be its init round)" % fresh)
    req = _node.submit("push", keys, v.obj,
                       lambda cb, ud, ts: _node.lib.fpt_push(ck, len(keys), v.ptr, cl, priority, cb, ud, ts))
    _node.pushed = True
    return req


def pull(keys, buf):
    """FPTPull: the sums over the workers of the keys' next unpulled
    iteration into buf; returns a Request (buf holds them once it is done)."""
    keys, ck, cl, v = _tensors("fpt_pull", keys, buf, True)
    return _node.submit("pull", keys, v.obj,
                        lambda cb, ud, ts: _node.lib.fpt_pull(ck, len(keys), v.ptr, cl, cb, ud, ts))


def push_pull(keys, buf, out, priority=0):
    """FPTPushPull: pushes the keys' values in buf and gets the sums over
    the workers of that iteration into out (buf's size and type; it may be
    buf itself), in one request: returns a Request, done once out holds
    them. buf must not change, and out not be read, until then. One call
    and one wait where push then pull take two; the sums land in out once,
    never staged and copied."""
    keys, ck, cl, v = _tensors("fpt_push_pull", keys, buf, out is buf)
    fresh = [k for k in keys if k in _node.declared and k not in _node.initialized]
    if fresh and _node.started:
        raise StateError(_lib.ERR_STATE, "fpt_push_pull: keys %s were never given starting values with fpt.init "
                         "(a key's first push would be its init round)" % fresh)
    if out is buf:
        o = v
    else:
        _, _, _, o = _tensors("fpt_push_pull", keys, out, True)
        if o.nbytes != v.nbytes:
            raise SizeError(_lib.ERR_SIZE, "fpt_push_pull: out has %d bytes, buf %d" % (o.nbytes, v.nbytes))
        if o.dtype is not None and v.dtype is not None and o.dtype != v.dtype:
            raise ArgumentError(_lib.ERR_ARG, "fpt_push_pull: out holds %s, buf %s"
                                % (_buffers.DTYPE_NAMES[o.dtype], _buffers.DTYPE_NAMES[v.dtype]))
    req = _node.submit("push_pull", keys, (v.obj, o.obj),
                       lambda cb, ud, ts: _node.lib.fpt_push_pull(ck, len(keys), v.ptr, o.ptr, cl, priority, cb, ud,
                                                                  ts))
    _node.pushed = True
    return req


def _is_key_list(keys):
    return isinstance(keys, (list, tuple, range)) and all(isinstance(k, int) for k in keys)


def allreduce(tensor, step=None, name=None, op="sum"):
    """The sum over the workers of tensor (op="average": divided by the
    number of workers), in place, and returned: a tensor of any size, CPU
    or CUDA (copied through pinned host memory), float32, float64, float16
    or bfloat16. Keyed by name (None: the call's place among this process's
    unnamed allreduces): a name's first call declares and initialises its
    key on every worker (collective), later calls push and pull it. step,
    if given, numbers the calls of a name: it must grow from call to call
    (every worker passes the same steps). Blocks."""
    from . import _collective

    return _collective.allreduce(tensor, step=step, name=name, op=op)


def wait_all(requests):
    """Waits for every request; raises the first failure once all are done."""
    first = None
    for r in requests:
        try:
            r.wait()
        except FPTError as e:
            first = first or e
    if first is not None:
        raise first


def _excepthook(tp, value, tb, prev=sys.excepthook):
    _node.failed = True
    prev(tp, value, tb)


def _at_exit():
    """A program that ends without finalize: normally, finalize for it (the
    cluster is waiting for this worker to leave); after an uncaught
    exception, end the process at once, as a crash does, so the other
    nodes learn of it within the heartbeat timeout instead of waiting for
    pushes that will never come; the library's threads must not call back
    into an interpreter that is shutting down either."""
    if not _node.started or _node.finalized:
        return
    if _node.failed:

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    try:
        finalize()
    except FPTError as e:
        if not _node.cluster_failed:  # else the program was told already
            print("fpt: finalize at exit: %s" % e, file=sys.stderr)


sys.excepthook = _excepthook
atexit.register(_at_exit)

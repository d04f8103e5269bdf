"""fpt.allreduce and fpt.broadcast on tensors, without keys: each name gets
a key of its own, declared and initialised on every worker at its first
call, and its calls are its key's iterations (a sum per call)."""

import hashlib
import threading

import fpt
from . import _buffers

# Keys made from names lie in [KEY_BASE, KEY_BASE + 2**48): clear of small
# keys a program declares and of fpt.torch's (from 1 << 48, counting up).
KEY_BASE = 1 << 56


class _Name:
    """A name's key and what its calls must agree on."""

    __slots__ = ("key", "nbytes", "dtype", "pushes", "step", "host")

    def __init__(self, key, nbytes, dtype):
        self.key, self.nbytes, self.dtype = key, nbytes, dtype
        self.pushes, self.step, self.host = 0, None, None


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.names = {}  # (kind, name) -> _Name
        self.unnamed = {"allreduce": 0, "broadcast": 0}
        self.keys = {}  # key -> name, to catch two names hashing alike
        self.broadcasts = {}  # name -> its broadcasts so far


_state = _State()


def _key(kind, name):
    h = hashlib.blake2b(("%s:%s" % (kind, name)).encode("utf-8"), digest_size=6).digest()
    return KEY_BASE + int.from_bytes(h, "little")


def _torch():
    import torch

    return torch


def _check_tensor(op, t):
    torch = _torch()
    if not torch.is_tensor(t):
        raise TypeError("fpt.%s: takes a torch tensor, not %s" % (op, type(t).__name__))
    if t.is_sparse:
        raise TypeError("fpt.%s: the tensor is sparse; fpt sums dense tensors" % op)
    code = _buffers.dtype_code(t.dtype)
    if code is None:
        raise TypeError("fpt.%s: dtype %s is not one fpt sums (%s)" % (op, t.dtype, _buffers.SUMMABLE))
    if t.device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("fpt.%s: the tensor is on %s, and this torch has no CUDA" % (op, t.device))
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError("fpt.%s: the tensor is on %s; fpt takes CPU and CUDA tensors" % (op, t.device))
    return code


def _entry(kind, t, code, name, declare):
    """The name's record, made (and its key declared on every worker) at
    its first call."""
    with _state.lock:
        if name is None:
            name = "%s.%d" % (kind, _state.unnamed[kind])
            _state.unnamed[kind] += 1
        e = _state.names.get((kind, name))
    nbytes = t.numel() * t.element_size()
    if e is not None:
        if e.nbytes != nbytes or e.dtype != code:
            raise ValueError("fpt.%s: name %r was %d bytes of %s, this call has %d bytes of %s"
                             % (kind, name, e.nbytes, _buffers.DTYPE_NAMES[e.dtype], nbytes,
                                _buffers.DTYPE_NAMES[code]))
        return name, e
    key = _key(kind, name)
    other = _state.keys.get(key)
    if other is not None and other != (kind, name):
        raise ValueError("fpt.%s: names %r and %r make the same key; rename one" % (kind, other[1], name))
    e = _Name(key, nbytes, code)
    if declare:
        fpt.declare(key, nbytes, code, priority=0, _late=True)
        # Every worker has declared the key before any sends it.
        fpt.barrier()
    with _state.lock:
        _state.names[(kind, name)] = e
        _state.keys[key] = (kind, name)
    return name, e


def _host(e, t):
    """The CPU tensor the library reads and writes for t: t itself on the
    CPU (contiguous), else a pinned buffer made once per name."""
    torch = _torch()
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    if e.host is None:
        e.host = torch.empty(t.numel(), dtype=t.dtype, pin_memory=t.device.type == "cuda")
    return e.host


def _to_host(h, t):
    if h is not t:
        h.copy_(t.reshape(-1), non_blocking=False)


def _from_host(h, t):
    if h is not t:
        t.copy_(h.view(t.shape) if t.dim() else h.reshape(()), non_blocking=False)


def allreduce(t, step=None, name=None, op="sum"):
    torch = _torch()
    if op not in ("sum", "average"):
        raise ValueError("fpt.allreduce: op must be \"sum\" or \"average\", not %r" % (op,))
    code = _check_tensor("allreduce", t)
    if t.numel() == 0:
        return t
    fresh = name is None or ("allreduce", name) not in _state.names
    name, e = _entry("allreduce", t, code, name, declare=True)
    if step is not None:
        if e.step is not None and step <= e.step:
            raise ValueError("fpt.allreduce: name %r: step %d after step %d; steps must grow (every worker "
                             "passes the same)" % (name, step, e.step))
    h = _host(e, t)
    with torch.no_grad():
        if fresh:
            # The key's init round (its iteration 0): zeros, so that the
            # first call's push is summed.
            z = torch.zeros(t.numel(), dtype=t.dtype)
            fpt.init(e.key, z)
        _to_host(h, t)
        fpt.push_pull(e.key, h, h).wait()
        e.pushes += 1
        if step is not None:
            e.step = step
        if op == "average":
            h.div_(fpt.num_workers_at(e.pushes))
        _from_host(h, t)
    return t


def broadcast(t, root=0, name=None):
    torch = _torch()
    if root != 0:
        raise ValueError("fpt.broadcast: root must be 0 (fpt_init gives every worker worker 0's values), not %r"
                         % (root,))
    code = _check_tensor("broadcast", t)
    if t.numel() == 0:
        return t
    # A broadcast key is initialised once: each call of a name takes the
    # name's next key.
    with _state.lock:
        if name is None:
            name = "broadcast.%d" % _state.unnamed["broadcast"]
            _state.unnamed["broadcast"] += 1
        count = _state.broadcasts.get(name, 0)
        _state.broadcasts[name] = count + 1
    _, e = _entry("broadcast", t, code, "%s#%d" % (name, count), declare=True)
    h = _host(e, t)
    with torch.no_grad():
        _to_host(h, t)
        fpt.broadcast(e.key, h)
        _from_host(h, t)
    return t

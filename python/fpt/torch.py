"""Data-parallel PyTorch training over fpt, as Horovod's API does it::

    import fpt, fpt.torch
    fpt.start()
    opt = fpt.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters())
    fpt.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    fpt.torch.broadcast_optimizer_state(opt, root_rank=0)
    ... loss.backward(); opt.step() ...
    fpt.finalize()

Every worker makes these calls in the same order (each takes fresh keys,
and every key is declared before the first push). Only root_rank=0 is
supported: fpt_init gives every worker worker 0's values, so another root
is refused with ValueError. float32, float64, float16 and bfloat16
tensors, on the CPU or on one CUDA device per process (copied through
pinned host memory on a side stream). comm_hook moves a
DistributedDataParallel model's buckets through fpt instead.

A worker may join the running job (started with the job's environment while
it runs) with the same script: these calls register the model's tensors as
the job's parameters source (fpt.set_params_source; params_source is it),
so on a joiner DistributedOptimizer and broadcast_parameters give the
model the parameters the others have at the start of the iteration it
joins at, and its steps are numbered from there (fpt.start_iteration()).
broadcast_optimizer_state gives a joiner the optimizer's state and numbers
(lr included) as they are then; state the optimizer made after it
(momentum buffers, moments made while training) is not handed over, and a
worker with such state refuses to hand over the parameters: the join fails
rather than let the joiner step differently from the others.
"""

import queue
import threading

import torch

import fpt
from fpt import _buffers

# fpt.torch's keys start here, clear of small keys a program declares itself.
KEY_BASE = 1 << 48
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_compression(compression, what):
    if compression not in _buffers.WIRES:
        raise ValueError("fpt.torch.%s: compression must be None, \"bf16\" or \"fp16\", not %r" % (what, compression))
    return compression if _buffers.WIRES[compression] else None


def _check_params(params, what):
    """The one device of params ((name, tensor) pairs), refusing what fpt
    cannot sum, naming the parameter: a dtype it has no sum for, a model
    spread over devices, a device other than the CPU or CUDA, CUDA where
    this torch has none."""
    device = None
    for n, p in params:
        if p.dtype not in _DTYPES:
            raise TypeError("fpt.torch.%s: parameter %s is %s; fpt sums %s" % (what, n, p.dtype, _buffers.SUMMABLE))
        if p.is_sparse:
            raise TypeError("fpt.torch.%s: parameter %s is sparse; fpt sums dense tensors" % (what, n))
        if p.device.type not in ("cpu", "cuda"):
            raise TypeError("fpt.torch.%s: parameter %s is on %s; fpt takes CPU and CUDA tensors" % (what, n, p.device))
        if p.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("fpt.torch.%s: parameter %s is on %s, and this torch has no CUDA" % (what, n, p.device))
        if device is None:
            device, first = p.device, n
        elif p.device != device:
            raise ValueError("fpt.torch.%s: parameter %s is on %s and %s on %s: one device per process (as with "
                             "DistributedDataParallel)" % (what, first, device, n, p.device))
    return device if device is not None else torch.device("cpu")


class _Keys:
    """Fresh keys, the same sequence on every worker that asks in the same
    order."""

    def __init__(self):
        self.next = KEY_BASE

    def take(self, n):
        first, self.next = self.next, self.next + n
        return list(range(first, first + n))


_keys = _Keys()

# key -> a function giving the key's current values, as pushed (flat, in
# the key's declared dtype): what a joining worker starts from.
_sources = {}


def params_source(iteration, key):
    """The parameters source fpt.torch registers: key's current values
    (a model parameter or a broadcast tensor, taken as they are when the
    library asks, at the start of the iteration a worker joins at). A
    program that declares keys of its own registers a source that covers
    them and calls this one for fpt.torch's."""
    get = _sources.get(key)
    if get is None:
        raise KeyError("fpt.torch: key %d is not one of fpt.torch's: register a source with fpt.set_params_source "
                       "that covers the keys the program declared itself" % key)
    return get()


def _register(keys, getters):
    """Makes getters[i]() the parameters of keys[i] for a joining worker."""
    _sources.update(zip(keys, getters))
    fpt.set_params_source(params_source)


def _check_root(root_rank, what):
    if root_rank != 0:
        raise ValueError("fpt.torch.%s: root_rank must be 0 (fpt_init gives every worker worker 0's values), not %r"
                         % (what, root_rank))


def _state_entries(optimizer):
    """How many entries (momentum buffers, moments, step counts) an
    optimizer's state holds."""
    return sum(1 for st in optimizer.state.values() for v in st.values() if v is not None)


def _broadcast(tensors, current=None):
    """Gives every tensor worker 0's values, in place: one fpt_broadcast per
    dtype over fresh keys, through one flat buffer per dtype. Tensors of
    other types travel as float64 (exact for integers below 2**53).
    current[i]() is tensor i's value as it is later, for a joining worker
    (default: the tensor itself)."""
    groups = {}
    for i, t in enumerate(tensors):
        wire = t.dtype if t.dtype in _DTYPES else torch.float64
        get = current[i] if current is not None else (lambda t=t: t)
        groups.setdefault(wire, []).append((t, get))
    with torch.no_grad():
        for wire, pairs in groups.items():
            ts = [t for t, _ in pairs]
            keys = _keys.take(len(ts))
            for k, t in zip(keys, ts):
                fpt.declare(k, t.numel() * torch.empty((), dtype=wire).element_size(), str(wire), priority=0)
            # A joiner's init gives these tensors' values when it joins.
            _register(keys, [lambda get=get, wire=wire: get().detach().reshape(-1).to("cpu", wire).contiguous()
                             for _, get in pairs])
            # On the host, whatever device the tensors are on (fpt reads
            # host memory); copied back to each tensor's device below.
            flat = (torch.cat([t.detach().reshape(-1).to("cpu", wire) for t in ts]) if ts
                    else torch.empty(0, dtype=wire))
            fpt.broadcast(keys, flat)
            off = 0
            for t in ts:
                n = t.numel()
                t.copy_(flat[off:off + n].view_as(t).to(t.dtype))
                off += n


def broadcast_parameters(params, root_rank=0):
    """Sets every worker's tensors (a state_dict, or (name, tensor) pairs
    such as named_parameters()) to worker 0's, in place. Collective."""
    _check_root(root_rank, "broadcast_parameters")
    items = list(params.items()) if isinstance(params, dict) else list(params)
    _broadcast([t for _, t in items if torch.is_tensor(t)])


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Sets every worker's optimizer state (state tensors and numbers, and
    the param groups' numeric hyperparameters such as lr) to worker 0's.
    Every worker must have the same state entries: call it before
    training, or after loading the same checkpoint structure everywhere."""
    _check_root(root_rank, "broadcast_optimizer_state")
    sd, tensors, scalars, setters = _optimizer_values(optimizer)
    nums = torch.tensor(scalars, dtype=torch.float64)

    def current(i):
        # For a joiner, the optimizer's values when it joins, read in the
        # same order (load_state_dict below copies the tensors).
        def get():
            _, ts, sc, _ = _optimizer_values(optimizer)
            return ts[i] if i < len(ts) else torch.tensor(sc, dtype=torch.float64)
        return get

    _broadcast(tensors + [nums], [current(i) for i in range(len(tensors) + 1)])
    for (d, name, tp), v in zip(setters, nums.tolist()):
        d[name] = tp(v)
    optimizer.load_state_dict(sd)
    optimizer._fpt_state_broadcast = _state_entries(optimizer)


def _optimizer_values(optimizer):
    """An optimizer's state dict, its state tensors and its numbers (the
    param groups' numeric hyperparameters, then the state's numbers) in a
    fixed order, and where each number goes back."""
    sd = optimizer.state_dict()
    tensors, scalars, setters = [], [], []
    for group in sd["param_groups"]:
        for name in sorted(group):
            v = group[name]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                scalars.append(float(v))
                setters.append((group, name, type(v)))
    for pid in sorted(sd["state"]):
        st = sd["state"][pid]
        for name in sorted(st):
            v = st[name]
            if torch.is_tensor(v):
                tensors.append(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                scalars.append(float(v))
                setters.append((st, name, type(v)))
    return sd, tensors, scalars, setters


class _CUDA:
    """The CUDA calls of the staged path, for a device."""

    def __init__(self, device):
        self.device = device

    def stream(self):
        return torch.cuda.Stream(device=self.device)

    def event(self):
        return torch.cuda.Event()

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def on(self, stream):
        return torch.cuda.stream(stream)

    def pinned(self, n, dtype):
        return torch.zeros(n, dtype=dtype, pin_memory=True)


class _NoStream:
    """A stream and event that are already done: the staged path on CPU
    tensors (tests run the CUDA path's logic with it)."""

    def wait_stream(self, _):
        pass

    def wait_event(self, _):
        pass

    def record(self, _=None):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


class _HostStaging:
    """_CUDA's interface over CPU tensors."""

    def stream(self):
        return _NoStream()

    event = current_stream = stream

    def on(self, _):
        return _NoStream()

    def pinned(self, n, dtype):
        return torch.zeros(n, dtype=dtype)


class _Bucket:
    """Consecutive parameters of one dtype (in backward order) whose
    gradients lie end to end in one flat buffer: pushed in one request
    once the last of them is ready."""

    def __init__(self, dtype):
        self.dtype, self.members, self.lo, self.hi, self.ready = dtype, [], 0, 0, 0
        # The CUDA path's: the copy to pinned memory done (side stream),
        # the sums back on the device (side stream), the exchange over.
        self.copied = self.back = None
        self.done = threading.Event()
        self.error = None


class _Mover:
    """The CUDA path's background thread: for each bucket handed to it, it
    waits for the bucket's copy to pinned memory, pushes and pulls it, and
    copies the sums back to the device on the side stream. The training
    thread never waits for the network, only step() for what it needs."""

    def __init__(self, ops, stream):
        self.ops, self.stream, self.q = ops, stream, queue.Queue()
        self.thread = threading.Thread(target=self.run, name="fpt.torch mover", daemon=True)
        self.thread.start()

    def run(self):
        while True:
            job = self.q.get()
            if job is None:
                return
            b, host_grads, host_sums, dev_sums, wire = job
            try:
                b.copied.synchronize()  # this thread waits, not a stream
                fpt.push_pull(b.keys, host_grads, host_sums, b.priority).wait()
                with self.ops.on(self.stream):
                    if wire is not None:  # the 16-bit sums widened on the device
                        wire.copy_(host_sums, non_blocking=True)
                        dev_sums.copy_(wire)
                    else:
                        dev_sums.copy_(host_sums, non_blocking=True)
                    b.back.record(self.stream)
            except BaseException as e:  # noqa: BLE001 - handed to step()
                b.error = e
            b.done.set()

class _Distributed:
    """The methods a DistributedOptimizer adds to the optimizer's class."""

    def _fpt_setup(self, named_parameters, bucket_bytes, compression=None, backward_passes_per_step=1,
                   stage_on_host=False):
        named = list(named_parameters) if named_parameters is not None else [
            ("param%d" % i, p) for i, p in enumerate(p for g in self.param_groups for p in g["params"])]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("fpt.torch.DistributedOptimizer: parameter names are not unique")
        if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
            raise ValueError("fpt.torch.DistributedOptimizer: backward_passes_per_step must be a positive integer, "
                             "not %r" % (backward_passes_per_step,))
        self._fpt_passes = int(backward_passes_per_step)
        compression = _check_compression(compression, "DistributedOptimizer")
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        params = [(n, p) for n, p in named if p.requires_grad and id(p) in mine]
        self._fpt_device = device = _check_params(params, "DistributedOptimizer")
        # The staged path (a copy to host memory, the exchange on a thread,
        # the copy back): CUDA models', or CPU ones' where a test asks.
        self._fpt_cuda = device.type == "cuda" or stage_on_host
        ops = self._fpt_ops = _CUDA(device) if device.type == "cuda" else _HostStaging()
        self._fpt_params = params
        keys = _keys.take(len(params))
        self._fpt_keys = keys
        # Buckets in backward order (the reverse of the parameters'), so that
        # a bucket fills as the backward pass goes; each gradient lives in
        # its bucket's stretch of a flat buffer per dtype, so a bucket is
        # pushed as one request without copying.
        self._fpt_buckets, self._fpt_bucket_of, self._fpt_slot = [], {}, {}
        size = {}
        for i in reversed(range(len(params))):
            p = params[i][1]
            nbytes = p.numel() * p.element_size()
            b = self._fpt_buckets[-1] if self._fpt_buckets else None
            if b is None or b.dtype != p.dtype or (b.hi - b.lo) * p.element_size() + nbytes > max(bucket_bytes, 1):
                b = _Bucket(p.dtype)
                b.lo = b.hi = size.get(p.dtype, 0)
                self._fpt_buckets.append(b)
            b.members.append(i)
            self._fpt_bucket_of[i] = b
            self._fpt_slot[i] = (b.hi, p.numel())
            b.hi += p.numel()
            size[p.dtype] = b.hi
        # The gradients on the model's device; the sums where the library
        # writes them: in host memory (pinned, made once, for a CUDA
        # model, which also gets its gradients' pinned copies and its sums
        # on the device).
        self._fpt_grads = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in size.items()}
        # What each dtype travels as: compressed float32 goes as 16-bit.
        wire_of = {dt: dt for dt in size}
        if compression is not None and torch.float32 in wire_of:
            wire_of[torch.float32] = torch.bfloat16 if _buffers.WIRES[compression] == fpt.BFLOAT16 else torch.float16
        # The staged path narrows on the device, before the copy to host
        # (half the bytes over PCIe), into a device buffer of the wire type
        # that also takes the sums back before they are widened; its keys
        # are declared as the wire type. The direct path leaves it to the
        # library (a compressed key).
        self._fpt_wire = wire_of if self._fpt_cuda else {dt: dt for dt in size}
        if self._fpt_cuda:
            w = self._fpt_wire
            self._fpt_sums = {dt: ops.pinned(n, w[dt]) for dt, n in size.items()}
            self._fpt_host_grads = {dt: ops.pinned(n, w[dt]) for dt, n in size.items()}
            self._fpt_dev_sums = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in size.items()}
            self._fpt_dev_wire = {dt: torch.zeros(n, dtype=w[dt], device=device) for dt, n in size.items()
                                  if w[dt] != dt}
            self._fpt_stream = ops.stream()
            self._fpt_mover = _Mover(ops, self._fpt_stream)
            for b in self._fpt_buckets:
                b.copied, b.back = ops.event(), ops.event()
        else:
            self._fpt_sums = {dt: torch.zeros(n, dtype=dt) for dt, n in size.items()}
        for i, (n, p) in enumerate(params):
            # Earlier layers first: their gradients come last in the
            # backward pass and are needed first by the next forward pass.
            wire = self._fpt_wire[p.dtype]
            if wire != p.dtype:
                fpt.declare(keys[i], p.numel() * torch.empty((), dtype=wire).element_size(), str(wire), -i)
            else:
                fpt.declare(keys[i], p.numel() * p.element_size(), str(p.dtype), -i,
                            compression=compression if p.dtype == torch.float32 else None)
        for b in self._fpt_buckets:
            b.keys = [keys[i] for i in b.members]
            b.priority = -min(b.members)
        # A gradient key's parameters, for a worker joining the job, are its
        # parameter's values: its init gives the joiner the model.
        _register(keys, [lambda p=p: self._fpt_handed(p, self._fpt_wire[p.dtype]) for _, p in params])
        # The keys' init round (fpt_init is each key's iteration 0), so that
        # the first gradient push is summed.
        for dt in size:
            ks = [k for b in self._fpt_buckets if b.dtype == dt for k in b.keys]
            fpt.init(ks, self._fpt_sums[dt])
        # Every key is pushed once a step, so they share an iteration
        # number: 1 after init, or on a joiner the iteration it joined at.
        self._fpt_iteration = fpt.start_iteration()
        if fpt.joined():
            with torch.no_grad():
                for i, (_, p) in enumerate(params):
                    p.copy_(self._fpt_view(i, self._fpt_sums[p.dtype]).to(device))
        with torch.no_grad():
            for i, (_, p) in enumerate(params):
                view = self._fpt_view(i)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        self._fpt_handles = []
        self._fpt_ready = set()
        self._fpt_passes_seen = [0] * len(params)
        self._fpt_hooks = []
        for i, (_, p) in enumerate(params):
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch 2.1 and later
                self._fpt_hooks.append(p.register_post_accumulate_grad_hook(self._fpt_make_hook(i)))
                continue
            acc = p.expand_as(p).grad_fn.next_functions[0][0]  # p's AccumulateGrad node
            acc.register_hook(self._fpt_make_hook(i))
            self._fpt_hooks.append(acc)  # the node must outlive the hook

    def _fpt_view(self, i, flat=None):
        lo, n = self._fpt_slot[i]
        p = self._fpt_params[i][1]
        return (flat if flat is not None else self._fpt_grads[p.dtype])[lo:lo + n].view_as(p)

    def _fpt_make_hook(self, i):
        def hook(*_):
            self._fpt_passes_seen[i] += 1
            if self._fpt_passes_seen[i] < self._fpt_passes:
                return  # accumulating: the gradient goes with the last pass
            self._fpt_ready_grad(i)
        return hook

    def _fpt_ready_grad(self, i):
        """Parameter i's gradient is complete: once its bucket is, push the
        bucket and ask for its sum."""
        name, p = self._fpt_params[i]
        if i in self._fpt_ready:
            raise RuntimeError("fpt.torch: the gradient of %s was computed %d times before step(); "
                               "DistributedOptimizer(backward_passes_per_step=%d) expects %d"
                               % (name, self._fpt_passes_seen[i], self._fpt_passes, self._fpt_passes))
        g = p.grad
        # Checked before anything of the bucket goes: a bad gradient leaves
        # nothing pushed.
        if p.device != self._fpt_device:
            raise RuntimeError("fpt.torch: parameter %s moved to %s after DistributedOptimizer was made on %s"
                               % (name, p.device, self._fpt_device))
        if g is not None and g.is_sparse:
            raise TypeError("fpt.torch: the gradient of %s is sparse; fpt sums dense gradients (an nn.Embedding "
                            "with sparse=False)" % name)
        if g is not None and (g.device != self._fpt_device or g.dtype != p.dtype):
            raise TypeError("fpt.torch: the gradient of %s is %s on %s, its parameter %s on %s"
                            % (name, g.dtype, g.device, p.dtype, self._fpt_device))
        self._fpt_ready.add(i)
        view = self._fpt_view(i)
        if g is None or g.data_ptr() != view.data_ptr():
            # zero_grad(set_to_none=True), a gradient replaced or not
            # contiguous: copy it into its place once, and keep
            # accumulating there.
            with torch.no_grad():
                view.copy_(g) if g is not None else view.zero_()
            p.grad = view
        b = self._fpt_bucket_of[i]
        b.ready += 1
        if b.ready == len(b.members):
            self._fpt_send(b)

    def _fpt_send(self, b):
        grads, sums = self._fpt_grads[b.dtype][b.lo:b.hi], self._fpt_sums[b.dtype][b.lo:b.hi]
        if not self._fpt_cuda:
            self._fpt_handles.append((fpt.push_pull(b.keys, grads, sums, b.priority),))
            return
        # The copy to pinned memory goes on the side stream once the stream
        # that made the gradient is done with it (a stream waiting for a
        # stream: the host never blocks); the mover thread waits for it.
        host = self._fpt_host_grads[b.dtype][b.lo:b.hi]
        dw = self._fpt_dev_wire.get(b.dtype)
        narrow = dw[b.lo:b.hi] if dw is not None else None
        side = self._fpt_stream
        side.wait_stream(self._fpt_ops.current_stream())
        with self._fpt_ops.on(side):
            if narrow is not None:
                narrow.copy_(grads)  # rounded to the wire type on the device
                host.copy_(narrow, non_blocking=True)
            else:
                host.copy_(grads, non_blocking=True)
            b.copied.record(side)
        b.done.clear()
        b.error = None
        self._fpt_handles.append(b)
        self._fpt_mover.q.put((b, host, sums, self._fpt_dev_sums[b.dtype][b.lo:b.hi], narrow))

    def _fpt_handed(self, p, wire):
        """Parameter p for a joining worker, unless the optimizer holds
        state the joiner would lack: entries made while training (momentum
        buffers, moments) that no broadcast_optimizer_state covered. Without
        them the joiner would step differently from the others for good, so
        the join fails instead, saying why here and with the source's status
        on the joiner."""
        now, broadcast = _state_entries(self), getattr(self, "_fpt_state_broadcast", 0)
        if now > broadcast:
            raise RuntimeError(
                "fpt.torch: a worker joins the running job, but the optimizer's state holds %d entries (momentum "
                "buffers, moments...) and only %d were broadcast by broadcast_optimizer_state: fpt.torch hands over "
                "the parameters and broadcast tensors, not state the optimizer made while training, and a joiner "
                "without it would step differently from the others. Use an optimizer without such state, or hand it "
                "over yourself (keys declared before the first push, and a source that covers them and "
                "fpt.torch.params_source)" % (now, broadcast))
        return p.detach().to("cpu", wire).contiguous()

    def synchronize(self):
        """Waits for every gradient's sum and sets each gradient to the
        average over the workers. step() calls it; call it yourself before
        changing gradients (clipping), as the pushes read them."""
        for i in range(len(self._fpt_params)):
            if i not in self._fpt_ready:  # no gradient this step: its current value
                self._fpt_ready_grad(i)
        first = None
        for h in self._fpt_handles:
            if self._fpt_cuda:
                h.done.wait()
                first = first or h.error
                # The default stream waits for the copy back, the host not.
                self._fpt_ops.current_stream().wait_event(h.back)
            else:
                try:
                    fpt.wait_all(h)
                except fpt.FPTError as e:
                    first = first or e
        if first is not None:
            raise first
        # All of them, unless a worker was lost under
        # FPT_ON_WORKER_LOSS=continue.
        workers = fpt.num_workers_at(self._fpt_iteration)
        self._fpt_iteration += 1
        sums = self._fpt_dev_sums if self._fpt_cuda else self._fpt_sums
        for dt, grads in self._fpt_grads.items():
            torch.div(sums[dt], workers, out=grads)
        for b in self._fpt_buckets:
            b.ready = 0
        self._fpt_handles, self._fpt_ready = [], set()
        self._fpt_passes_seen = [0] * len(self._fpt_params)
        self._fpt_synced = True

    def step(self, closure=None):
        if not getattr(self, "_fpt_synced", False):
            self.synchronize()
        self._fpt_synced = False
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None, bucket_bytes=1 << 20, compression=None,
                         backward_passes_per_step=1, _stage_on_host=False):
    """Makes optimizer average its gradients over the workers. Gradients
    live end to end in one flat buffer per dtype (each parameter's .grad is
    a view of it), grouped in buckets of up to bucket_bytes in backward
    order: a bucket is pushed, without copying, as soon as backward has
    accumulated all of its gradients, at the priority of its earliest layer
    (earlier layers first); bucket_bytes=0 pushes each gradient alone.
    step() waits for the sums and divides them by the number of workers
    whose gradients they add up (fpt.num_workers_at) before stepping. Returns
    the same optimizer object (its class becomes a subclass of its own, so
    LR schedulers still accept it). Collective: declares and initialises
    the gradients' keys on every worker. It registers the parameters as the
    job's parameters source: on a worker joining the running job, it sets
    them to the others' and numbers its steps from the join iteration.

    A CUDA model (every parameter on one device): each bucket is copied to
    a pinned host buffer on a side stream as soon as it is ready, pushed
    and pulled from there by a background thread, and the sums copied back
    on the side stream; step() makes the default stream wait for them (the
    host never waits for the GPU) and averages on the GPU.
    compression="bf16" or "fp16" sends float32 gradients as 16-bit values
    (half the bytes; aggregators sum in float32 and round once).
    backward_passes_per_step=k accumulates the gradients of k backward
    passes (their sum) before they are exchanged, as Horovod's option of
    that name does: call step() after every k-th."""
    base = optimizer.__class__
    cls = type("Distributed" + base.__name__, (base,), {k: v for k, v in vars(_Distributed).items()
                                                        if not k.startswith("__")})
    optimizer.__class__ = cls
    # _stage_on_host: a CPU model takes the CUDA path (copies to host
    # buffers, the exchange on the background thread), for the tests.
    optimizer._fpt_setup(named_parameters, bucket_bytes, compression, backward_passes_per_step, _stage_on_host)
    return optimizer


class CommHookState:
    """comm_hook's state for one DistributedDataParallel model: a key per
    parameter (declared and initialised on every worker when it is made:
    collective, before the first backward), pinned host buffers per bucket
    for a CUDA model (made at a bucket's first exchange, reused after), and
    the thread that completes the buckets' futures. DDP's buckets may
    change after its first iteration; keys per parameter do not."""

    def __init__(self, model, compression=None):
        compression = _check_compression(compression, "CommHookState")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.device = _check_params(named, "CommHookState")
        self.names = {id(p): n for n, p in named}
        keys = _keys.take(len(named))
        self.key_of = {id(p): k for (_, p), k in zip(named, keys)}
        by_dtype = {}
        for (n, p), k in zip(named, keys):
            fpt.declare(k, p.numel() * p.element_size(), str(p.dtype), 0,
                        compression=compression if p.dtype == torch.float32 else None)
            by_dtype.setdefault(p.dtype, []).append((k, p))
        for dt, kp in by_dtype.items():
            fpt.init([k for k, _ in kp], torch.zeros(sum(p.numel() for _, p in kp), dtype=dt))
        self.iteration = fpt.start_iteration()  # of the next exchange
        self.iterations = {}  # key -> the iteration its next push is
        self.buffers = {}  # a bucket's keys -> its host buffers (CUDA)
        self.q = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="fpt.torch comm hook", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            job = self.q.get()
            if job is None:
                return
            keys, grads, sums, fut, out, it, stream, copied = job
            try:
                if copied is not None:
                    copied.synchronize()  # this thread waits for the copy, not a stream
                fpt.push_pull(keys, grads, sums).wait()
                workers = fpt.num_workers_at(it)
                if stream is None:
                    out = sums.div_(workers)
                else:
                    with torch.cuda.stream(stream):
                        out.copy_(sums, non_blocking=True)
                        out.div_(workers)
                    stream.synchronize()  # this thread waits, before the future completes
                fut.set_result(out)
            except BaseException as e:  # noqa: BLE001 - the future carries it to DDP
                fut.set_exception(e)


def comm_hook(state, bucket):
    """A DistributedDataParallel communication hook that exchanges DDP's
    gradient buckets through fpt rather than DDP's process group:
    ddp_model.register_comm_hook(fpt.torch.CommHookState(ddp_model), fpt.torch.comm_hook).
    Each bucket is pushed (its parameters' keys, one request) and pulled;
    the returned future completes with the average over the workers. DDP
    still needs its process group for what it does outside the hook: the
    broadcast of the model at construction (and of buffers before each
    forward, unless broadcast_buffers=False)."""
    buf = bucket.buffer()
    params = bucket.parameters()
    keys = []
    for p in params:
        k = state.key_of.get(id(p))
        if k is None:
            raise ValueError("fpt.torch.comm_hook: a parameter of DDP's bucket %d is not one CommHookState knows: "
                             "make the state from the same model" % bucket.index())
        keys.append(k)
    if sum(p.numel() for p in params) != buf.numel() or not buf.is_contiguous():
        raise ValueError("fpt.torch.comm_hook: DDP's bucket %d holds %d elements, its parameters %d: a layout "
                         "fpt cannot map to its keys" % (bucket.index(), buf.numel(), sum(p.numel() for p in params)))
    # Every key of a bucket is in the same iteration: DDP exchanges every
    # bucket once per backward.
    it = state.iterations.get(keys[0], state.iteration)
    for k in keys:
        state.iterations[k] = it + 1
    fut = torch.futures.Future(devices=[buf.device]) if buf.device.type == "cuda" else torch.futures.Future()
    if buf.device.type == "cpu":
        grads = buf
        sums = torch.empty_like(buf)
        stream = None
    else:
        hb = state.buffers.get(tuple(keys))
        if hb is None:
            stream = torch.cuda.Stream(device=buf.device)
            hb = state.buffers[tuple(keys)] = (torch.empty(buf.numel(), dtype=buf.dtype, pin_memory=True),
                                               torch.empty(buf.numel(), dtype=buf.dtype, pin_memory=True), stream)
        grads, sums, stream = hb
        # After the stream that made the bucket, the copy on the side
        # stream; the hook's thread waits for it, not this one.
        stream.wait_stream(torch.cuda.current_stream(buf.device))
        with torch.cuda.stream(stream):
            grads.copy_(buf.reshape(-1), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
    state.q.put((keys, grads, sums, fut, buf, it, stream, copied if stream is not None else None))
    return fut

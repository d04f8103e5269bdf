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
is refused with ValueError. float32, float64 and float16 tensors.

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

import torch

import fpt

# fpt.torch's keys start here, clear of small keys a program declares itself.
KEY_BASE = 1 << 48
_DTYPES = (torch.float32, torch.float64, torch.float16)


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
            _register(keys, [lambda get=get, wire=wire: get().detach().reshape(-1).to(wire).contiguous()
                             for _, get in pairs])
            flat = torch.cat([t.detach().reshape(-1).to(wire) for t in ts]) if ts else torch.empty(0, dtype=wire)
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


class _Bucket:
    """Consecutive parameters of one dtype (in backward order) whose
    gradients lie end to end in one flat buffer: pushed in one request
    once the last of them is ready."""

    def __init__(self, dtype):
        self.dtype, self.members, self.lo, self.hi, self.ready = dtype, [], 0, 0, 0


class _Distributed:
    """The methods a DistributedOptimizer adds to the optimizer's class."""

    def _fpt_setup(self, named_parameters, bucket_bytes):
        named = list(named_parameters) if named_parameters is not None else [
            ("param%d" % i, p) for i, p in enumerate(p for g in self.param_groups for p in g["params"])]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("fpt.torch.DistributedOptimizer: parameter names are not unique")
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        params = [(n, p) for n, p in named if p.requires_grad and id(p) in mine]
        for n, p in params:
            if p.dtype not in _DTYPES or p.device.type != "cpu":
                raise TypeError("fpt.torch.DistributedOptimizer: parameter %s is %s on %s; fpt takes CPU float32, "
                                "float64 and float16" % (n, p.dtype, p.device))
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
        self._fpt_grads = {dt: torch.zeros(n, dtype=dt) for dt, n in size.items()}
        self._fpt_sums = {dt: torch.zeros(n, dtype=dt) for dt, n in size.items()}
        for i, (n, p) in enumerate(params):
            # Earlier layers first: their gradients come last in the
            # backward pass and are needed first by the next forward pass.
            fpt.declare(keys[i], p.numel() * p.element_size(), str(p.dtype), -i)
        for b in self._fpt_buckets:
            b.keys = [keys[i] for i in b.members]
            b.priority = -min(b.members)
        # A gradient key's parameters, for a worker joining the job, are its
        # parameter's values: its init gives the joiner the model.
        _register(keys, [lambda p=p: self._fpt_handed(p) for _, p in params])
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
                    p.copy_(self._fpt_view(i, self._fpt_sums[p.dtype]))
        with torch.no_grad():
            for i, (_, p) in enumerate(params):
                view = self._fpt_view(i)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        self._fpt_handles = []
        self._fpt_ready = set()
        self._fpt_hooks = []
        for i, (_, p) in enumerate(params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]  # p's AccumulateGrad node
            acc.register_hook(self._fpt_make_hook(i))
            self._fpt_hooks.append(acc)  # the node must outlive the hook

    def _fpt_view(self, i, flat=None):
        lo, n = self._fpt_slot[i]
        p = self._fpt_params[i][1]
        return (flat if flat is not None else self._fpt_grads[p.dtype])[lo:lo + n].view_as(p)

    def _fpt_make_hook(self, i):
        def hook(*_):
            self._fpt_ready_grad(i)
        return hook

    def _fpt_ready_grad(self, i):
        """Parameter i's gradient is complete: once its bucket is, push the
        bucket and ask for its sum."""
        name, p = self._fpt_params[i]
        if i in self._fpt_ready:
            raise RuntimeError("fpt.torch: the gradient of %s was computed twice before step() "
                               "(gradient accumulation over several backward passes is not supported)" % name)
        self._fpt_ready.add(i)
        view = self._fpt_view(i)
        g = p.grad
        if g is None or g.data_ptr() != view.data_ptr():
            # zero_grad(set_to_none=True) or a gradient replaced: copy it into
            # its place once, and keep accumulating there.
            with torch.no_grad():
                view.copy_(g) if g is not None else view.zero_()
            p.grad = view
        b = self._fpt_bucket_of[i]
        b.ready += 1
        if b.ready == len(b.members):
            self._fpt_send(b)

    def _fpt_send(self, b):
        grads, sums = self._fpt_grads[b.dtype][b.lo:b.hi], self._fpt_sums[b.dtype][b.lo:b.hi]
        self._fpt_handles.append((fpt.push(b.keys, grads, b.priority), fpt.pull(b.keys, sums)))

    def _fpt_handed(self, p):
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
        return p.detach().contiguous()

    def synchronize(self):
        """Waits for every gradient's sum and sets each gradient to the
        average over the workers. step() calls it; call it yourself before
        changing gradients (clipping), as the pushes read them."""
        for i in range(len(self._fpt_params)):
            if i not in self._fpt_ready:  # no gradient this step: its current value
                self._fpt_ready_grad(i)
        for push, pull in self._fpt_handles:
            push.wait()
            pull.wait()
        # All of them, unless a worker was lost under
        # FPT_ON_WORKER_LOSS=continue.
        workers = fpt.num_workers_at(self._fpt_iteration)
        self._fpt_iteration += 1
        for dt, grads in self._fpt_grads.items():
            torch.div(self._fpt_sums[dt], workers, out=grads)
        for b in self._fpt_buckets:
            b.ready = 0
        self._fpt_handles, self._fpt_ready = [], set()
        self._fpt_synced = True

    def step(self, closure=None):
        if not getattr(self, "_fpt_synced", False):
            self.synchronize()
        self._fpt_synced = False
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None, bucket_bytes=1 << 20):
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
    them to the others' and numbers its steps from the join iteration."""
    base = optimizer.__class__
    cls = type("Distributed" + base.__name__, (base,), {k: v for k, v in vars(_Distributed).items()
                                                        if not k.startswith("__")})
    optimizer.__class__ = cls
    optimizer._fpt_setup(named_parameters, bucket_bytes)
    return optimizer

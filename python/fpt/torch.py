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


def _check_root(root_rank, what):
    if root_rank != 0:
        raise ValueError("fpt.torch.%s: root_rank must be 0 (fpt_init gives every worker worker 0's values), not %r"
                         % (what, root_rank))


def _broadcast(tensors):
    """Gives every tensor worker 0's values, in place: one fpt_init per
    dtype over fresh keys, through one flat buffer per dtype. Tensors of
    other types travel as float64 (exact for integers below 2**53)."""
    groups = {}
    for t in tensors:
        wire = t.dtype if t.dtype in _DTYPES else torch.float64
        groups.setdefault(wire, []).append(t)
    with torch.no_grad():
        for wire, ts in groups.items():
            keys = _keys.take(len(ts))
            for k, t in zip(keys, ts):
                fpt.declare(k, t.numel() * torch.empty((), dtype=wire).element_size(), str(wire), priority=0)
            flat = torch.cat([t.detach().reshape(-1).to(wire) for t in ts]) if ts else torch.empty(0, dtype=wire)
            fpt.init(keys, flat)
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
    nums = torch.tensor(scalars, dtype=torch.float64)
    _broadcast(tensors + [nums])
    for (d, name, tp), v in zip(setters, nums.tolist()):
        d[name] = tp(v)
    optimizer.load_state_dict(sd)


class _Distributed:
    """The methods a DistributedOptimizer adds to the optimizer's class."""

    def _fpt_setup(self, named_parameters):
        named = list(named_parameters) if named_parameters is not None else [
            ("param%d" % i, p) for i, p in enumerate(p for g in self.param_groups for p in g["params"])]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("fpt.torch.DistributedOptimizer: parameter names are not unique")
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        self._fpt_params = [(n, p) for n, p in named if p.requires_grad and id(p) in mine]
        for n, p in self._fpt_params:
            if p.dtype not in _DTYPES or p.device.type != "cpu":
                raise TypeError("fpt.torch.DistributedOptimizer: parameter %s is %s on %s; fpt takes CPU float32, "
                                "float64 and float16" % (n, p.dtype, p.device))
        self._fpt_workers = fpt.num_workers()
        self._fpt_keys = _keys.take(len(self._fpt_params))
        # Earlier layers first: their gradients come last in the backward
        # pass and are needed first by the next forward pass.
        self._fpt_prio = [-i for i in range(len(self._fpt_params))]
        self._fpt_sums = [torch.empty_like(p, memory_format=torch.contiguous_format) for _, p in self._fpt_params]
        self._fpt_handles = {}
        byp = {}
        for i, (n, p) in enumerate(self._fpt_params):
            fpt.declare(self._fpt_keys[i], p.numel() * p.element_size(), str(p.dtype), self._fpt_prio[i])
            byp.setdefault(p.dtype, []).append(i)
        # The keys' init round (fpt_init is each key's iteration 0), so that
        # the first gradient push is summed.
        for dtype, idx in byp.items():
            fpt.init([self._fpt_keys[i] for i in idx],
                     torch.zeros(sum(self._fpt_params[i][1].numel() for i in idx), dtype=dtype))
        self._fpt_hooks = []
        for i, (_, p) in enumerate(self._fpt_params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]  # p's AccumulateGrad node
            acc.register_hook(self._fpt_make_hook(i))
            self._fpt_hooks.append(acc)  # the node must outlive the hook

    def _fpt_make_hook(self, i):
        def hook(*_):
            self._fpt_send(i)
        return hook

    def _fpt_send(self, i):
        """Pushes parameter i's gradient (no copy) and asks for the sum."""
        name, p = self._fpt_params[i]
        if i in self._fpt_handles:
            raise RuntimeError("fpt.torch: the gradient of %s was computed twice before step() "
                               "(gradient accumulation over several backward passes is not supported)" % name)
        g = p.grad
        if g is None:
            g = p.grad = torch.zeros_like(p)
        if not g.is_contiguous():
            g = g.contiguous()
        k = self._fpt_keys[i]
        self._fpt_handles[i] = (fpt.push(k, g, self._fpt_prio[i]), fpt.pull(k, self._fpt_sums[i]))

    def synchronize(self):
        """Waits for every gradient's sum and sets each gradient to the
        average over the workers. step() calls it; call it yourself before
        changing gradients (clipping), as the pushes read them."""
        for i in range(len(self._fpt_params)):
            if i not in self._fpt_handles:  # no gradient this step: push zeros
                self._fpt_send(i)
        for i, (_, p) in enumerate(self._fpt_params):
            push, pull = self._fpt_handles[i]
            push.wait()
            pull.wait()
            torch.div(self._fpt_sums[i], self._fpt_workers, out=p.grad)
        self._fpt_handles = {}
        self._fpt_synced = True

    def step(self, closure=None):
        if not getattr(self, "_fpt_synced", False):
            self.synchronize()
        self._fpt_synced = False
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None):
    """Makes optimizer average its gradients over the workers: each
    gradient is pushed as soon as backward has accumulated it, at its
    layer's priority (earlier layers first), and step() waits for the sums
    and divides them by the number of workers before stepping. Returns
    the same optimizer object (its class becomes a subclass of its own, so
    LR schedulers still accept it). Collective: declares and initialises
    the gradients' keys on every worker."""
    base = optimizer.__class__
    cls = type("Distributed" + base.__name__, (base,), {k: v for k, v in vars(_Distributed).items()
                                                        if not k.startswith("__")})
    optimizer.__class__ = cls
    optimizer._fpt_setup(named_parameters)
    return optimizer

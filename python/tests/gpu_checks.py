"""Checks of fpt's GPU-training pieces that run as workers of a real
cluster (tests/torch_test.go starts them). Every check runs on the CPU;
those that need CUDA say so and skip where torch.cuda.is_available() is
false. DEVICE=cuda runs the training checks on the GPU (scripts/gpu-check.sh).

    gpu_checks.py collective   (3 workers) bfloat16 keys, compressed keys,
                               fpt.allreduce and fpt.broadcast: "COLLECTIVE PASS"
    gpu_checks.py train        (2 workers) DDP + fpt.torch.comm_hook and
                               DistributedOptimizer (backward_passes_per_step,
                               bf16 compression) against one process trained
                               on the whole batch; bad input: "TRAIN PASS"
"""

import os
import socket
import sys

import torch

import fpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fpt_checks import check, failures, raises  # noqa: E402

DEVICE = torch.device(os.environ.get("DEVICE", "cpu"))
if DEVICE.type == "cuda":
    # Float32 as the CPU computes it: no TF32, deterministic convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def bf16_ulp(x):
    """A bfloat16 unit in the last place at |x| (elementwise)."""
    e = torch.frexp(x.abs().float().clamp(min=1e-30))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


def collective():
    fpt.start()
    r, n = fpt.rank(), fpt.num_workers()
    check(n == 3, "3 workers")
    # bfloat16 keys: exact where values and sums are bfloat16s, within one
    # rounding of the float32 sum otherwise.
    size = 4099
    ints = torch.arange(size, dtype=torch.float32).remainder(61).sub(30).mul(r + 1)  # |sum| < 256: exact
    g = torch.Generator().manual_seed(11 + r)
    rnd = torch.randn(size, generator=g) * 10
    fpt.declare(1, size * 2, "bfloat16")
    fpt.declare(2, size * 2, fpt.BFLOAT16)
    fpt.declare(3, size * 4, "float32", compression="bf16")
    fpt.declare(4, size * 4, "float32", compression="fp16")
    raises(fpt.ArgumentError, "compression of a float64 key", fpt.declare, 5, 8, "float64", 0, "bf16")
    raises(fpt.ArgumentError, "compression \"int8\"", fpt.declare, 5, 8, "float32", 0, "int8")
    fpt.init([1, 2], torch.zeros(2 * size, dtype=torch.bfloat16))
    fpt.init(3, torch.zeros(size))
    fpt.init(4, torch.zeros(size))
    a, b = ints.bfloat16(), rnd.bfloat16()
    out = torch.empty(2 * size, dtype=torch.bfloat16)
    fpt.wait_all([fpt.push([1, 2], torch.cat([a, b])), fpt.pull([1, 2], out)])
    want_ints = sum(torch.arange(size, dtype=torch.float32).remainder(61).sub(30).mul(k + 1) for k in range(n))
    check(torch.equal(out[:size].float(), want_ints), "bfloat16 sums of representable values are exact")
    allr = [(torch.randn(size, generator=torch.Generator().manual_seed(11 + k)) * 10).bfloat16().float()
            for k in range(n)]
    ref = sum(allr)
    err = (out[size:].float() - ref).abs()
    check(bool((err <= bf16_ulp(ref)).all()), "bfloat16 sums within one rounding of the float32 sum (max error %g)"
          % err.max().item())
    # Compressed float32 keys: the 16-bit rounded values summed, rounded once.
    for key, half in ((3, torch.bfloat16), (4, torch.float16)):
        s = torch.empty(size)
        fpt.wait_all([fpt.push(key, rnd), fpt.pull(key, s)])
        ref = sum(x.to(half).float() for x in
                  [torch.randn(size, generator=torch.Generator().manual_seed(11 + k)) * 10 for k in range(n)])
        ulp = bf16_ulp(ref) if half == torch.bfloat16 else bf16_ulp(ref) / 8
        err = (s - ref).abs()
        check(bool((err <= ulp).all()), "a %s wire gives the float32 sum of the rounded values within one rounding "
              "(max error %g)" % (half, err.max().item()))
    # fpt.allreduce: exact sums over the workers, any size, by name and step.
    for length in (1, 3, 100003):
        t = torch.arange(length, dtype=torch.float32) * (r + 1)
        fpt.allreduce(t, name="t%d" % length)
        check(torch.equal(t, torch.arange(length, dtype=torch.float32) * 6), "allreduce of %d elements sums exactly"
              % length)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    nc = base.t()  # not contiguous: through a host buffer, back in place
    fpt.allreduce(nc, name="transposed")
    check(torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(3, 4) * 6),
          "allreduce of a non-contiguous tensor sums in place")
    t = torch.full((2, 3), float(r), dtype=torch.float64)
    for step in (5, 6, 9):
        got = fpt.allreduce(t.clone(), step=step, name="stepped", op="average")
        check(torch.equal(got, torch.full((2, 3), 1.0, dtype=torch.float64)), "allreduce step %d averages" % step)
    raises(ValueError, "allreduce of a step that does not grow", fpt.allreduce, t.clone(), 9, "stepped")
    raises(ValueError, "allreduce of another size under a name", fpt.allreduce, torch.zeros(5, dtype=torch.float64),
           10, "stepped")
    raises(TypeError, "allreduce of an int tensor", fpt.allreduce, torch.zeros(3, dtype=torch.int64))
    u = fpt.allreduce(torch.ones(7, dtype=torch.bfloat16))  # unnamed
    check(torch.equal(u, torch.full((7,), 3.0, dtype=torch.bfloat16)), "unnamed bfloat16 allreduce")
    w = torch.full((4,), float(r + 10))
    fpt.broadcast(w, name="w")
    check(torch.equal(w, torch.full((4,), 10.0)), "broadcast gives worker 0's values")
    w2 = torch.full((4,), float(r + 20))
    fpt.broadcast(w2, name="w")
    check(torch.equal(w2, torch.full((4,), 20.0)), "broadcast of a name again")
    raises(ValueError, "broadcast from root 1", fpt.broadcast, torch.zeros(2), None, 1)
    if torch.cuda.is_available():
        c = torch.full((1000,), float(r + 1), device="cuda")
        fpt.allreduce(c, name="cuda")
        check(bool((c == 6).all()) and c.is_cuda, "allreduce of a CUDA tensor sums exactly, in place")
    else:
        print("skip allreduce of a CUDA tensor: torch.cuda.is_available() is false", flush=True)
    fpt.finalize()
    print("COLLECTIVE PASS" if not failures else "COLLECTIVE FAIL %s" % failures, flush=True)
    sys.exit(1 if failures else 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard(x, y, r, n):
    k = x.shape[0] // n
    return x[r * k:(r + 1) * k], y[r * k:(r + 1) * k]


def close(a, b, rel):
    """Whether every parameter of models a and b agree within rel."""
    worst = 0.0
    for p, q in zip(a.parameters(), b.parameters()):
        d = ((p.detach().cpu().double() - q.detach().cpu().double()).abs() /
             q.detach().cpu().double().abs().clamp(min=1e-3)).max().item()
        worst = max(worst, d)
    return worst <= rel, worst


def drift(a, b):
    """The norm of the difference of two models' parameters."""
    return sum(((p.detach().double() - q.detach().double()) ** 2).sum().item()
               for p, q in zip(a.parameters(), b.parameters())) ** 0.5


def train():
    """Three ways to train Net on 2 workers that must equal one process
    trained on the whole batch: DDP with fpt.torch.comm_hook,
    DistributedOptimizer accumulating 2 backward passes per step, and
    DistributedOptimizer over a bf16 wire (within bfloat16 rounding)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "pytorch"))
    from model import Net, dataset
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import fpt.torch

    fpt.start()
    r, n = fpt.rank(), fpt.num_workers()
    x, y = dataset(64, seed=3)
    x, y = x.to(DEVICE), y.to(DEVICE)
    steps, lr = 5, 0.05

    def fresh():
        torch.manual_seed(7)
        return Net(2).to(DEVICE)

    # One process, the whole batch: the reference.
    ref = fresh()
    ropt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        ropt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ropt.step()

    # Every key is declared before the first push: the DistributedOptimizers
    # and the comm hook's state are all made first.
    m_acc, m_bf = fresh(), fresh()
    o_acc = fpt.torch.DistributedOptimizer(torch.optim.SGD(m_acc.parameters(), lr=lr, momentum=0.9),
                                           m_acc.named_parameters(), bucket_bytes=4000, backward_passes_per_step=2)
    o_bf = fpt.torch.DistributedOptimizer(torch.optim.SGD(m_bf.parameters(), lr=lr, momentum=0.9),
                                          m_bf.named_parameters(), compression="bf16")
    # The CUDA path's staging (host buffers, the exchange on the background
    # thread, the copy back), on CPU tensors: on a GPU, every model takes it.
    m_st = fresh()
    o_st = fpt.torch.DistributedOptimizer(torch.optim.SGD(m_st.parameters(), lr=lr, momentum=0.9),
                                          m_st.named_parameters(), bucket_bytes=4000, _stage_on_host=True)
    fpt.torch.broadcast_parameters(m_st.state_dict())
    # Staged with a bf16 wire: rounded before the copy to host (on the GPU,
    # torch's rounding), not by the library; the same bits.
    m_sb = fresh()
    o_sb = fpt.torch.DistributedOptimizer(torch.optim.SGD(m_sb.parameters(), lr=lr, momentum=0.9),
                                          m_sb.named_parameters(), compression="bf16", _stage_on_host=True)
    # A model whose gradient turns out sparse: refused at its first backward.
    emb = torch.nn.Embedding(10, 4, sparse=True).to(DEVICE)
    fpt.torch.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=lr), [("emb.weight", emb.weight)])
    # DDP's own process group (gloo): only for DDP's broadcast of the
    # model at construction; its port comes from worker 0 through fpt.
    port = torch.tensor([float(free_port())], dtype=torch.float64)
    fpt.broadcast(port, name="gloo port")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(port.item()), rank=r, world_size=n)
    m_ddp = fresh()
    ddp = DDP(m_ddp, device_ids=[DEVICE.index or 0] if DEVICE.type == "cuda" else None, broadcast_buffers=False)
    state = fpt.torch.CommHookState(ddp)
    hooked = []

    def hook(st, bucket):  # fpt.torch.comm_hook, counted: DDP's own allreduce would train the same
        hooked.append(bucket.index())
        return fpt.torch.comm_hook(st, bucket)

    ddp.register_comm_hook(state, hook)
    o_ddp = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    m_dbf = fresh()
    ddp_bf = DDP(m_dbf, device_ids=[DEVICE.index or 0] if DEVICE.type == "cuda" else None, broadcast_buffers=False)
    ddp_bf.register_comm_hook(fpt.torch.CommHookState(ddp_bf, compression="bf16"), fpt.torch.comm_hook)
    o_dbf = torch.optim.SGD(ddp_bf.parameters(), lr=lr, momentum=0.9)

    xs, ys = shard(x, y, r, n)
    for _ in range(steps):
        o_ddp.zero_grad()
        F.cross_entropy(ddp(xs), ys).backward()
        o_ddp.step()
        o_dbf.zero_grad()
        F.cross_entropy(ddp_bf(xs), ys).backward()
        o_dbf.step()
        # Two half shards, their losses summed: the gradient of the shard's mean.
        o_acc.zero_grad()
        for hx, hy in (shard(xs, ys, 0, 2), shard(xs, ys, 1, 2)):
            (F.cross_entropy(m_acc(hx), hy) / 2).backward()
        o_acc.step()
        o_bf.zero_grad()
        F.cross_entropy(m_bf(xs), ys).backward()
        o_bf.step()
        o_st.zero_grad()
        F.cross_entropy(m_st(xs), ys).backward()
        o_st.step()
        o_sb.zero_grad()
        F.cross_entropy(m_sb(xs), ys).backward()
        o_sb.step()
    check(len(hooked) >= steps, "DDP's buckets went through fpt.torch.comm_hook (%d exchanges)" % len(hooked))
    ok, worst = close(m_ddp, ref, 1e-5)
    check(ok, "DDP with fpt.torch.comm_hook on 2 workers equals one process within 1e-5 (worst %.2g)" % worst)
    ok, worst = close(m_acc, ref, 1e-5)
    check(ok, "backward_passes_per_step=2 on 2 workers equals one process within 1e-5 (worst %.2g)" % worst)
    ok, worst = close(m_st, ref, 1e-5)
    check(ok, "the staged (CUDA) path on 2 workers equals one process within 1e-5 (worst %.2g)" % worst)
    # The gradients rounded to bfloat16 (2^-9 relative at most, each
    # worker's and the sum): the training's updates differ by about that.
    moved = drift(ref, fresh())
    off = drift(m_bf, ref)
    check(off <= 2 ** -6 * moved, "a bf16 wire stays within bfloat16 rounding of one process: the parameters "
          "differ by %.3g of the %.3g they moved" % (off / moved, moved))
    check(off > 0, "a bf16 wire does round (%.3g)" % off)
    off = drift(m_dbf, ref)
    check(0 < off <= 2 ** -6 * moved, "DDP with comm_hook over a bf16 wire stays within bfloat16 rounding of one "
          "process: %.3g of the %.3g moved" % (off / moved, moved))
    check(all(torch.equal(p, q) for p, q in zip(m_sb.parameters(), m_bf.parameters())),
          "the staged path's bf16 wire (rounded on the device) trains the same parameters bit for bit")
    # A third backward before step() is one too many.
    for hx, hy in (shard(xs, ys, 0, 2), shard(xs, ys, 1, 2)):
        F.cross_entropy(m_acc(hx), hy).backward()
    raises(RuntimeError, "a third backward pass with backward_passes_per_step=2",
           lambda: F.cross_entropy(m_acc(xs), ys).backward())
    emb.weight.grad = None  # as zero_grad(set_to_none=True) leaves it: autograd stores the sparse gradient
    try:
        emb(torch.tensor([1, 2], device=DEVICE)).sum().backward()
        check(False, "a sparse gradient raised nothing")
    except Exception as e:  # noqa: BLE001 - autograd may wrap the hook's error
        check("emb.weight" in str(e) and "sparse" in str(e), "a sparse gradient is refused naming the parameter: %s"
              % str(e).splitlines()[0])
    bad_input(Net)
    dist.destroy_process_group()
    fpt.finalize()
    print("TRAIN PASS" if not failures else "TRAIN FAIL %s" % failures, flush=True)
    sys.exit(1 if failures else 0)


def bad_input(Net):
    """Bad models are refused up front naming the parameter, before any
    key is declared."""
    import fpt.torch

    m = torch.nn.Linear(2, 2)
    m.bias = torch.nn.Parameter(torch.zeros(2, device="meta"))
    e = raises(TypeError, "a parameter on the meta device", fpt.torch.DistributedOptimizer,
               torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
    check(e is not None and "bias" in str(e), "the error names the parameter")
    m = torch.nn.Linear(2, 2).to(torch.complex64)
    e = raises(TypeError, "a complex parameter", fpt.torch.DistributedOptimizer,
               torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
    check(e is not None and "weight" in str(e), "the error names the parameter")
    raises(ValueError, "compression \"int8\"", lambda: fpt.torch.DistributedOptimizer(
        torch.optim.SGD(Net().parameters(), lr=0.1), compression="int8"))
    raises(ValueError, "backward_passes_per_step=0", lambda: fpt.torch.DistributedOptimizer(
        torch.optim.SGD(Net().parameters(), lr=0.1), backward_passes_per_step=0))
    if torch.cuda.is_available():
        m = torch.nn.Linear(2, 2)
        m.bias = torch.nn.Parameter(torch.zeros(2, device="cuda"))
        raises(ValueError, "a model on two devices", fpt.torch.DistributedOptimizer,
               torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
    else:
        print("skip a model on the CPU and a GPU: torch.cuda.is_available() is false", flush=True)


if __name__ == "__main__":
    {"collective": collective, "train": train}[sys.argv[1]]()

"""DistributedDataParallel on cocemu.torch's rank threads (R-PY-15): the gradients of one process
on the whole batch, with several buckets, no_sync, the parameters broadcast from rank 0, the same
bits under any schedule seed, and the bucket all-reduces on the modeled timeline."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import cocemu.torch as ct  # noqa: E402

WORLD = 4
BATCH = 8  # each rank takes BATCH // WORLD rows


def model(seed=0):
    """Small integer weights (exact sums; the mean's divisions by 2 and 4 are exact too)."""
    m = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.copy_((torch.arange(p.numel()).reshape(p.shape) * (3 + i) + seed) % 5 - 2)
    return m


def batch():
    x = (torch.arange(BATCH * 6).reshape(BATCH, 6) % 7 - 3).float()
    y = (torch.arange(BATCH * 3).reshape(BATCH, 3) % 3).float()
    return x, y


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def one_process_grads():
    m = model()
    x, y = batch()
    loss_fn(m(x), y).backward()
    return [p.grad for p in m.parameters()]


def ddp_grads(schedule_seed=None, bucket_cap_mb=None, no_sync_steps=0):
    def fn():
        r = dist.get_rank()
        m = model(seed=r)  # every rank starts elsewhere: DDP broadcasts rank 0's parameters
        kw = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        ddp = nn.parallel.DistributedDataParallel(m, **kw)
        x, y = batch()
        n = BATCH // WORLD
        xs, ys = x[r * n:(r + 1) * n], y[r * n:(r + 1) * n]
        if no_sync_steps:  # gradient accumulation: halves of the local batch, one sync
            h = n // 2
            with ddp.no_sync():
                loss_fn(ddp(xs[:h]), ys[:h]).backward()
            unsynced = [p.grad.clone() for p in m.parameters()]
            loss_fn(ddp(xs[h:]), ys[h:]).backward()
            return [p.grad / 2 for p in m.parameters()], unsynced
        for _ in range(2):  # DDP rebuilds its buckets (bucket_cap_mb) after the first step
            m.zero_grad()
            loss_fn(ddp(xs), ys).backward()
        return [p.grad for p in m.parameters()], len(ddp.reducer._get_zeros_like_grad_buckets())
    return ct.run(fn, world_size=WORLD, schedule_seed=schedule_seed, timeout_s=30)


def test_ddp_gives_one_process_gradients():
    want = one_process_grads()
    r = ddp_grads()
    for grads, _ in r.returns:
        for g, w in zip(grads, want):
            # the bound: sums of small integers and divisions by powers of two are exact in f32
            assert torch.equal(g, w)
    assert sum(o.name.startswith("all_reduce") for o in r.ops(0)) == 2  # one bucket, 2 steps


def test_ddp_many_buckets_and_schedule_seeds_same_bits():
    want = one_process_grads()
    base = ddp_grads(bucket_cap_mb=1e-6)  # 1 byte: a bucket per parameter
    assert all(buckets == 4 for _, buckets in base.returns)  # 4 parameters, 4 buckets
    assert sum(o.name.startswith("all_reduce") for o in base.ops(0)) == 1 + 4
    for seed in (3, 11):
        other = ddp_grads(schedule_seed=seed, bucket_cap_mb=1e-6)
        for (a, _), (b, _) in zip(base.returns, other.returns):
            assert all(torch.equal(p, q) for p, q in zip(a, b))
    for grads, _ in base.returns:
        assert all(torch.equal(g, w) for g, w in zip(grads, want))


def test_ddp_no_sync_accumulates_locally_then_reduces():
    want = one_process_grads()
    r = ddp_grads(no_sync_steps=1)
    firsts = []
    for grads, unsynced in r.returns:
        assert all(torch.equal(g, w) for g, w in zip(grads, want))
        firsts.append(unsynced)
    # inside no_sync nothing is reduced: ranks saw different rows, so their grads differ
    assert not all(torch.equal(a, b) for a, b in zip(firsts[0], firsts[1]))


def test_ddp_comm_hook_future_and_async_work_future():
    def fn():
        x = torch.full((3,), float(dist.get_rank() + 1))
        fut = dist.all_reduce(x, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        return x, doubled
    for x, doubled in ct.run(fn, world_size=4).returns:
        assert torch.equal(x, torch.full((3,), 10.0))
        assert torch.equal(doubled, torch.full((3,), 20.0))


def test_ddp_buckets_overlap_the_rest_of_backward_in_the_modeled_timeline():
    """A bucket's all_reduce runs on the comm stream while backward's next GEMM computes
    (ProcessGroupNCCL's order); the compute stream waits for the buckets when backward ends."""
    def fn():
        m = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(3)])
        ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=1e-6)
        for _ in range(2):  # the second step uses the rebuilt buckets, one per layer
            m.zero_grad()
            ddp(torch.ones(64, 256)).sum().backward()
        return float(m[0].weight.grad.sum())
    r = ct.run(fn, world_size=4)
    assert len(set(r.returns)) == 1
    ops = r.ops(0)
    reduces = [o for o in ops if o.name.startswith("all_reduce")]
    gemms = [o for o in ops if o.name.startswith("mm ")]
    assert any(a.start_ns < g.end_ns and g.start_ns < a.end_ns for a in reduces for g in gemms)
    last_reduce = max(a.end_ns for a in reduces)
    waits = [o for o in ops if o.name == "wait comm"]
    assert waits and max(w.end_ns for w in waits) >= last_reduce

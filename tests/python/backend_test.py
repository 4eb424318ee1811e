"""torch.distributed's "baton" backend (issue 34) on every rank of a job
started by batonrun: 2 nodes x 2 trainers and 3 nodes x 1 (see
tests/python/CMakeLists.txt). Every collective's values, exactly, in every
dtype and reduce op that torch's own backends take; async work, futures,
the object collectives; DDP and ZeroRedundancyOptimizer through "baton"
against the same through a gloo group of the same ranks; what the backend
refuses, at once; the group's timeout."""

import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

import baton.torch as bt
from baton.torch.process_group import ProcessGroupBaton, UnsupportedOperation
from harness import run_tests

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
INTEGERS = (torch.int32, torch.int64)
TIMEOUT = datetime.timedelta(seconds=20)


def rank():
    return dist.get_rank()


def world():
    return dist.get_world_size()


def pattern(r, dtype, shape=(2, 3)):
    """Rank r's tensor: small integers, exact in every dtype."""
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) + r) % 7).reshape(shape).to(dtype)


def fold(values, op):
    out = values[0].clone()
    for v in values[1:]:
        if op == dist.ReduceOp.SUM:
            out = out + v
        elif op == dist.ReduceOp.PRODUCT:
            out = out * v
        elif op == dist.ReduceOp.MIN:
            out = torch.minimum(out, v)
        elif op == dist.ReduceOp.MAX:
            out = torch.maximum(out, v)
        elif op == dist.ReduceOp.BAND:
            out = out & v
        elif op == dist.ReduceOp.BOR:
            out = out | v
        elif op == dist.ReduceOp.BXOR:
            out = out ^ v
    return out


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if dtype in INTEGERS:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    return ops


def check(got, want, what):
    assert got.dtype == want.dtype and torch.equal(got, want), "%s: got %s, want %s" % (what, got, want)


def test_the_default_group_is_baton_with_batons_ranks():
    assert dist.get_backend() == "baton", dist.get_backend()
    assert (rank(), world()) == (bt.rank(), bt.size()), ((rank(), world()), (bt.rank(), bt.size()))


def test_all_reduce_every_dtype_and_op():
    for dtype in DTYPES:
        for op in ops_for(dtype):
            t = pattern(rank(), dtype)
            dist.all_reduce(t, op=op)
            check(t, fold([pattern(r, dtype) for r in range(world())], op), "all_reduce %s %s" % (dtype, op))
    # AVG (which gloo lacks): the mean, exact for these values.
    t = torch.full((5,), 2.0 * rank(), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check(t, torch.full((5,), float(world() - 1), dtype=torch.float64), "all_reduce AVG")
    # A scalar and a non-contiguous tensor.
    s = torch.tensor(rank() + 1, dtype=torch.int64)
    dist.all_reduce(s)
    assert int(s) == world() * (world() + 1) // 2, s
    base = pattern(rank(), torch.float32, (3, 4))
    view = base.t()
    dist.all_reduce(view)
    check(base, sum(pattern(r, torch.float32, (3, 4)) for r in range(world())), "all_reduce of a transposed view")


def test_all_reduce_coalesced():
    tensors = [pattern(rank(), torch.float64, (4,)), pattern(rank(), torch.float64, (2, 2))]
    dist.all_reduce_coalesced(tensors)
    check(tensors[0], sum(pattern(r, torch.float64, (4,)) for r in range(world())), "coalesced 0")
    check(tensors[1], sum(pattern(r, torch.float64, (2, 2)) for r in range(world())), "coalesced 1")


def test_broadcast_every_dtype_from_every_root():
    for dtype in DTYPES:
        for root in range(world()):
            t = pattern(rank(), dtype, (3, 2))
            dist.broadcast(t, root)
            check(t, pattern(root, dtype, (3, 2)), "broadcast %s from %d" % (dtype, root))


def test_reduce_to_each_root_leaves_the_others():
    for dtype in DTYPES:
        for root in range(world()):
            t = pattern(rank(), dtype)
            dist.reduce(t, root, op=dist.ReduceOp.MAX)
            want = fold([pattern(r, dtype) for r in range(world())], dist.ReduceOp.MAX) if rank() == root else pattern(
                rank(), dtype
            )
            check(t, want, "reduce %s to %d" % (dtype, root))


def test_all_gather_and_all_gather_into_tensor():
    for dtype in DTYPES:
        out = [torch.empty((2, 3), dtype=dtype) for _ in range(world())]
        dist.all_gather(out, pattern(rank(), dtype))
        for r in range(world()):
            check(out[r], pattern(r, dtype), "all_gather %s row %d" % (dtype, r))
        flat = torch.empty((world() * 2, 3), dtype=dtype)
        dist.all_gather_into_tensor(flat, pattern(rank(), dtype))
        check(flat, torch.cat([pattern(r, dtype) for r in range(world())]), "all_gather_into_tensor %s" % dtype)
    scalars = [torch.empty((), dtype=torch.int64) for _ in range(world())]
    dist.all_gather(scalars, torch.tensor(10 * rank()))
    assert [int(s) for s in scalars] == [10 * r for r in range(world())], scalars


def test_gather_and_scatter_at_every_root():
    for root in range(world()):
        mine = pattern(rank(), torch.float64)
        gathered = [torch.empty_like(mine) for _ in range(world())] if rank() == root else None
        dist.gather(mine, gathered, dst=root)
        if rank() == root:
            for r in range(world()):
                check(gathered[r], pattern(r, torch.float64), "gather at %d row %d" % (root, r))
        out = torch.empty((2, 3), dtype=torch.int32)
        parts = [pattern(100 + r, torch.int32) for r in range(world())] if rank() == root else None
        dist.scatter(out, parts, src=root)
        check(out, pattern(100 + rank(), torch.int32), "scatter from %d" % root)


def test_reduce_scatter_list_and_tensor():
    for dtype in DTYPES:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            parts = [pattern(rank() * world() + d, dtype) for d in range(world())]
            out = torch.empty((2, 3), dtype=dtype)
            dist.reduce_scatter(out, parts, op=op)
            want = fold([pattern(r * world() + rank(), dtype) for r in range(world())], op)
            check(out, want, "reduce_scatter %s %s" % (dtype, op))
            flat = torch.cat([pattern(rank() * world() + d, dtype) for d in range(world())])
            out2 = torch.empty((2, 3), dtype=dtype)
            dist.reduce_scatter_tensor(out2, flat, op=op)
            check(out2, want, "reduce_scatter_tensor %s %s" % (dtype, op))


def test_all_to_all_single_and_all_to_all():
    w, r = world(), rank()
    for dtype in DTYPES:
        # Equal shares: row d of rank s goes to rank d.
        out = torch.empty((w, 3), dtype=dtype)
        dist.all_to_all_single(out, torch.stack([pattern(r * w + d, dtype, (3,)) for d in range(w)]))
        check(out, torch.stack([pattern(s * w + r, dtype, (3,)) for s in range(w)]), "all_to_all_single %s" % dtype)
    # Uneven splits, none between some pairs: rank s sends rank d (s + d) % 3
    # rows of 100 s + d.
    sent = [(r + d) % 3 for d in range(w)]
    received = [(s + r) % 3 for s in range(w)]
    out = torch.empty((sum(received), 2), dtype=torch.float64)
    inp = torch.cat([torch.full((n, 2), 100.0 * r + d, dtype=torch.float64) for d, n in enumerate(sent)])
    work = dist.all_to_all_single(out, inp, received, sent, async_op=True)
    work.wait()
    want = torch.cat([torch.full((n, 2), 100.0 * s + r, dtype=torch.float64) for s, n in enumerate(received)])
    check(out, want, "all_to_all_single with splits")
    # The list form, every pair's tensor of its own shape.
    inputs = [torch.full((r + 1, d + 1), 10 * r + d, dtype=torch.int64) for d in range(w)]
    outputs = [torch.empty((s + 1, r + 1), dtype=torch.int64) for s in range(w)]
    dist.all_to_all(outputs, inputs)
    for s in range(w):
        check(outputs[s], torch.full((s + 1, r + 1), 10 * s + r, dtype=torch.int64), "all_to_all from %d" % s)


def test_an_all_to_all_whose_ranks_disagree_raises_on_every_rank():
    # Rank 0 gives int32 rows, the others float32: every rank raises at the
    # call, naming the dtypes, and the group goes on.
    dtype = torch.int32 if rank() == 0 else torch.float32
    try:
        dist.all_to_all_single(torch.empty(world(), dtype=dtype), torch.ones(world(), dtype=dtype))
        raise AssertionError("an all_to_all_single of int32 and float32 ranks went through")
    except ValueError as e:
        assert "dtype" in str(e) and "int32 on ranks {0}" in str(e) and "float32" in str(e), e
    # Rank 0 expects other counts than the ranks send: its call fails with
    # both (c10d's contract: the group of that rank is unusable after it).
    group = dist.new_group(backend="baton")
    expected = [2 if s == 0 else 1 for s in range(world())] if rank() == 0 else [1] * world()
    out = torch.empty(sum(expected))
    work = dist.all_to_all_single(out, torch.ones(world()), expected, [1] * world(), group=group, async_op=True)
    if rank() == 0:
        try:
            work.wait()
            raise AssertionError("rank 0's wrong output_split_sizes went unnoticed")
        except ValueError as e:
            assert "expected %s" % expected in str(e) and "sent %s" % ([1] * world()) in str(e), e
    else:
        work.wait()
    t = torch.ones(2)
    dist.all_reduce(t)
    check(t, torch.full((2,), float(world())), "all_reduce after the disagreement")


def test_async_work_waits_in_any_order_and_futures_chain():
    a = pattern(rank(), torch.float32, (4,))
    b = pattern(rank(), torch.int64, (4,))
    c = [torch.empty(3) for _ in range(world())]
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, op=dist.ReduceOp.MAX, async_op=True)
    wc = dist.all_gather(c, torch.full((3,), float(rank())), async_op=True)
    # The same name twice in flight: the second starts after the first.
    d = torch.ones(4)
    wd1 = dist.all_reduce(d, async_op=True)
    wd1.wait()
    wd2 = dist.all_reduce(d, async_op=True)
    doubled = wd2.get_future().then(lambda f: f.value()[0] * 2)
    assert wc.wait() and wb.wait() and wa.wait()
    check(a, sum(pattern(r, torch.float32, (4,)) for r in range(world())), "async a")
    check(b, fold([pattern(r, torch.int64, (4,)) for r in range(world())], dist.ReduceOp.MAX), "async b")
    for r in range(world()):
        check(c[r], torch.full((3,), float(r)), "async c")
    check(doubled.wait(), torch.full((4,), 2.0 * world() * world()), "the chained future")
    assert wd2.is_completed() and wd2.is_success()
    (result,) = wd2.result()
    assert result is d or torch.equal(result, d)


def test_object_collectives():
    objects = [None] * world()
    dist.all_gather_object(objects, {"rank": rank(), "name": "r%d" % rank()})
    assert objects == [{"rank": r, "name": "r%d" % r} for r in range(world())], objects
    box = [rank(), "x" * (rank() + 1)] if rank() == 1 else [None, None]
    dist.broadcast_object_list(box, src=1)
    assert box == [1, "xx"], box
    gathered = [None] * world() if rank() == 0 else None
    dist.gather_object(("from", rank()), gathered, dst=0)
    if rank() == 0:
        assert gathered == [("from", r) for r in range(world())], gathered
    out = [None]
    dist.scatter_object_list(out, [{"to": r} for r in range(world())] if rank() == 0 else None, src=0)
    assert out == [{"to": rank()}], out
    dist.barrier()


def train(group, steps=20, zero=False):
    """A small DDP model trained `steps` steps over `group`; returns its
    parameters. Several buckets (bucket_cap_mb is tiny), each rank its own
    data, the same initial parameters everywhere."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).double()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.004)
    if zero:
        optimizer = ZeroRedundancyOptimizer(
            ddp.parameters(), optimizer_class=torch.optim.SGD, process_group=group, lr=0.05, momentum=0.9
        )
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank())
    for _ in range(steps):
        x = torch.randn(16, 8, generator=data, dtype=torch.float64)
        y = torch.randn(16, 4, generator=data, dtype=torch.float64)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def compare_with_gloo(zero):
    gloo = dist.new_group(backend="gloo")
    on_baton = train(None, zero=zero)
    on_gloo = train(gloo, zero=zero)
    worst = max(float((a - b).abs().max()) for a, b in zip(on_baton, on_gloo))
    assert worst <= 1e-6, "baton and gloo differ by %g after 20 steps" % worst
    # Every rank ends with the same parameters.
    mine = torch.cat([p.flatten() for p in on_baton])
    everyone = [torch.empty_like(mine) for _ in range(world())]
    dist.all_gather(everyone, mine)
    for r in range(world()):
        assert torch.equal(everyone[r], mine), "rank %d's parameters differ from rank %d's" % (r, rank())
    moved = max(float((a - b).abs().max()) for a, b in zip(on_baton, train(None, steps=0, zero=zero)))
    assert moved > 1e-3, "training did not move the parameters (%g)" % moved


def test_ddp_with_no_hook_matches_gloo():
    compare_with_gloo(zero=False)


def test_zero_redundancy_optimizer_matches_gloo():
    compare_with_gloo(zero=True)


def raises_at_once(fn, kind, *words):
    start = time.monotonic()
    try:
        fn()
    except kind as e:
        elapsed = time.monotonic() - start
        assert elapsed < 1.0, "raised after %.2f s" % elapsed
        for word in words:
            assert word in str(e), "%r does not name %r" % (str(e), word)
        return
    raise AssertionError("no %s; expected one naming %s" % (kind.__name__, words))


def test_what_the_backend_refuses_raises_at_once():
    t = torch.ones(2)
    raises_at_once(lambda: dist.send(t, (rank() + 1) % world()), UnsupportedOperation, "send", "gloo")
    raises_at_once(lambda: dist.recv(t, (rank() + 1) % world()), UnsupportedOperation, "recv", "gloo")
    raises_at_once(
        lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)),
        UnsupportedOperation,
        "PREMUL_SUM",
    )
    raises_at_once(lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), ValueError, "all_reduce of float32[2]", "integer")
    raises_at_once(
        lambda: dist.all_gather([torch.empty(3) for _ in range(world())], t), ValueError, "all_gather", "float32[3]"
    )
    raises_at_once(
        lambda: dist.all_to_all_single(torch.empty(world() + 1), torch.ones(world() + 1)),
        ValueError,
        "all_to_all_single",
        "do not split evenly",
    )
    # A group of fewer ranks, or with another rank, than the job's.
    store = dist.distributed_c10d._get_default_store()
    raises_at_once(lambda: ProcessGroupBaton(store, 0, 1, TIMEOUT), ValueError, "1 rank", "%d" % world())
    other = (rank() + 1) % world()
    raises_at_once(
        lambda: ProcessGroupBaton(store, other, world(), TIMEOUT), ValueError, "c10d's rank %d" % other, "rank %d" % rank()
    )
    # Nothing was started: the group still works.
    dist.all_reduce(t)
    check(t, torch.full((2,), float(world())), "all_reduce after the refusals")


def test_a_call_that_outlasts_the_groups_timeout_fails_and_poisons_the_group():
    short = dist.new_group(backend="baton", timeout=datetime.timedelta(seconds=1))
    t = torch.ones(3)
    if rank() == 0:
        # Alone: the others have not called it yet.
        start = time.monotonic()
        work = dist.all_reduce(t, group=short, async_op=True)
        # wait(timeout) gives up first, and the call goes on.
        try:
            work.wait(datetime.timedelta(seconds=0.1))
            raise AssertionError("wait(0.1 s) returned for a collective only rank 0 started")
        except RuntimeError as e:
            assert "0.1 s given to wait()" in str(e), e
        assert not work.is_completed()
        try:
            work.wait()
            raise AssertionError("a collective only rank 0 started finished")
        except RuntimeError as e:
            assert "all_reduce of float32[3]" in str(e) and "1.0 s" in str(e), e
        elapsed = time.monotonic() - start
        # Bounded by the timeout (plus a slack a loaded machine needs).
        assert 0.9 < elapsed < 10.0, "failed after %.2f s, not about the 1 s timeout" % elapsed
        raises_at_once(lambda: dist.broadcast(t, 0, group=short), RuntimeError, "unusable", "all_reduce of float32[3]")
    dist.barrier()
    if rank() != 0:
        # Finishes rank 0's operation, still in flight in baton.
        dist.all_reduce(t, group=short)
    dist.barrier()


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("baton", timeout=TIMEOUT)
    sys.exit(run_tests(globals()))

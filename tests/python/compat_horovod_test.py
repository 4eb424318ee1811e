"""baton.compat.horovod.torch, called the way Horovod's own PyTorch scripts
call horovod.torch (examples/pytorch/pytorch_synthetic_benchmark.py, its
elastic twin, the gradient-clipping pattern), plus its contract: every op
exact on 2 nodes, Horovod's out-of-place and in-place forms, autograd
through the collectives, and a clear error for each thing baton does not
have (Adasum, process sets, join, ...), after which the job goes on."""

import copy
import sys
import time

import torch
import torch.nn.functional as F

import baton.compat.horovod.torch as hvd
from baton.compat import _built
from harness import run_tests


def tiny_convnet():
    torch.manual_seed(1234 + hvd.rank())  # different on every rank until broadcast
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 10),
    )


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def averaged_reference(model, lr, steps, momentum=0.9):
    """One process: each step averages every rank's gradient, then steps
    SGD, what DistributedOptimizer must give on every rank."""
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr, momentum=momentum)
    for step in range(steps):
        grads = []
        for r in range(hvd.size()):
            reference.zero_grad()
            data, target = batch(step, r)
            F.cross_entropy(reference(data), target).backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        for i, p in enumerate(reference.parameters()):
            p.grad = sum(g[i] for g in grads) / hvd.size()
        optimizer.step()
    return reference


def assert_close_everywhere(model, reference, rtol):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=rtol, atol=rtol), (name, (p - q).abs().max())
        gathered = hvd.allgather(p.detach().reshape(1, -1), name="check." + name)
        assert torch.equal(gathered[0], gathered[-1]), "ranks differ in " + name


def train_synthetic(compression, steps=3, **optimizer_args):
    """pytorch_synthetic_benchmark.py's lines: SGD at lr x size,
    DistributedOptimizer(named_parameters, compression, op=Average),
    broadcast_parameters(state_dict), broadcast_optimizer_state."""
    model = tiny_convnet()
    lr = 0.01 * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average, **optimizer_args
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start = copy.deepcopy(model)
    for step in range(steps):
        optimizer.zero_grad()
        data, target = batch(step, hvd.rank())
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return model, averaged_reference(start, lr, steps)


def test_synthetic_benchmark_without_and_with_fp16():
    model, reference = train_synthetic(hvd.Compression.none)
    assert_close_everywhere(model, reference, 1e-6)
    model, reference = train_synthetic(hvd.Compression.fp16)
    assert_close_everywhere(model, reference, 2e-3)


def test_gradient_predivide_factor_divides_before_and_multiplies_after():
    model, reference = train_synthetic(hvd.Compression.none, gradient_predivide_factor=4.0)
    assert_close_everywhere(model, reference, 1e-6)


def test_synchronize_clip_and_skip_synchronize():
    model = tiny_convnet()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    start = copy.deepcopy(model)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    data, target = batch(0, hvd.rank())
    F.cross_entropy(model(data), target).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with optimizer.skip_synchronize():
        optimizer.step()
    reference = averaged_reference(start, 0.0, 1, momentum=0.0)
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    for p, q, r in zip(model.parameters(), start.parameters(), reference.parameters()):
        want = q - 0.1 * r.grad
        assert torch.allclose(p, want, atol=1e-6), (p - want).abs().max()


def test_sparse_gradients_are_averaged_dense():
    torch.manual_seed(7)
    embedding = torch.nn.Embedding(6, 3, sparse=True)
    start = embedding.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(embedding.parameters(), lr=1.0),
        named_parameters=embedding.named_parameters(),
        sparse_as_dense=True,
    )
    embedding(torch.tensor([hvd.rank(), 5])).sum().backward()
    optimizer.step()
    want = start.clone()
    for r in range(hvd.size()):
        want[r] -= 1.0 / hvd.size()
    want[5] -= 1.0
    assert torch.allclose(embedding.weight, want, atol=1e-6), embedding.weight


def rank_values(rank, n=5):
    return (torch.arange(n, dtype=torch.float32) * (rank + 2)) % 7 - 3


def test_every_op_exact_out_of_place_and_in_place():
    everyone = torch.stack([rank_values(r) for r in range(hvd.size())])
    want = {
        None: everyone.sum(0) / hvd.size(),
        hvd.Average: everyone.sum(0) / hvd.size(),
        hvd.Sum: everyone.sum(0),
        hvd.Min: everyone.min(0).values,
        hvd.Max: everyone.max(0).values,
        hvd.Product: everyone.prod(0),
    }
    for op, expected in want.items():
        t = rank_values(hvd.rank())
        out = hvd.allreduce(t, name="hvd.op", op=op)
        assert torch.equal(out, expected) and out is not t, (op, out, expected)
        assert torch.equal(t, rank_values(hvd.rank())), "allreduce changed its input"
        assert hvd.allreduce_(t, name="hvd.op", op=op) is t and torch.equal(t, expected), (op, t)
        h = hvd.allreduce_async(rank_values(hvd.rank()), name="hvd.op", op=op)
        assert torch.equal(hvd.synchronize(h), expected), op
        t = rank_values(hvd.rank())
        h = hvd.allreduce_async_(t, name="hvd.op", op=op)
        assert hvd.synchronize(h) is t and torch.equal(t, expected), op
    # The deprecated average= spelling: False is the sum.
    assert torch.equal(hvd.allreduce(rank_values(hvd.rank()), average=False), want[hvd.Sum])
    # Horovod's scaling: prescale before the sum, postscale after it.
    out = hvd.allreduce(rank_values(hvd.rank()), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(out, want[hvd.Sum]), out
    t = rank_values(hvd.rank())
    hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Sum, prescale_factor=3.0))
    assert torch.equal(t, 3 * want[hvd.Sum]), t


def test_grouped_allreduce_all_forms():
    tensors = [rank_values(hvd.rank(), n) for n in (3, 4, 5)]
    wants = [sum(rank_values(r, n) for r in range(hvd.size())) for n in (3, 4, 5)]
    outs = hvd.grouped_allreduce(tensors, name="hvd.group", op=hvd.Sum)
    assert all(torch.equal(o, w) for o, w in zip(outs, wants)), outs
    outs = hvd.synchronize(hvd.grouped_allreduce_async(tensors, name="hvd.group", op=hvd.Sum))
    assert all(torch.equal(o, w) for o, w in zip(outs, wants)), outs
    hvd.grouped_allreduce_(tensors, name="hvd.group", op=hvd.Sum)
    assert all(torch.equal(t, w) for t, w in zip(tensors, wants)), tensors


def test_allgather_ragged_and_objects():
    t = torch.full((hvd.rank() + 1, 2), float(hvd.rank()))
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(hvd.size())])
    assert torch.equal(hvd.allgather(t, name="hvd.gather"), want)
    assert torch.equal(hvd.synchronize(hvd.allgather_async(t, name="hvd.gather")), want)
    objects = hvd.allgather_object({"rank": hvd.rank()})
    assert objects == [{"rank": r} for r in range(hvd.size())], objects


def test_broadcast_new_tensor_in_place_unnamed_and_objects():
    root = hvd.size() - 1
    t = torch.full((3,), float(hvd.rank()))
    out = hvd.broadcast(t, root, name="hvd.bcast")
    assert torch.equal(out, torch.full((3,), float(root))) and torch.equal(t, torch.full((3,), float(hvd.rank())))
    out = hvd.synchronize(hvd.broadcast_async(t, root))
    assert torch.equal(out, torch.full((3,), float(root))) and torch.equal(t, torch.full((3,), float(hvd.rank())))
    assert hvd.broadcast_(t, root) is t and torch.equal(t, torch.full((3,), float(root)))
    t = torch.full((2, 2), float(hvd.rank()), dtype=torch.float64)
    hvd.synchronize(hvd.broadcast_async_(t, 0, name="hvd.bcast2"))
    assert torch.equal(t, torch.zeros(2, 2, dtype=torch.float64)), t
    assert hvd.broadcast_object({"epoch": 3 + hvd.rank()}, root_rank=0) == {"epoch": 3}
    hvd.barrier()


def test_collectives_are_differentiable():
    x = torch.full((3,), float(hvd.rank() + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(hvd.size()))), x.grad
    x = torch.ones(2, requires_grad=True)
    (hvd.broadcast(x, 0, name="hvd.grad.bcast") * 3).sum().backward()
    want = 3.0 * hvd.size() if hvd.rank() == 0 else 0.0
    assert torch.equal(x.grad, torch.full((2,), want)), x.grad
    x = torch.ones(hvd.rank() + 1, requires_grad=True)
    gathered = hvd.allgather(x, name="hvd.grad.gather")
    (gathered * torch.arange(1.0, gathered.numel() + 1)).sum().backward()
    offset = sum(r + 1 for r in range(hvd.rank()))
    assert torch.equal(x.grad, torch.arange(1.0, gathered.numel() + 1)[offset : offset + hvd.rank() + 1]), x.grad


def test_alltoall_with_splits_and_its_gradient():
    world, me = hvd.size(), hvd.rank()
    # Rank s sends rank d (s + d) % 3 + 1 rows of value 10 s + d.
    splits = [(me + d) % 3 + 1 for d in range(world)]
    x = torch.cat([torch.full((n, 2), float(10 * me + d)) for d, n in enumerate(splits)]).requires_grad_()
    out, received = hvd.alltoall(x, splits=splits, name="hvd.a2a")
    assert received.tolist() == [(s + me) % 3 + 1 for s in range(world)], received
    want = torch.cat([torch.full((n, 2), float(10 * s + me)) for s, n in enumerate(received.tolist())])
    assert torch.equal(out, want), out
    # The gradient of each received row is its sender's value: it comes
    # back to the sender as the rows' own values.
    (out * out.detach()).sum().backward()
    assert torch.equal(x.grad, x.detach()), x.grad
    even = hvd.alltoall(torch.arange(world * 2.0), name="hvd.a2a.even")
    assert torch.equal(even, torch.tensor([2.0 * me, 2.0 * me + 1] * world)), even
    out, received = hvd.synchronize(hvd.alltoall_async(x.detach(), splits=splits, name="hvd.a2a"))
    assert torch.equal(out, want), out


def expect_not_supported(call, text):
    try:
        call()
    except hvd.NotSupportedError as e:
        assert isinstance(e, ValueError) and isinstance(e, NotImplementedError), type(e)
        assert text in str(e) and "not supported by baton" in str(e), str(e)
    else:
        raise AssertionError("accepted: " + text)


def test_reducescatter_splits_the_mean_as_horovod_does():
    rows = hvd.size() * 2 + 1
    t = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (hvd.rank() + 1)
    out = hvd.reducescatter(t, name="hvd.rs")
    counts = [rows // hvd.size() + (1 if r < rows % hvd.size() else 0) for r in range(hvd.size())]
    begin = sum(counts[: hvd.rank()])
    mean = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (hvd.size() + 1) / 2
    assert torch.allclose(out, mean[begin : begin + counts[hvd.rank()]]), out
    summed = hvd.synchronize(hvd.reducescatter_async(t, op=hvd.Sum, name="hvd.rs.sum", prescale_factor=0.5))
    assert torch.allclose(summed, mean[begin : begin + counts[hvd.rank()]] * hvd.size() * 0.5), summed


def test_what_baton_lacks_raises_a_clear_error_and_the_job_goes_on():
    t = torch.ones(2)
    params = [torch.nn.Parameter(torch.ones(2))]
    expect_not_supported(lambda: hvd.allreduce(t, op=hvd.Adasum), "Adasum")
    expect_not_supported(lambda: hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1), op=hvd.Adasum), "Adasum")
    expect_not_supported(lambda: hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1), op=hvd.Sum), "op=")
    subset = hvd.ProcessSet([0])
    expect_not_supported(lambda: hvd.allreduce(t, process_set=subset), "process sets")
    expect_not_supported(lambda: hvd.add_process_set(subset), "process sets")
    expect_not_supported(lambda: hvd.init(process_sets=[subset]), "process sets")
    expect_not_supported(lambda: hvd.init(comm=[0, 1]), "comm")
    expect_not_supported(hvd.join, "hvd.join")
    expect_not_supported(lambda: hvd.start_timeline("/tmp/t.json"), "batonctl timeline")
    expect_not_supported(lambda: hvd.elastic.ElasticSampler(range(4)), "ElasticSampler")
    try:
        hvd.allreduce(t, average=True, op=hvd.Sum)
    except ValueError as e:
        assert "not both" in str(e), str(e)
    else:
        raise AssertionError("average and op together were accepted")
    assert hvd.global_process_set.size() == hvd.size() and hvd.global_process_set.rank() == hvd.rank()
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum, process_set=hvd.global_process_set), t * hvd.size())


def expect_disagreement(call, field, named=False):
    """`call` raises on this rank, naming `field`, well before the agents'
    60 s operation timeout: the ranks found the disagreement. Unnamed calls
    find it in their descriptor round (ValueError); a named tensor is
    retired by the coordinator (BatonError, e.retired)."""
    start = time.monotonic()
    try:
        call()
    except (ValueError, RuntimeError) as e:
        assert field in str(e), (field, str(e))
        if named:
            assert isinstance(e, RuntimeError) and e.retired, (type(e), str(e))
        else:
            assert isinstance(e, ValueError), (type(e), str(e))
    else:
        raise AssertionError("ranks that disagree on the %s did not raise" % field)
    assert time.monotonic() - start < 30.0, time.monotonic() - start


def test_ranks_that_disagree_raise_on_every_rank_and_the_next_call_works():
    """Horovod's contract: an allreduce or broadcast whose shape or dtype
    differs by node, named or not, raises on every rank, and the next call
    on the same name (or the next unnamed one) works."""
    first_node = hvd.rank() < hvd.local_size()
    expect_disagreement(lambda: hvd.allreduce(torch.ones(2 if first_node else 3)), "shape")
    assert torch.equal(hvd.allreduce(torch.ones(3)), torch.ones(3))
    ints = torch.ones(4, dtype=torch.int32 if first_node else torch.float32)
    expect_disagreement(lambda: hvd.allreduce(ints, op=hvd.Sum), "dtype")
    assert torch.equal(hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Sum), torch.full((4,), hvd.size(), dtype=torch.int32))
    # The shapes an unnamed call saw before still work as before.
    assert torch.equal(hvd.allreduce(torch.ones(2)), torch.ones(2))
    expect_disagreement(lambda: hvd.allreduce(torch.ones(2 if first_node else 3), name="hvd.disagree"), "shape", named=True)
    assert torch.equal(hvd.allreduce(torch.ones(2), name="hvd.disagree"), torch.ones(2))
    expect_disagreement(lambda: hvd.broadcast(torch.ones(1 if first_node else 2), 0), "shape")
    assert torch.equal(hvd.broadcast(torch.full((2,), float(hvd.rank())), 0), torch.zeros(2))


def test_int8_int16_and_bool_as_horovod_takes_them():
    n = hvd.size()
    for dtype in (torch.int8, torch.int16):
        t = torch.full((3,), hvd.rank() + 1, dtype=dtype)
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum), torch.full((3,), n * (n + 1) // 2, dtype=dtype))
        assert torch.equal(hvd.allreduce(t, op=hvd.Max, name="hvd.small.max"), torch.full((3,), n, dtype=dtype))
        assert torch.equal(hvd.broadcast(t, n - 1), torch.full((3,), n, dtype=dtype))
    flags = torch.tensor([hvd.rank() == 0, True, False])
    assert torch.equal(hvd.allreduce(flags, op=hvd.Sum), torch.tensor([True, True, False]))
    assert torch.equal(hvd.allreduce(flags, op=hvd.Min), torch.tensor([False, True, False]))
    assert torch.equal(hvd.broadcast(flags, 0), torch.tensor([True, True, False]))
    assert hvd.broadcast_(flags, 1) is flags and torch.equal(flags, torch.tensor([False, True, False]))
    try:
        hvd.allreduce(flags)
    except ValueError as e:
        assert "no mean" in str(e), str(e)
    else:
        raise AssertionError("the mean of a bool tensor was taken")
    try:
        hvd.allreduce(flags, op=hvd.Sum, compression=hvd.Compression.fp16)
    except ValueError as e:
        assert "does not apply to bools" in str(e), str(e)
    else:
        raise AssertionError("a bool tensor was compressed")


def test_sync_batch_norm_normalizes_over_every_rank():
    """hvd.SyncBatchNorm, as torchvision's norm_layer in Horovod's synthetic
    benchmark, against torch's BatchNorm2d on every rank's batch at once:
    the same outputs, input gradients (of the sum of every rank's loss),
    summed weight gradients and running statistics."""
    n, rank = hvd.size(), hvd.rank()
    batches = [torch.randn(2 + r, 3, 4, 4, generator=torch.Generator().manual_seed(100 + r)) * (r + 1) + r for r in range(n)]
    weights = [torch.randn(2 + r, 3, 4, 4, generator=torch.Generator().manual_seed(200 + r)) for r in range(n)]
    sync = hvd.SyncBatchNorm(3, momentum=0.3)
    reference = torch.nn.BatchNorm2d(3, momentum=0.3)
    with torch.no_grad():
        for m in (sync, reference):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            m.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    for step in range(2):
        x = batches[rank].clone().requires_grad_()
        sync.zero_grad()
        y = sync(x)
        (y * weights[rank]).sum().backward()
        whole = torch.cat(batches).requires_grad_()
        reference.zero_grad()
        y_ref = reference(whole)
        (y_ref * torch.cat(weights)).sum().backward()
        begin = sum(2 + r for r in range(rank))
        part = slice(begin, begin + 2 + rank)
        assert torch.allclose(y, y_ref[part], atol=1e-5), (step, (y - y_ref[part]).abs().max())
        assert torch.allclose(x.grad, whole.grad[part], atol=1e-5), (step, (x.grad - whole.grad[part]).abs().max())
        for mine, theirs in ((sync.weight.grad, reference.weight.grad), (sync.bias.grad, reference.bias.grad)):
            assert torch.allclose(hvd.allreduce(mine, op=hvd.Sum), theirs, atol=1e-4), (mine, theirs)
        assert torch.allclose(sync.running_mean, reference.running_mean, atol=1e-5)
        assert torch.allclose(sync.running_var, reference.running_var, atol=1e-5)
    sync.eval()
    reference.eval()
    assert torch.allclose(sync(batches[rank]), reference(batches[rank]), atol=1e-5)


def test_built_and_enabled_say_what_baton_is():
    assert not hvd.mpi_built() and not hvd.mpi_enabled() and not hvd.mpi_threads_supported()
    assert hvd.gloo_built() and not hvd.gloo_enabled()
    assert hvd.nccl_built() == _built.NCCL_VERSION_CODE and hvd.cuda_built() == (_built.NCCL_VERSION_CODE != 0)
    assert not hvd.rocm_built() and not hvd.ddl_built() and not hvd.ccl_built()
    assert hvd.is_initialized() and hvd.cross_size() * hvd.local_size() == hvd.size()
    assert hvd.cross_rank() == hvd.rank() // hvd.local_size()


def test_elastic_example_surface():
    """The elastic synthetic benchmark's lines: TorchState(model, optimizer,
    fields), a reset callback, @hvd.elastic.run with commits."""
    model = tiny_convnet()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.none,
        op=hvd.Average,
    )
    resets = []
    state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def run_benchmark(state):
        if not state.warm:
            state.warm = True
            state.commit()
        for x in range(state.iter, 3):
            optimizer.zero_grad()
            data, target = batch(x, hvd.rank())
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            state.img_secs.append(float(x))
            state.iter = x
            state.commit()
            state.check_host_updates()
        return "done"

    assert run_benchmark(state) == "done" and state.img_secs == [0.0, 1.0, 2.0] and state.warm
    assert resets == [], "no re-form happened, so no reset callback"
    for name, p in model.named_parameters():
        gathered = hvd.allgather(p.detach().reshape(1, -1), name="elastic.check." + name)
        assert torch.equal(gathered[0], gathered[-1]), name


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

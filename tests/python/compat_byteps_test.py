"""baton.compat.byteps.torch and its cross_barrier, called the way BytePS's
own PyTorch scripts call byteps.torch (example/pytorch/benchmark_byteps.py,
benchmark_cross_barrier_byteps.py), plus the contract: push_pull's forms
exact on 2 nodes, the seed's CrossBarrier forms equal to each other bit for
bit, and clear errors for misuse."""

import copy
import sys

import torch
import torch.nn.functional as F

import baton.compat.byteps.torch as bps
import baton.compat.byteps.torch.cross_barrier as cross_barrier
from harness import run_tests


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def train(model, optimizer, steps):
    for step in range(steps):
        optimizer.zero_grad()
        x, y = data(step, bps.rank())
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    finalize = getattr(optimizer, "finalize", None)
    if finalize is not None:
        finalize()


def mean_gradient_reference(model, lr, steps):
    """One process stepping SGD(momentum) with every rank's mean gradient."""
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        grads = []
        for r in range(bps.size()):
            reference.zero_grad()
            x, y = data(step, r)
            F.cross_entropy(reference(x), y).backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        for i, p in enumerate(reference.parameters()):
            p.grad = sum(g[i] for g in grads) / bps.size()
        optimizer.step()
    return reference


def test_benchmark_byteps_surface_without_and_with_fp16():
    """benchmark_byteps.py's lines: DistributedOptimizer(opt,
    named_parameters, compression), broadcast_parameters(state_dict),
    broadcast_optimizer_state."""
    for compression, tolerance in ((bps.Compression.none, 1e-6), (bps.Compression.fp16, 2e-3)):
        model = mlp(seed=bps.rank())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        optimizer = bps.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression
        )
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.broadcast_optimizer_state(optimizer, root_rank=0)
        start = copy.deepcopy(model)
        train(model, optimizer, 4)
        reference = mean_gradient_reference(start, 0.05, 4)
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(p, q, rtol=tolerance, atol=tolerance), (compression, (p - q).abs().max())


def test_cross_barrier_forms_give_the_same_parameters_bit_for_bit():
    """benchmark_cross_barrier_byteps.py's CrossBarrier(model, optimizer,
    named_parameters, compression, num_steps) and the seed's
    _CrossBarrier(model, DistributedOptimizer(...)) and
    _CrossBarrier(model, plain optimizer) train alike."""
    steps = 4
    results = []
    for form in ("CrossBarrier", "_CrossBarrier(DistributedOptimizer)", "_CrossBarrier(plain)"):
        model = mlp(seed=11 + bps.rank())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if form == "CrossBarrier":
            optimizer = cross_barrier.CrossBarrier(
                model,
                optimizer,
                named_parameters=model.named_parameters(),
                compression=cross_barrier.Compression.none,
                num_steps=steps,
            )
        elif form == "_CrossBarrier(DistributedOptimizer)":
            wrapped = cross_barrier.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            optimizer = cross_barrier._CrossBarrier(model, wrapped, num_steps=steps)
        else:
            optimizer = cross_barrier._CrossBarrier(model, optimizer, num_steps=steps)
        cross_barrier.broadcast_parameters(model.state_dict(), root_rank=0)
        cross_barrier.broadcast_optimizer_state(optimizer, root_rank=0)
        start = copy.deepcopy(model)
        train(model, optimizer, steps)
        optimizer.close()
        results.append([p.detach().clone() for p in model.parameters()])
        if form == "CrossBarrier":
            reference = mean_gradient_reference(start, 0.05, steps)
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    for form in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], form)), "the CrossBarrier forms differ"


def test_push_pull_forms_exact():
    t = torch.arange(4, dtype=torch.float32) * (bps.rank() + 1)
    total = torch.arange(4, dtype=torch.float32) * sum(r + 1 for r in range(bps.size()))
    out = bps.push_pull(t, name="bps.t")
    assert torch.equal(out, total / bps.size()) and torch.equal(t, torch.arange(4.0) * (bps.rank() + 1)), out
    assert torch.equal(bps.push_pull(t, average=False, name="bps.t", version=0, priority=-1), total)
    assert torch.equal(bps.synchronize(bps.push_pull_async(t, average=False, name="bps.t")), total)
    u = t.clone()
    assert bps.synchronize(bps.push_pull_async_inplace(u, name="bps.t")) is u and torch.equal(u, total / bps.size())
    u = t.clone()
    assert bps.push_pull_inplace(u, average=False, name="bps.t") is u and torch.equal(u, total)
    handle = bps.push_pull_async(t, name="bps.t")
    while not bps.poll(handle):
        pass
    assert torch.equal(bps.synchronize(handle), total / bps.size())
    assert torch.equal(bps.push_pull(t, name="bps.t16", compression=bps.Compression.fp16), total / bps.size())
    # Differentiable: the gradient is push-pulled the same way.
    x = torch.ones(3, requires_grad=True)
    bps.push_pull(x, average=False).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(bps.size()))), x.grad
    assert bps.broadcast_object({"seed": bps.rank()}, root_rank=1, name="bps.obj") == {"seed": 1}


def test_declare_ahead_with_and_without_a_tensor():
    assert bps.declare("bps.declared", torch.zeros(2, dtype=torch.float64)) == 0
    assert bps.declare("bps.declared.later") == 0
    t = torch.full((2,), float(bps.rank()), dtype=torch.float64)
    ranks = float(sum(range(bps.size())))
    assert torch.equal(bps.push_pull(t, average=False, name="bps.declared"), torch.full((2,), ranks))
    later = bps.push_pull(torch.ones(1), average=False, name="bps.declared.later")
    assert torch.equal(later, torch.full((1,), float(bps.size())))
    try:
        bps.declare(7)
    except ValueError as e:
        assert "name must be a str" in str(e), str(e)
    else:
        raise AssertionError("declare took a non-str name")


def test_misuse_and_what_baton_lacks_raise_clear_errors():
    model = mlp(seed=3)
    try:
        cross_barrier.CrossBarrier(model, torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2)
    except ValueError as e:
        assert "backward_passes_per_step=2" in str(e), str(e)
    else:
        raise AssertionError("CrossBarrier took backward_passes_per_step=2")
    for call, text in ((bps.suspend, "bps.suspend"), (lambda: bps.resume(2, 1, 0), "bps.resume")):
        try:
            call()
        except bps.NotSupportedError as e:
            assert isinstance(e, NotImplementedError) and text in str(e) and "elastic" in str(e), str(e)
        else:
            raise AssertionError(text + " was accepted")
    # The job goes on.
    assert torch.equal(bps.push_pull(torch.ones(2), average=False, name="bps.after"), torch.full((2,), float(bps.size())))


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

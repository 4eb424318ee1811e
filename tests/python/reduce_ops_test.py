"""push_pull's reduce ops (Horovod's op=Sum/Min/Max/Product, torch's
BAND/BOR/BXOR) with real values on every rank of a job started by batonrun:
2 nodes x 2 trainers and 3 nodes x 1 (see tests/python/CMakeLists.txt), so
that both the agents' local reduction and the ring between nodes combine."""

import functools
import sys

import torch

import baton
import baton.torch as bt
from harness import DTYPES, run_tests

INTEGERS = (torch.int32, torch.int64, torch.uint8, torch.int8)


def values(rank, dtype, n=37):
    """Rank-dependent values, exact in every dtype (products of them too):
    1..3, shuffled per rank so that each rank holds the min and the max
    somewhere; negative for signed types at some positions."""
    base = (torch.arange(n) * 7 + rank * 5) % 3 + 1
    if dtype in (torch.uint8,):
        return base.to(dtype)
    sign = torch.where((torch.arange(n) + rank) % 4 == 0, -1, 1)
    return (base * sign).to(dtype)


def reference(op, dtype, n=37):
    """What every rank must get: torch's own reduction of every rank's
    values, in the tensor's dtype."""
    everyone = torch.stack([values(r, dtype, n).to(torch.float64 if dtype.is_floating_point else torch.int64) for r in range(bt.size())])
    if op is bt.Min:
        out = everyone.min(0).values
    elif op is bt.Max:
        out = everyone.max(0).values
    elif op is bt.Product:
        out = everyone.prod(0)
    elif op is bt.Sum:
        out = everyone.sum(0)
    else:
        fn = {bt.BitwiseAnd: torch.bitwise_and, bt.BitwiseOr: torch.bitwise_or, bt.BitwiseXor: torch.bitwise_xor}[op]
        rows = [values(r, dtype, n) for r in range(bt.size())]
        return functools.reduce(fn, rows)
    return out.to(dtype)


def test_every_op_is_exact_for_every_dtype():
    for dtype in DTYPES:
        ops = [bt.Sum, bt.Min, bt.Max, bt.Product]
        if dtype in INTEGERS:
            ops += [bt.BitwiseAnd, bt.BitwiseOr, bt.BitwiseXor]
        for op in ops:
            t = values(bt.rank(), dtype)
            out = bt.push_pull(t, name="ops.%s.%s" % (dtype, op.name), op=op)
            want = reference(op, dtype)
            assert torch.equal(out, want), "%s %s: got %s, want %s" % (op, dtype, out, want)
            assert torch.equal(t, values(bt.rank(), dtype)), "the input changed"


def test_ops_in_place_unnamed_and_async_together():
    """Horovod's allreduce_(op=...) and allreduce_async without names: calls
    in flight together are matched by order, each with its own op."""
    a = values(bt.rank(), torch.float32)
    b = values(bt.rank(), torch.float32)
    c = values(bt.rank(), torch.int64)
    ha = bt.push_pull_async_inplace(a, op=bt.Max)
    hb = bt.push_pull_async_inplace(b, op=bt.Min)
    hc = bt.push_pull_async(c, op=bt.BitwiseXor)
    assert bt.synchronize(ha) is a and torch.equal(a, reference(bt.Max, torch.float32)), a
    assert bt.synchronize(hb) is b and torch.equal(b, reference(bt.Min, torch.float32)), b
    assert torch.equal(bt.synchronize(hc), reference(bt.BitwiseXor, torch.int64))
    # The same name takes another op at its next step.
    for op in (bt.Max, bt.Sum, bt.Average, bt.Min):
        t = values(bt.rank(), torch.float64)
        out = bt.push_pull(t, name="ops.steps", op=op)
        want = reference(bt.Sum, torch.float64) / bt.size() if op is bt.Average else reference(op, torch.float64)
        assert torch.equal(out, want), (op, out, want)


def test_min_and_max_of_a_nan_are_nan():
    t = torch.arange(6, dtype=torch.float32) + bt.rank()
    if bt.rank() == bt.size() - 1:
        t[2] = float("nan")
    for op in (bt.Min, bt.Max):
        out = bt.push_pull(t, name="ops.nan", op=op)
        assert torch.isnan(out[2]), (op, out)
        others = torch.tensor([0, 1, 3, 4, 5])
        want = (torch.arange(6.0) + (0 if op is bt.Min else bt.size() - 1))[others]
        assert torch.equal(out[others], want), (op, out)


def test_misuse_is_refused_with_the_reason_and_the_next_operation_works():
    t = torch.ones(3)
    for kwargs, text in [
        (dict(op=bt.Max, average=True), "takes op or average, not both"),
        (dict(op="max"), "is not a baton.torch reduce op"),
    ]:
        try:
            bt.push_pull(t, name="ops.misuse", **kwargs)
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError("push_pull accepted %r" % (kwargs,))
    # The agent refuses a bitwise op on floats, on every rank (each enqueued it).
    try:
        bt.push_pull(t, name="ops.misuse", op=bt.BitwiseAnd)
    except (ValueError, baton.BatonError) as e:
        assert "band does not apply" in str(e) and "integer tensors only" in str(e), str(e)
    else:
        raise AssertionError("a bitwise op on a float tensor was accepted")
    out = bt.push_pull(t, name="ops.misuse", op=bt.Sum)
    assert torch.equal(out, torch.full((3,), float(bt.size()))), out


def test_nodes_disagreeing_on_the_op_fail_on_every_rank_naming_both():
    """Horovod raises on every rank when the ranks ask for different
    reductions; so does baton, and the name works again afterwards."""
    first_node = bt.rank() < bt.local_size()
    t = torch.ones(4)
    try:
        bt.push_pull(t, name="ops.disagree", op=bt.Max if first_node else bt.Min)
    except baton.BatonError as e:
        assert "different operations" in str(e), str(e)
        assert "max" in str(e) and "min" in str(e), str(e)
    else:
        raise AssertionError("nodes disagreeing on the op were not reported")
    out = bt.push_pull(t, name="ops.disagree", op=bt.Max)
    assert torch.equal(out, torch.ones(4)), out


def test_grouped_allreduce_out_of_place_in_place_and_async():
    """Horovod's grouped_allreduce family: one call, one handle, the results
    in the tensors' order; op and average as for push_pull."""
    tensors = [values(bt.rank(), torch.float32, 5), values(bt.rank(), torch.int64, 9), values(bt.rank(), torch.float64, 1)]
    before = [t.clone() for t in tensors]
    out = bt.grouped_allreduce(tensors, name="group.sum", op=bt.Sum)
    assert isinstance(out, list) and len(out) == 3, out
    for t, b, o in zip(tensors, before, out):
        assert torch.equal(t, b), "grouped_allreduce changed its input"
        assert torch.equal(o, reference(bt.Sum, t.dtype, t.numel())), (t.dtype, o)
    handle = bt.grouped_allreduce_async_(tensors, op=bt.Max)
    back = bt.synchronize(handle)
    assert all(a is b for a, b in zip(back, tensors)), "in place returns the tensors themselves"
    for t in tensors:
        assert torch.equal(t, reference(bt.Max, t.dtype, t.numel())), (t.dtype, t)
    mean = bt.grouped_allreduce([torch.full((2,), float(bt.rank()))], name="group.mean")
    assert torch.equal(mean[0], torch.full((2,), (bt.size() - 1) / 2.0)), mean
    try:
        bt.grouped_allreduce([torch.ones(1), torch.zeros(1, dtype=torch.complex64)], name="group.bad")
    except ValueError as e:
        assert "grouped_allreduce tensor 1" in str(e), str(e)
    else:
        raise AssertionError("a group with a bad tensor started")


def test_barrier_waits_for_every_rank():
    bt.barrier()
    gate = torch.zeros(1)
    if bt.rank() == 0:
        # Reaches the barrier only after every other rank's attempt timed
        # out (they join this push_pull after it): no race on the clock.
        bt.push_pull(gate, name="barrier.gate")
        bt.barrier()
    else:
        try:
            bt.barrier(timeout=0.1)
        except TimeoutError:
            pass
        else:
            raise AssertionError("barrier returned while rank 0 had not reached it")
        bt.push_pull(gate, name="barrier.gate")
        bt.barrier()  # waits for the one still in flight
    for _ in range(3):
        bt.barrier()


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

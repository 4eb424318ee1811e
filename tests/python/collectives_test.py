"""baton.torch's collectives with real values, on every rank of a job started
by batonrun (see tests/python/CMakeLists.txt)."""

import sys

import torch

import baton
import baton.torch as bt
from harness import run_tests


def rank_tensor(dtype, shape=(5, 3)):
    """Rank r holds r+1 everywhere; element i adds i (so order matters)."""
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n) + bt.rank() + 1).reshape(shape).to(dtype)


def expected_sum(dtype, shape=(5, 3)):
    n = 1
    for d in shape:
        n *= d
    ranks = bt.size()
    return (torch.arange(n) * ranks + ranks * (ranks + 1) // 2).reshape(shape).to(dtype)


def test_identity():
    assert 0 <= bt.rank() < bt.size(), (bt.rank(), bt.size())
    assert 0 <= bt.local_rank() < bt.local_size(), (bt.local_rank(), bt.local_size())
    assert bt.size() == 4 and bt.local_size() == 2, (bt.size(), bt.local_size())


def test_push_pull_sums_and_averages():
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        t = rank_tensor(dtype)
        out = bt.push_pull_inplace(t, average=False, name="sum.%s" % dtype)
        assert out is t, "push_pull_inplace works in place"
        assert torch.equal(t, expected_sum(dtype)), (dtype, t)
    t = rank_tensor(torch.float64)
    bt.push_pull_inplace(t, average=True, name="mean")
    assert torch.allclose(t, expected_sum(torch.float64) / bt.size()), t
    # Steps repeat on the same name.
    for step in range(3):
        t = torch.full((4,), float(bt.rank() + step))
        mean = bt.push_pull(t, name="mean.repeated")
        want = sum(r + step for r in range(bt.size())) / bt.size()
        assert torch.allclose(mean, torch.full((4,), want)), (step, mean)


def assert_new_result(out, t, before, want, what):
    """`out` is a new dense tensor holding exactly `want`; `t` still holds
    `before`, bit for bit."""
    assert out is not t, "%s: push_pull returned its input" % what
    assert out.data_ptr() != t.data_ptr(), "%s: the result shares the input's memory" % what
    assert out.is_contiguous() and out.dtype == t.dtype and out.shape == t.shape, what
    assert torch.equal(out, want), "%s: %s" % (what, out)
    assert torch.equal(t, before), "%s: push_pull changed its input to %s" % (what, t)


def test_push_pull_returns_a_new_tensor_and_leaves_the_input_alone():
    """BytePS's push_pull and push_pull_async, Horovod's allreduce: the
    result is a new tensor, the input stays as it was."""
    for dtype in (torch.float32, torch.int64):
        t = rank_tensor(dtype)
        before = t.clone()
        out = bt.push_pull(t, average=False, name="outofplace.%s" % dtype)
        assert_new_result(out, t, before, expected_sum(dtype), "named %s" % dtype)
        out = bt.push_pull(t, average=False)
        assert_new_result(out, t, before, expected_sum(dtype), "unnamed %s" % dtype)
    t = rank_tensor(torch.float64)
    mean = bt.push_pull(t, name="outofplace.mean")
    assert torch.equal(mean, expected_sum(torch.float64) / bt.size()), mean
    assert torch.equal(t, rank_tensor(torch.float64)), t
    # Async, named and unnamed, in flight together with a non-contiguous input.
    named = rank_tensor(torch.float32, (4, 3))
    unnamed = rank_tensor(torch.float32, (4, 3))
    transposed = rank_tensor(torch.float32, (3, 4)).t()
    assert not transposed.is_contiguous()
    handles = [
        bt.push_pull_async(named, average=False, name="outofplace.async"),
        bt.push_pull_async(unnamed, average=False),
        bt.push_pull_async(transposed, average=False, name="outofplace.transposed"),
    ]
    # The input may be changed at once: it was copied when the call returned.
    named.fill_(-1)
    want = expected_sum(torch.float32, (4, 3))
    assert_new_result(bt.synchronize(handles[0]), named, torch.full((4, 3), -1.0), want, "async named")
    assert_new_result(
        bt.synchronize(handles[1]), unnamed, rank_tensor(torch.float32, (4, 3)), want, "async unnamed"
    )
    assert_new_result(
        bt.synchronize(handles[2]),
        transposed,
        rank_tensor(torch.float32, (3, 4)).t(),
        expected_sum(torch.float32, (3, 4)).t(),
        "async non-contiguous",
    )
    # A parameter: the result is a plain tensor, the parameter untouched.
    p = torch.nn.Parameter(rank_tensor(torch.float32))
    out = bt.push_pull(p, average=False, name="outofplace.param")
    assert not out.requires_grad
    assert_new_result(out, p.detach(), rank_tensor(torch.float32), expected_sum(torch.float32), "param")


def test_push_pull_async_delivers_only_at_synchronize():
    t = rank_tensor(torch.float32)
    before = t.clone()
    handle = bt.push_pull_async_inplace(t, average=False, name="async")
    while not bt.poll(handle):
        pass
    assert torch.equal(t, before), "the result lands in the tensor at synchronize()"
    assert bt.synchronize(handle) is t
    assert torch.equal(t, expected_sum(torch.float32))
    try:
        bt.synchronize(handle)
    except ValueError as e:
        assert "unknown baton handle" in str(e), str(e)
    else:
        raise AssertionError("a handle was synchronized twice")


def test_synchronize_times_out_while_a_rank_lags_then_delivers():
    t = torch.full((3,), float(bt.rank()))
    release = torch.zeros(1)
    # The ranks use the names in different orders below: declare them first.
    bt.declare("lag", t)
    bt.declare("release", release, op="broadcast")
    if bt.rank() == 0:
        handle = bt.push_pull_async_inplace(t, average=False, name="lag")
        try:
            bt.synchronize(handle, timeout=0.2)
        except TimeoutError as e:
            assert "still in flight" in str(e), str(e)
        else:
            raise AssertionError("synchronize returned while the other ranks had not started")
        assert torch.equal(t, torch.zeros(3)), "a timed-out synchronize leaves the tensor alone"
        bt.broadcast(release, 0, "release")  # now the others start
        bt.synchronize(handle)
    else:
        bt.broadcast(release, 0, "release")
        bt.push_pull_inplace(t, average=False, name="lag")
    want = float(sum(range(bt.size())))
    assert torch.equal(t, torch.full((3,), want)), t


def test_unnamed_and_non_contiguous_tensors_in_place():
    a = rank_tensor(torch.float32, (3, 4)).t()  # not contiguous
    b = rank_tensor(torch.float32, (3, 4)).t()
    ha = bt.push_pull_async_inplace(a, average=False)
    hb = bt.push_pull_async_inplace(b, average=False)  # same shape, in flight together
    assert bt.synchronize(hb) is b
    assert bt.synchronize(ha) is a
    want = expected_sum(torch.float32, (3, 4)).t()
    assert torch.equal(a, want) and torch.equal(b, want), (a, b)
    c = rank_tensor(torch.int32, (3, 4)).t()
    assert bt.push_pull_inplace(c, average=False, name="inplace.transposed") is c
    assert torch.equal(c, expected_sum(torch.int32, (3, 4)).t()), c


def test_bad_tensors_are_refused_with_the_reason():
    for bad, text in [
        (torch.zeros(2, dtype=torch.complex64), "has dtype"),
        ([1.0, 2.0], "must be a torch.Tensor"),
    ]:
        try:
            bt.push_pull(bad, name="bad")
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError("push_pull accepted %r" % (bad,))


def test_a_name_is_declared_anew_once_nothing_of_it_is_in_flight():
    """As in Horovod and BytePS: a name may change its shape, dtype and
    collective between operations; changing it while its operation is in
    flight is refused, and the refusal changes nothing."""
    for dtype, shape in [(torch.float32, (10, 100)), (torch.float32, (10,)), (torch.int64, (2, 3))]:
        out = bt.push_pull(rank_tensor(dtype, shape), average=False, name="reused")
        assert torch.equal(out, expected_sum(dtype, shape)), (dtype, shape, out)
    handle = bt.push_pull_async(rank_tensor(torch.int64, (2, 3)), average=False, name="reused")
    try:
        bt.push_pull_async(torch.zeros(4), name="reused")
    except ValueError as e:
        assert e.code == "FAILED_PRECONDITION", e.code
        assert 'tensor "reused" already has an operation in flight' in str(e), str(e)
    else:
        raise AssertionError("a name changed its spec while in flight")
    assert torch.equal(bt.synchronize(handle), expected_sum(torch.int64, (2, 3)))
    root = torch.full((3,), float(bt.rank()))
    bt.broadcast(root, 1, name="reused")
    assert torch.equal(root, torch.full((3,), 1.0)), root
    # A second model with the same parameter names and other shapes.
    for width in (6, 9):
        torch.manual_seed(200 + width + bt.rank())
        model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
        bt.broadcast_parameters(model.state_dict(), root_rank=0)
        torch.manual_seed(200 + width)
        expected = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
        assert_like_root(model, expected, "width %d" % width)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))


def assert_like_root(model, root_model, what):
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), root_model.state_dict().items()):
        assert torch.equal(mine, theirs), "%s: %s differs from the root's" % (what, name)


def test_broadcast_parameters_dict():
    root = 1
    model = make_model(100 + bt.rank())  # different everywhere
    bt.broadcast_parameters(model.state_dict(), root_rank=root)
    assert_like_root(model, make_model(100 + root), "state_dict")


def test_broadcast_parameters_list_of_tuples_and_of_tensors():
    model = make_model(200 + bt.rank())
    bt.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    expected = make_model(200)
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        assert torch.equal(p.detach(), q.detach()), "named list: %s" % name
    tensors = [torch.full((3,), float(bt.rank())), torch.full((2, 2), bt.rank() * 10.0)]
    bt.broadcast_parameters(tensors, root_rank=2)
    assert torch.equal(tensors[0], torch.full((3,), 2.0)), tensors[0]
    assert torch.equal(tensors[1], torch.full((2, 2), 20.0)), tensors[1]


def test_broadcast_parameters_refuses_other_types():
    for bad in (torch.zeros(3), ("a", torch.zeros(1)), 7):
        try:
            bt.broadcast_parameters(bad, root_rank=0)
        except ValueError as e:
            assert str(e) == "invalid params of type: %s" % type(bad), str(e)
        else:
            raise AssertionError("broadcast_parameters accepted %r" % (bad,))


def test_broadcast_optimizer_state():
    model = make_model(300)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (bt.rank() + 1))
    # Different state everywhere: each rank steps a different number of times.
    for _ in range(bt.rank() + 1):
        model(torch.randn(4, 4)).sum().backward()
        optimizer.step()
    bt.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01, state["param_groups"]
    for index, s in state["state"].items():
        assert int(s["step"]) == 1, (index, s["step"])
        root = s["exp_avg"].clone()
        bt.broadcast(root, 0, "Check.exp_avg.%d" % index)
        assert torch.equal(s["exp_avg"], root), index


def test_nodes_disagreeing_fail_the_operation_on_every_rank_naming_both():
    # The first node sums, the second averages: the same step of the same
    # tensor asked two ways. Every rank gets the error, nobody hangs, and the
    # name works again afterwards.
    t = torch.ones(2)
    first_node = bt.rank() < bt.local_size()
    try:
        bt.push_pull_inplace(t, average=not first_node, name="disagree")
    except baton.BatonError as e:
        assert "disagree" in str(e), str(e)
        code = e.code
    else:
        raise AssertionError("nodes disagreeing on average were not reported")
    assert code in ("FAILED_PRECONDITION", "INVALID_ARGUMENT", "ABORTED"), code
    assert torch.equal(t, torch.ones(2)), "a failed operation leaves the tensor alone"
    bt.push_pull_inplace(t, average=False, name="disagree")
    assert torch.equal(t, torch.full((2,), float(bt.size()))), t


def test_errors_carry_codes():
    assert issubclass(baton.BatonError, RuntimeError)
    try:
        bt.broadcast(torch.zeros(1), root_rank=bt.size(), name="root.out.of.range")
    except ValueError as e:
        assert "root rank %d is outside" % bt.size() in str(e), str(e)
    else:
        raise AssertionError("a root rank outside the job was accepted")


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

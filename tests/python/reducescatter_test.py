"""reducescatter with Horovod's semantics on every rank of a job started by
batonrun: 2 nodes x 2 trainers and 3 nodes x 1 (see
tests/python/CMakeLists.txt), so that both the agents' local reduction and
the reduce-scatter between nodes combine the ranks' values."""

import sys

import torch

import baton.torch as bt
from harness import DTYPES, expect_error, run_tests


def values(rank, rows, dtype, width=3):
    """Rank-dependent small values, exact in every dtype when summed over
    a few ranks."""
    return ((torch.arange(rows * width).reshape(rows, width) * 7 + rank * 3) % 11).to(dtype)


def split(rows):
    """Horovod's split: the first ranks take one row more."""
    world = bt.size()
    counts = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
    begin = sum(counts[: bt.rank()])
    return begin, begin + counts[bt.rank()]


def reference(rows, dtype, reduce, width=3):
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    everyone = torch.stack([values(r, rows, dtype, width).to(wide) for r in range(bt.size())])
    begin, end = split(rows)
    return reduce(everyone)[begin:end]


def test_sum_of_every_dtype_even_and_uneven_rows():
    for dtype in DTYPES:
        for rows in (bt.size() * 2, bt.size() * 2 + 1, 1):
            t = values(bt.rank(), rows, dtype)
            out = bt.reducescatter(t, op=bt.Sum, name="rs.%s.%d" % (dtype, rows))
            want = reference(rows, dtype, lambda e: e.sum(0)).to(dtype)
            assert out.dtype == dtype and torch.equal(out, want), "%s rows %d: got %s, want %s" % (dtype, rows, out, want)
            assert torch.equal(t, values(bt.rank(), rows, dtype)), "the input changed"


def test_average_is_the_default_and_min_max_product_apply():
    rows = bt.size() * 3 + 2
    t = values(bt.rank(), rows, torch.float64)
    mean = bt.reducescatter(t, name="rs.mean")
    assert torch.allclose(mean, reference(rows, torch.float64, lambda e: e.mean(0))), mean
    for op, reduce in ((bt.Min, lambda e: e.min(0).values), (bt.Max, lambda e: e.max(0).values), (bt.Product, lambda e: e.prod(0))):
        out = bt.reducescatter(t, op=op, name="rs.%s" % op.name)
        assert torch.equal(out, reference(rows, torch.float64, reduce)), (op, out)
    x = values(bt.rank(), rows, torch.int32)
    out = bt.reducescatter(x, op=bt.BitwiseXor, name="rs.xor")
    everyone = [values(r, rows, torch.int32) for r in range(bt.size())]
    acc = everyone[0]
    for other in everyone[1:]:
        acc = torch.bitwise_xor(acc, other)
    begin, end = split(rows)
    assert torch.equal(out, acc[begin:end]), out


def test_unnamed_async_calls_match_by_order():
    a = values(bt.rank(), 5, torch.float32)
    b = values(bt.rank(), 7, torch.int64, width=2)
    ha = bt.reducescatter_async(a, op=bt.Sum)
    hb = bt.reducescatter_async(b, op=bt.Max)
    assert torch.equal(bt.synchronize(hb), reference(7, torch.int64, lambda e: e.max(0).values, width=2))
    assert torch.equal(bt.synchronize(ha), reference(5, torch.float32, lambda e: e.sum(0)).to(torch.float32))


def test_large_tensor_in_partitions():
    rows = bt.size() * 2048
    t = torch.arange(rows * 512, dtype=torch.float32).reshape(rows, 512) % 1000 * (bt.rank() + 1)
    out = bt.reducescatter(t, op=bt.Sum, name="rs.large")
    scale = sum(r + 1 for r in range(bt.size()))
    base = torch.arange(rows * 512, dtype=torch.float32).reshape(rows, 512) % 1000
    begin, end = split(rows)
    assert torch.equal(out, base[begin:end] * scale)


def test_shape_or_dtype_disagreement_raises_on_every_rank_and_the_next_call_works():
    rows = 4 if bt.rank() == 0 else 5
    expect_error(lambda: bt.reducescatter(values(bt.rank(), rows, torch.float32), name="rs.bad"), "first dimension", "ranks")
    dtype = torch.float32 if bt.rank() == 0 else torch.int32
    expect_error(lambda: bt.reducescatter(values(bt.rank(), 4, dtype)), "dtype", "float32", "int32")
    out = bt.reducescatter(values(bt.rank(), 4, torch.float32), op=bt.Sum, name="rs.bad")
    assert torch.equal(out, reference(4, torch.float32, lambda e: e.sum(0)).to(torch.float32))


def test_misuse_is_refused_before_anything_starts():
    expect_error(lambda: bt.reducescatter(torch.tensor(1.0)), "scalar")
    expect_error(lambda: bt.reducescatter(values(0, 2, torch.float32), op=bt.Sum, average=True), "op or average")


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

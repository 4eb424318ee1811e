"""alltoall with Horovod's semantics on every rank of a job started by
batonrun: 2 nodes x 2 trainers and 3 nodes x 1, over the TCP rings and
over gloo (see tests/python/CMakeLists.txt), so that the agents' packing of
their trainers' blocks and the exchange between nodes both move every
row."""

import sys

import torch

import baton.torch as bt
from harness import DTYPES, expect_error, run_tests


def part(source, dest, rows, dtype, width=3):
    """The rows rank `source` sends rank `dest`: distinct per (source,
    dest, row), exact in every dtype (small values)."""
    base = torch.arange(rows * width).reshape(rows, width)
    return ((base * 5 + source * 17 + dest * 3) % 97).to(dtype)


def tensor_of(source, splits, dtype, width=3):
    return torch.cat([part(source, d, n, dtype, width) for d, n in enumerate(splits)])


def expected(splits_of, dtype, width=3):
    """What this rank receives: every rank's part for it, in rank order."""
    me = bt.rank()
    return torch.cat([part(s, me, splits_of(s)[me], dtype, width) for s in range(bt.size())])


def test_equal_parts_of_every_dtype():
    world = bt.size()
    for dtype in DTYPES:
        splits = [2] * world
        t = tensor_of(bt.rank(), splits, dtype)
        out = bt.alltoall(t, name="a2a.%s" % dtype)
        want = expected(lambda s: splits, dtype)
        assert out.dtype == dtype and torch.equal(out, want), "%s: got %s, want %s" % (dtype, out, want)
        assert torch.equal(t, tensor_of(bt.rank(), splits, dtype)), "the input changed"


def uneven(source):
    """Rank `source`'s splits: 0 to 3 rows per destination, some empty."""
    return [(source + 2 * d) % 4 for d in range(bt.size())]


def test_uneven_splits_return_the_received_splits():
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        t = tensor_of(bt.rank(), uneven(bt.rank()), dtype)
        for name in ("a2a.uneven.%s" % dtype, None):
            out, received = bt.alltoall(t, splits=uneven(bt.rank()), name=name)
            want = expected(uneven, dtype)
            assert torch.equal(out, want), "%s: got %s, want %s" % (dtype, out, want)
            assert received.tolist() == [uneven(s)[bt.rank()] for s in range(bt.size())], received
    # Splits as a tensor, and a 1-D tensor of one row per part.
    splits = torch.tensor(uneven(bt.rank()))
    flat = torch.arange(int(splits.sum()), dtype=torch.float64) + 100 * bt.rank()
    out, received = bt.alltoall(flat, splits=splits, name="a2a.flat")
    assert out.dim() == 1 and out.numel() == int(received.sum()), out


def test_large_parts_go_in_partitions():
    world = bt.size()
    rows = 1024  # 1024 x 512 float32: 2 MiB a part
    t = torch.cat([torch.full((rows, 512), float(bt.rank() * world + d)) for d in range(world)])
    out = bt.alltoall(t, name="a2a.large")
    want = torch.cat([torch.full((rows, 512), float(s * world + bt.rank())) for s in range(world)])
    assert torch.equal(out, want)


def test_unnamed_async_calls_match_by_order():
    world = bt.size()
    a = tensor_of(bt.rank(), [1] * world, torch.float32)
    b = tensor_of(bt.rank(), uneven(bt.rank()), torch.int32, width=2)
    ha = bt.alltoall_async(a)
    hb = bt.alltoall_async(b, splits=uneven(bt.rank()))
    out_b, _ = bt.synchronize(hb)
    assert torch.equal(out_b, expected(uneven, torch.int32, width=2)), out_b
    assert torch.equal(bt.synchronize(ha), expected(lambda s: [1] * world, torch.float32))


def test_disagreement_raises_on_every_rank_and_the_next_call_works():
    world = bt.size()
    splits = [1] * world
    dtype = torch.float32 if bt.rank() == 0 else torch.int32
    expect_error(lambda: bt.alltoall(tensor_of(bt.rank(), splits, dtype), name="a2a.bad"), "dtype", "float32", "int32")
    width = 3 if bt.rank() == 0 else 4
    expect_error(
        lambda: bt.alltoall(tensor_of(bt.rank(), splits, torch.float32, width), name="a2a.bad"), "after the first dimension"
    )
    # Rank 0's splits do not add up to its rows: every rank raises, naming it.
    mine = [2] + [1] * (world - 1) if bt.rank() == 0 else splits
    expect_error(
        lambda: bt.alltoall(tensor_of(bt.rank(), splits, torch.float32), splits=mine, name="a2a.bad"),
        "rank" if bt.rank() else "add up to",
        "{0}" if bt.rank() else "rows",
    )
    out = bt.alltoall(tensor_of(bt.rank(), splits, torch.float32), name="a2a.bad")
    assert torch.equal(out, expected(lambda s: splits, torch.float32))


def test_misuse_is_refused():
    expect_error(lambda: bt.alltoall(torch.tensor(1.0)), "scalar")
    expect_error(lambda: bt.alltoall(torch.zeros(bt.size() * 2 + 1, 2)), "do not split evenly", "splits=")
    expect_error(lambda: bt.alltoall(torch.zeros(bt.size(), 2), splits=[1] * (bt.size() + 1)), "splits for")
    expect_error(lambda: bt.alltoall(torch.zeros(bt.size(), 2), splits=[0.5] * bt.size()), "integers")


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

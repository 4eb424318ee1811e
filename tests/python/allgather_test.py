"""allgather with Horovod's semantics on every rank of a job started by
batonrun: 2 nodes x 2 trainers and 3 nodes x 1 (see
tests/python/CMakeLists.txt), so that both the agents' local copies and the
gathering between nodes place each rank's rows."""

import sys

import torch

import baton.torch as bt
from harness import DTYPES, expect_error, run_tests


def rows_of(rank, n, dtype, width=3):
    """n rows that say which rank wrote them and where, exact in every
    dtype (values below 128)."""
    base = torch.arange(n * width).reshape(n, width) % 50 + rank * 20
    return base.to(dtype)


def everyone(counts, dtype, width=3):
    return torch.cat([rows_of(r, n, dtype, width) for r, n in enumerate(counts)])


def test_equal_rows_every_dtype():
    for dtype in DTYPES:
        t = rows_of(bt.rank(), 2, dtype)
        out = bt.allgather(t, name="ag.%s" % dtype)
        want = everyone([2] * bt.size(), dtype)
        assert out.dtype == dtype and torch.equal(out, want), "%s: got %s, want %s" % (dtype, out, want)
        assert torch.equal(t, rows_of(bt.rank(), 2, dtype)), "the input changed"


def test_first_dimension_differs_per_rank():
    """Horovod's allgather: rank r gives r + 1 rows (rank 0 of a later
    round none), named and unnamed, sizes moving from call to call."""
    for round_ in range(6):
        counts = [(r + round_) % (bt.size() + 1) for r in range(bt.size())]
        t = rows_of(bt.rank(), counts[bt.rank()], torch.float32)
        named = bt.allgather(t, name="ag.ragged")
        unnamed = bt.allgather(t)
        want = everyone(counts, torch.float32)
        assert torch.equal(named, want), "round %d: got %s, want %s" % (round_, named, want)
        assert torch.equal(unnamed, want), "round %d (unnamed): got %s" % (round_, unnamed)


def test_one_dimension_and_many_dimensions():
    one = bt.allgather(torch.full((bt.rank() + 1,), bt.rank(), dtype=torch.int64), name="ag.1d")
    assert one.tolist() == [r for r in range(bt.size()) for _ in range(r + 1)], one
    t = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4) + bt.rank()
    many = bt.allgather(t, name="ag.3d")
    want = torch.cat([torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) + r for r in range(bt.size())])
    assert torch.equal(many, want)


def test_unnamed_async_calls_in_flight_together_match_by_order():
    a = rows_of(bt.rank(), bt.rank() + 1, torch.float32)
    b = rows_of(bt.rank(), 1, torch.int32, width=5)
    ha = bt.allgather_async(a)
    hb = bt.allgather_async(b)
    assert torch.equal(bt.synchronize(hb), everyone([1] * bt.size(), torch.int32, width=5))
    assert torch.equal(bt.synchronize(ha), everyone([r + 1 for r in range(bt.size())], torch.float32))


def test_large_tensor_in_partitions():
    """Larger than a partition: the pieces of each rank's rows are gathered
    apart and put back in place."""
    n = (6 << 20) // (4 * 256)
    t = torch.arange(n * 256, dtype=torch.float32).reshape(n, 256) * (bt.rank() + 1)
    out = bt.allgather(t, name="ag.large")
    base = torch.arange(n * 256, dtype=torch.float32).reshape(n, 256)
    for r in range(bt.size()):
        assert torch.equal(out[r * n : (r + 1) * n], base * (r + 1)), "rank %d's rows" % r


def test_dtype_disagreement_raises_on_every_rank_and_the_next_call_works():
    dtype = torch.float32 if bt.rank() == 0 else torch.int32
    expect_error(lambda: bt.allgather(rows_of(bt.rank(), 1, dtype), name="ag.mixed"), "dtype", "float32", "int32", "ranks")
    out = bt.allgather(rows_of(bt.rank(), 1, torch.float32), name="ag.mixed")
    assert torch.equal(out, everyone([1] * bt.size(), torch.float32))


def test_other_dimensions_disagreement_raises_on_every_rank():
    width = 3 if bt.rank() == 0 else 4
    expect_error(lambda: bt.allgather(rows_of(bt.rank(), 2, torch.float32, width)), "after the first dimension", "[*, 3]", "[*, 4]")
    assert torch.equal(bt.allgather(rows_of(bt.rank(), 2, torch.float32)), everyone([2] * bt.size(), torch.float32))


def test_misuse_is_refused_before_anything_starts():
    expect_error(lambda: bt.allgather(torch.tensor(1.0)), "scalar")
    expect_error(lambda: bt.allgather([1, 2]), "torch.Tensor")


def test_allgather_object():
    objects = bt.allgather_object({"rank": bt.rank(), "t": torch.arange(bt.rank() + 1)})
    assert [o["rank"] for o in objects] == list(range(bt.size()))
    for r, o in enumerate(objects):
        assert torch.equal(o["t"], torch.arange(r + 1))


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

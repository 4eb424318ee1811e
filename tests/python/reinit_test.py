"""shutdown() then init() in one process starts the job name's next run,
three times, with collectives in between (run by batonrun on 2 nodes x 2
trainers: tests/python/CMakeLists.txt).

The trainers leave each run at different times, so that a trainer attaches
to the next run while its node's other trainer still runs the previous one
(the agent keeps the next run waiting), and a node joins the next run while
the other node still runs the previous one (the coordinator holds its join).
The sleeps only make those orders likely; every order must give the same
exact results, and each rank keeps its rank."""

import os
import sys
import time

import torch

import baton.torch as bt

ROUNDS = 3


def leave_delay(round_, rank):
    """Seconds rank `rank` waits before shutdown() in round `round_`: the
    first node leaves first in round 0 (its local rank 0 before its local
    rank 1), the second node first in round 1, everyone at once in round 2."""
    node, local = divmod(rank, 2)
    if round_ == 2:
        return 0.0
    first = node == round_
    return (0.0 if first else 2.0) + 1.0 * local


def run_round(round_, first_rank):
    bt.init(attach_timeout=120)
    rank, size = bt.rank(), bt.size()
    assert (rank, size) == (first_rank, 4), "round %d: rank %d size %d, was %d of 4" % (
        round_,
        rank,
        size,
        first_rank,
    )
    assert bt.local_size() == 2 and bt.local_rank() == int(os.environ["LOCAL_RANK"])
    for step in range(3):
        # A name used in every run, and one new to this run.
        for name in ("reinit.x", "reinit.round%d" % round_):
            t = torch.arange(6, dtype=torch.float64) * (rank + 1) + step + round_
            bt.push_pull_inplace(t, average=False, name=name)
            want = torch.arange(6, dtype=torch.float64) * 10 + 4 * (step + round_)
            assert torch.equal(t, want), (round_, step, name, t)
    root = round_ % size
    b = torch.full((3,), float(rank * 100 + round_))
    bt.broadcast(b, root_rank=root, name="reinit.b")
    assert torch.equal(b, torch.full((3,), float(root * 100 + round_))), (round_, b)
    # Unnamed: matched by dtype, shape and order.
    m = torch.tensor([float(rank)])
    bt.push_pull_inplace(m, average=True)
    assert m.item() == 1.5, m
    time.sleep(leave_delay(round_, rank))
    bt.shutdown()
    assert not bt.is_initialized()
    print("round %d ok on rank %d" % (round_, rank), flush=True)
    return rank


def main():
    torch.set_num_threads(1)
    first_rank = int(os.environ["RANK"])
    for round_ in range(ROUNDS):
        run_round(round_, first_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""shutdown() then init() in a loop, Horovod's own test style (init once per
test, shut down after it), with a collective in every cycle, while CPU hogs
take the machine's cores: every cycle attaches, computes the exact sum and
leaves (issue 36: one run of such a loop once hung after about eight
cycles).

Run without RANK (as ctest does), it is the driver: it starts one busy
process per core, runs itself under batonrun on 2 nodes x 1 trainer with
the cycle count given (default 300), and stops the hogs. Under batonrun
each trainer runs the cycles; every wait inside is bounded (attach and
operation timeouts), so a cycle that cannot finish fails the run instead
of hanging it, and the driver's own timeout is the last bound."""

import os
import subprocess
import sys
import time

import torch

import baton.torch as bt


def trainer(cycles):
    torch.set_num_threads(1)
    first_rank = int(os.environ["RANK"])
    slowest = 0.0
    for cycle in range(cycles):
        start = time.monotonic()
        bt.init(attach_timeout=60)
        rank, size = bt.rank(), bt.size()
        assert (rank, size) == (first_rank, 2), "cycle %d: rank %d of %d, was %d of 2" % (cycle, rank, size, first_rank)
        t = torch.full((4,), float(rank + 1 + cycle))
        bt.push_pull_inplace(t, average=False, name="cycle")
        assert torch.equal(t, torch.full((4,), float(3 + 2 * cycle))), (cycle, t)
        bt.shutdown()
        slowest = max(slowest, time.monotonic() - start)
        if (cycle + 1) % 50 == 0 and rank == 0:
            print("%d cycles done (slowest %.2f s)" % (cycle + 1, slowest), flush=True)
    if first_rank == 0:
        print("all %d cycles ok; slowest %.2f s" % (cycles, slowest), flush=True)
    return 0


def driver(cycles):
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)
    ]
    try:
        command = [
            os.environ["BATONRUN"],
            "--nodes", "2",
            "--procs-per-node", "1",
            "--job", "reinit-cycles",
            "--", sys.executable, os.path.abspath(__file__), str(cycles),
        ]  # fmt: skip
        start = time.monotonic()
        rc = subprocess.call(command, timeout=max(120, 3 * cycles))
        print("batonrun exited %d after %.1f s" % (rc, time.monotonic() - start), flush=True)
        return rc
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    if "RANK" in os.environ:
        return trainer(cycles)
    return driver(cycles)


if __name__ == "__main__":
    sys.exit(main())

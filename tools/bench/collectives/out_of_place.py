#!/usr/bin/python3
"""Out-of-place push_pull (a new result tensor, as bps.push_pull and
hvd.allreduce return) against push_pull_inplace of the same tensor, on
every rank of a batonrun job; rank 0 prints the medians, one line per size.
The modes alternate in rounds; the first 2 calls of each round are warm-up.

  build/bin/batonrun --nodes 2 --procs-per-node 1 -- \\
      /usr/bin/python3 tools/bench/collectives/out_of_place.py [MIB ...]

(PYTHONPATH=build/python; sizes default to 1 and 64 MiB of float32.)"""

import statistics
import sys
import time

import torch

import baton.torch as bt

CALLS, WARMUP, ROUNDS = 12, 2, 2


def main():
    bt.init()
    torch.set_num_threads(1)
    for mib in [int(a) for a in sys.argv[1:]] or [1, 64]:
        x = torch.randn(mib * (1 << 20) // 4)
        times = {"in place": [], "out of place": []}
        for _ in range(ROUNDS):
            for mode in times:
                for call in range(CALLS):
                    start = time.perf_counter()
                    if mode == "in place":
                        bt.push_pull_inplace(x, name="Bench.inplace.%d" % mib)
                    else:
                        y = bt.push_pull(x, name="Bench.outofplace.%d" % mib)
                        del y
                    if call >= WARMUP:
                        times[mode].append(time.perf_counter() - start)
        if bt.rank() == 0:
            median = {k: 1000 * statistics.median(v) for k, v in times.items()}
            print("%d MiB: in place %.1f ms, out of place %.1f ms (%.2fx)" % (
                mib, median["in place"], median["out of place"],
                median["out of place"] / median["in place"]), flush=True)
    bt.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""torch.distributed's side of tools/bench/collectives (gloo backend, CPU).

Started once per rank by tools/bench/collectives/run (Debian's python3-torch
works only under /usr/bin/python3). The ranks meet through a FileStore and
measure the --ops on --bytes as tools/bench/collectives/measurement.h says
(and with its sizes: an allgather's --bytes is one rank's part, a
reduce-scatter's and an alltoall's the whole tensor): warm-up, then per run a
barrier, --iterations timed collectives (dist.all_reduce, sum, and
dist.broadcast from rank 0, in place; dist.all_gather into one tensor's
rank-ordered views; dist.reduce_scatter, sum; dist.all_to_all_single, equal
splits, into a second tensor) on ones, not zeros (measurement.h says why), the
slowest rank's total / iterations, and one untimed collective on the same
checked pattern as the C++ programs.
Rank 0 prints one JSON row per op (tools/bench/timings.h's
PrintCollectiveRow, same fields and rounding). An op this torch's gloo
backend does not have (reduce_scatter in torch 1.13) gets a row with
"unavailable": torch's error, instead of times.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from report import busbw_factor

OPS = ("allreduce", "broadcast", "allgather", "reducescatter", "alltoall")


def pattern(op, rank, size, run, elements):
    """(this rank's input, the expected result) of the checked iteration.

    Built in place on int32 to stay near 3x the tensor per rank at 256 MiB.
    """
    def periodic(count, period, phase=0):
        value = torch.arange(count, dtype=torch.int32)
        return value.add_(run + phase).remainder_(period).add_(1).to(torch.float32)

    if op == "broadcast":
        value = periodic(elements, 251)
        return (value if rank == 0 else torch.full_like(value, -1.0)), value
    value = periodic(elements, 13)
    rank_sum = size * (size + 1) // 2
    if op == "allreduce":
        return value * (rank + 1), value.mul_(rank_sum)
    if op == "allgather":
        return value * (rank + 1), torch.cat([value * (r + 1) for r in range(size)])
    part = elements // size
    if op == "alltoall":
        # Block s of the result is rank s's block `rank`.
        block = periodic(part, 13, rank * part)
        return value.mul_(rank + 1), torch.cat([block * (s + 1) for s in range(size)])
    return value.mul_(rank + 1), periodic(part, 13, rank * part).mul_(rank_sum)


class Collective:
    """One op's buffers: `input` is what a rank writes, `result()` what it reads."""

    def __init__(self, op, elements, size):
        self.op = op
        self.input = torch.ones(elements, dtype=torch.float32)
        if op == "allgather":
            self.output = torch.zeros(elements * size, dtype=torch.float32)
            self.outputs = list(self.output.view(size, elements).unbind(0))
        elif op == "reducescatter":
            self.output = torch.zeros(elements // size, dtype=torch.float32)
            self.inputs = list(self.input.view(size, elements // size).unbind(0))
        elif op == "alltoall":
            self.output = torch.zeros(elements, dtype=torch.float32)

    def run(self):
        if self.op == "allreduce":
            dist.all_reduce(self.input, op=dist.ReduceOp.SUM)
        elif self.op == "broadcast":
            dist.broadcast(self.input, src=0)
        elif self.op == "allgather":
            dist.all_gather(self.outputs, self.input)
        elif self.op == "alltoall":
            dist.all_to_all_single(self.output, self.input)
        else:
            dist.reduce_scatter(self.output, self.inputs, op=dist.ReduceOp.SUM)

    def result(self):
        return self.input if self.op in ("allreduce", "broadcast") else self.output


def print_row(row):
    print(json.dumps(dict({"bench": "collectives", "system": "torch"}, **row),
                     separators=(",", ":")), flush=True)


def measure(op, elements, args):
    rank, size = dist.get_rank(), dist.get_world_size()
    collective = Collective(op, elements, size)
    try:
        collective.run()
    except RuntimeError as e:
        # Raised on every rank before any data moves (torch 1.13's gloo:
        # "ProcessGroupGloo does not support reduce_scatter").
        if "does not support" not in str(e):
            raise
        if rank == 0:
            print_row({"op": op, "nodes": size, "bytes": args.bytes,
                       "unavailable": str(e).splitlines()[0]})
        return
    for _ in range(args.warmup - 1):
        collective.run()
    run_seconds = []
    for run in range(args.runs):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iterations):
            collective.run()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        run_seconds.append(elapsed.item() / args.iterations)

        data, expected = pattern(op, rank, size, run, elements)
        collective.input.copy_(data)
        del data
        collective.run()
        result = collective.result()
        wrong = (result != expected).nonzero()
        if wrong.numel() > 0:
            first = wrong[0].item()
            sys.exit(
                f"collectives: torch {op} of {elements} floats over {size} ranks "
                f"is WRONG: rank {rank} result element {first} is "
                f"{result[first].item():g}, expected {expected[first].item():g} "
                f"(run {run})")
        del expected
        collective.input.fill_(1.0)
    if rank == 0:
        median = statistics.median(run_seconds)
        algbw = args.bytes / median / 1e9 if median > 0 else 0.0
        print_row({
            "op": op, "nodes": size, "bytes": args.bytes,
            "iterations": args.iterations,
            "runs": len(run_seconds), "median_s": float(f"{median:.9g}"),
            "min_s": float(f"{min(run_seconds):.9g}"),
            "max_s": float(f"{max(run_seconds):.9g}"),
            "algbw_gbps": float(f"{algbw:.6g}"),
            "busbw_gbps": float(f"{algbw * busbw_factor(op, size):.6g}"),
        })


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--store", required=True,
                        help="a FileStore path shared by the ranks (not yet present)")
    parser.add_argument("--ops", default="allreduce,broadcast")
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    ops = args.ops.split(",")
    if any(op not in OPS for op in ops):
        parser.error(f"--ops {args.ops}: give some of {', '.join(OPS)}")
    if (args.bytes <= 0 or args.bytes % 4 or args.iterations < 1 or args.runs < 1
            or args.warmup < 1):
        parser.error("--bytes must be a positive multiple of 4, "
                     "--iterations, --runs and --warmup positive")
    for op in ("reducescatter", "alltoall"):
        if op in ops and (args.bytes // 4) % args.nodes:
            parser.error(f"--bytes {args.bytes}: {op} needs a multiple "
                         f"of {args.nodes} floats")

    # Loopback TCP, like the other systems (gloo reads this variable).
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{args.store}",
                            rank=args.rank, world_size=args.nodes,
                            timeout=datetime.timedelta(minutes=2))
    for op in ops:
        measure(op, args.bytes // 4, args)
    # A barrier first: gloo process groups sometimes hang in destroy otherwise.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

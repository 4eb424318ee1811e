#!/usr/bin/python3
"""torch.distributed's side of tools/bench/collectives (gloo backend, CPU).

Started once per rank by tools/bench/collectives/run (Debian's python3-torch
works only under /usr/bin/python3). The ranks meet through a FileStore and
measure the --ops on --bytes as tools/bench/collectives/measurement.h says:
warm-up, then per run a barrier, --iterations timed in-place collectives
(dist.all_reduce, sum; dist.broadcast from rank 0) on zeros, the slowest
rank's total / iterations, and one untimed collective on the same checked
pattern as the C++ programs. Rank 0 prints one JSON row per op
(tools/bench/timings.h's PrintCollectiveRow, same fields and rounding).
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


def pattern(op, rank, size, run, elements):
    """(this rank's input, the expected result) of the checked iteration.

    Built in place on int32 to stay near 3x the tensor per rank at 256 MiB.
    """
    value = torch.arange(elements, dtype=torch.int32)
    value.add_(run).remainder_(13 if op == "allreduce" else 251).add_(1)
    value = value.to(torch.float32)
    if op == "allreduce":
        return value * (rank + 1), value.mul_(size * (size + 1) // 2)
    return (value if rank == 0 else torch.full_like(value, -1.0)), value


def run_op(op, tensor):
    if op == "allreduce":
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    else:
        dist.broadcast(tensor, src=0)


def measure(op, elements, args):
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(elements, dtype=torch.float32)
    for _ in range(args.warmup):
        run_op(op, tensor)
    run_seconds = []
    for run in range(args.runs):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iterations):
            run_op(op, tensor)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        run_seconds.append(elapsed.item() / args.iterations)

        data, expected = pattern(op, rank, size, run, elements)
        tensor.copy_(data)
        del data
        run_op(op, tensor)
        wrong = (tensor != expected).nonzero()
        if wrong.numel() > 0:
            first = wrong[0].item()
            sys.exit(
                f"collectives: torch {op} of {elements} floats over {size} ranks "
                f"is WRONG: rank {rank} element {first} is "
                f"{tensor[first].item():g}, expected {expected[first].item():g} "
                f"(run {run})")
        del expected
        tensor.zero_()
    if rank == 0:
        median = statistics.median(run_seconds)
        algbw = args.bytes / median / 1e9 if median > 0 else 0.0
        factor = 2.0 * (size - 1) / size if op == "allreduce" and size > 1 else 1.0
        print(json.dumps({
            "bench": "collectives", "system": "torch", "op": op, "nodes": size,
            "bytes": args.bytes, "iterations": args.iterations,
            "runs": len(run_seconds), "median_s": float(f"{median:.9g}"),
            "min_s": float(f"{min(run_seconds):.9g}"),
            "max_s": float(f"{max(run_seconds):.9g}"),
            "algbw_gbps": float(f"{algbw:.6g}"),
            "busbw_gbps": float(f"{algbw * factor:.6g}"),
        }, separators=(",", ":")), flush=True)


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
    if any(op not in ("allreduce", "broadcast") for op in ops):
        parser.error(f"--ops {args.ops}: give allreduce and/or broadcast")
    if args.bytes <= 0 or args.bytes % 4 or args.iterations < 1 or args.runs < 1:
        parser.error("--bytes must be a positive multiple of 4, "
                     "--iterations and --runs positive")

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

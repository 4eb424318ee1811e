#!/usr/bin/env python3
"""Aggregates tools/bench/collectives rows and prints the markdown table.

Reads the per-run rows the programs printed (runs.jsonl: one row per
invocation, each one run), writes one row per (system, op, nodes, bytes) to
collectives.jsonl: the median over the runs of the per-iteration time, min and
max for the spread, and the bandwidths of the median (nccl-tests'
definitions, GB/s = 1e9 bytes/s). Prints per (op, nodes, size) each system's
time (with --spread: and its min-max over the runs) and busbw and baton's
busbw over each other system's (the inverse ratio of the times; > 1: baton
is faster), then the goal check: baton >= 0.9x raw gloo and ahead of
torch.distributed from 1 MiB up. A system that lacks an op (its program
printed a row with "unavailable") gets a row saying so, and "n/a" in the table.
"""

import argparse
import json
import statistics
import sys

SYSTEMS = ("baton", "session", "baton-gloo", "gloo", "mpi", "torch")
GOAL_FROM_BYTES = 1 << 20


def busbw_factor(op, nodes):
    """busbw / algbw, as tools/bench/timings.h's CollectiveBusFactor."""
    if nodes < 2:
        return 1.0
    return {"allreduce": 2.0 * (nodes - 1) / nodes, "allgather": nodes - 1.0,
            "reducescatter": (nodes - 1.0) / nodes,
            "alltoall": (nodes - 1.0) / nodes}.get(op, 1.0)


def aggregate(run_rows):
    groups = {}
    unavailable = {}
    for row in run_rows:
        if "unavailable" in row:
            key = (row["system"], row["op"], row["nodes"], row["bytes"])
            unavailable[key] = dict(row, runs=unavailable.get(key, {}).get("runs", 0) + 1)
            continue
        key = (row["system"], row["op"], row["nodes"], row["bytes"])
        groups.setdefault(key, []).append(row)
    rows = []
    for (system, op, nodes, size), group in sorted(groups.items()):
        iterations = sorted({r["iterations"] for r in group})
        seconds = [r["median_s"] for r in group]
        median = statistics.median(seconds)
        algbw = size / median / 1e9 if median > 0 else 0.0
        rows.append({
            "bench": "collectives", "system": system, "op": op, "nodes": nodes,
            "bytes": size,
            "iterations": iterations[0] if len(iterations) == 1 else iterations,
            "runs": sum(r["runs"] for r in group),
            "median_s": median, "min_s": min(r["min_s"] for r in group),
            "max_s": max(r["max_s"] for r in group),
            "algbw_gbps": float(f"{algbw:.6g}"),
            "busbw_gbps": float(f"{algbw * busbw_factor(op, nodes):.6g}"),
        })
    return rows + [unavailable[key] for key in sorted(unavailable)]


def size_text(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def time_text(seconds):
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def time_cell(row, spread):
    """The median time; with `spread`, and the fastest and slowest run."""
    text = time_text(row["median_s"])
    if spread:
        text += f" ({time_text(row['min_s'])}-{time_text(row['max_s'])})"
    return text


def table(rows, systems, skipped, spread=False):
    by_key = {(r["system"], r["op"], r["nodes"], r["bytes"]): r for r in rows}
    measured = {k: r for k, r in by_key.items() if "unavailable" not in r}
    cases = sorted({(r["op"], r["nodes"], r["bytes"]) for r in rows})
    others = [s for s in systems if s != "baton"]
    lines = [
        "| op | nodes | size | " + " | ".join(
            f"{s} time | {s} busbw" for s in systems) + " | " + " | ".join(
                f"baton/{s}" for s in others) + " |",
        "|" + "---|" * (3 + 2 * len(systems) + len(others)),
    ]
    for op, nodes, size in cases:
        cells = [op, str(nodes), size_text(size)]
        for s in systems:
            r = by_key.get((s, op, nodes, size))
            if r and "unavailable" in r:
                cells += ["n/a", "n/a"]
            else:
                cells += ([time_cell(r, spread), f"{r['busbw_gbps']:.3g} GB/s"]
                          if r else ["-", "-"])
        baton = measured.get(("baton", op, nodes, size))
        for s in others:
            r = measured.get((s, op, nodes, size))
            cells.append(f"{r['median_s'] / baton['median_s']:.2f}"
                         if baton and r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    missing = sorted({(r["system"], r["op"], r["unavailable"]) for r in rows
                      if "unavailable" in r})
    if skipped or missing:
        lines.append("")
    lines += [f"skipped: {line}" for line in skipped]
    lines += [f"n/a: {system} has no {op} ({why})" for system, op, why in missing]
    return "\n".join(lines)


def goal(rows):
    """The goal statement's two ratios at >= 1 MiB, worst case first."""
    by_key = {(r["system"], r["op"], r["nodes"], r["bytes"]): r for r in rows
              if "unavailable" not in r}
    out = []
    for other, bound, want in (("gloo", 0.9, ">= 0.9"), ("torch", 1.0, "> 1")):
        ratios = []
        for (system, op, nodes, size), r in by_key.items():
            o = by_key.get((other, op, nodes, size))
            if system == "baton" and size >= GOAL_FROM_BYTES and o:
                ratios.append((o["median_s"] / r["median_s"], op, nodes, size))
        if not ratios:
            continue
        worst = min(ratios)
        met = worst[0] >= bound if other == "gloo" else worst[0] > bound
        out.append(
            f"baton/{other} from 1 MiB up: worst {worst[0]:.2f} ({worst[1]}, "
            f"{worst[2]} nodes, {size_text(worst[3])}), want {want}: "
            f"{'met' if met else 'NOT met'}")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="per-run rows (jsonl)")
    parser.add_argument("--out", required=True, help="aggregated rows (jsonl)")
    parser.add_argument("--systems", default=" ".join(SYSTEMS))
    parser.add_argument("--skipped", help="a file of skip messages, one a line")
    parser.add_argument("--spread", action="store_true",
                        help="time cells: median (min-max over the runs)")
    args = parser.parse_args()
    with open(args.runs) as f:
        run_rows = [json.loads(line) for line in f if line.strip()]
    rows = aggregate(run_rows)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    skipped = []
    if args.skipped:
        with open(args.skipped) as f:
            skipped = [line.strip() for line in f if line.strip()]
    systems = [s for s in args.systems.split() if s in SYSTEMS]
    print(table(rows, systems, skipped, args.spread))
    check = goal(rows)
    if check:
        print()
        print(check)
    return 0


if __name__ == "__main__":
    sys.exit(main())

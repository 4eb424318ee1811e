#!/usr/bin/python3
"""Turns a tools/bench/run results directory into markdown (and plots).

    report.py OUT [--docs docs/benchmarks.md --plots docs/benchmarks]

Prints every section to stdout. With --docs, replaces the text between each
"<!-- bench:NAME -->" and "<!-- /bench:NAME -->" marker pair of that file
with the section NAME (machine, collectives, scheduling, overheads); with
--plots, writes PNG plots there (python3-matplotlib) and links them.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from collections import defaultdict

SYSTEMS = ["baton", "session", "baton-gloo", "gloo", "mpi", "torch"]
SYSTEM_NAMES = {
    "baton": "baton (agents)",
    "session": "baton (Session, copies)",
    "baton-gloo": "baton (agents, --data_transport=gloo)",
    "gloo": "raw gloo",
    "mpi": "OpenMPI",
    "torch": "torch.distributed (gloo)",
}


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def size_text(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def time_text(seconds):
    if seconds >= 1:
        return "%.2f s" % seconds
    if seconds >= 1e-3:
        return "%.2f ms" % (seconds * 1e3)
    return "%.0f us" % (seconds * 1e6)


def command_output(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_section(out, quick):
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    if os.path.exists("/proc/meminfo"):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_kib = int(line.split()[1])
    versions = []
    for package in ("libgloo-dev", "libopenmpi-dev", "python3-torch", "libgrpc++-dev"):
        v = command_output(["dpkg-query", "-W", "-f=${Version}", package])
        if v:
            versions.append("%s %s" % (package, v))
    commit = command_output(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"])
    lines = [
        "| | |",
        "|---|---|",
        "| CPU | %s, %d logical cores |" % (cpu or platform.processor(), os.cpu_count() or 0),
        "| memory | %.1f GiB |" % (mem_kib / (1 << 20)),
        "| kernel | %s |" % platform.release(),
        "| packages | %s |" % ", ".join(versions),
        "| baton | commit %s |" % (commit or "?"),
        "| command | `tools/bench/run%s` (results of this run were in `%s`) |"
        % (" --quick" if quick else "", out),
    ]
    return "\n".join(lines) + "\n"


def collectives_section(out, plots):
    rows = read_jsonl(os.path.join(out, "collectives.jsonl"))
    if not rows:
        return "(not run)\n"
    groups = defaultdict(dict)
    runs = {}
    for r in rows:
        groups[(r["op"], r["nodes"], r["bytes"])][r["system"]] = r
        if "unavailable" not in r:
            runs[r["system"]] = r.get("runs", 1)
    text = []
    for op in sorted({k[0] for k in groups}):
        for nodes in sorted({k[1] for k in groups if k[0] == op}):
            present = [s for s in SYSTEMS if any(s in groups[k] for k in groups if k[:2] == (op, nodes))]
            text.append("**%s, %d nodes** (median time per operation, busbw in GB/s; "
                        "ratios are baton's busbw over the other's)\n" % (op, nodes))
            header = ["size"] + ["%s time / busbw" % SYSTEM_NAMES[s] for s in present]
            header += ["baton / %s" % s for s in present if s != "baton"]
            text.append("| " + " | ".join(header) + " |")
            text.append("|" + "---:|" * len(header))
            for size in sorted(k[2] for k in groups if k[:2] == (op, nodes)):
                g = groups[(op, nodes, size)]
                cells = [size_text(size)]
                for s in present:
                    r = g.get(s)
                    if r and "unavailable" in r:
                        cells.append("n/a")
                    else:
                        cells.append("%s / %.3f" % (time_text(r["median_s"]), r["busbw_gbps"]) if r else "-")
                for s in present:
                    if s == "baton":
                        continue
                    b, o = g.get("baton"), g.get(s)
                    cells.append("**%.2f**" % (b["busbw_gbps"] / o["busbw_gbps"])
                                 if b and o and o.get("busbw_gbps", 0) > 0 else "-")
                text.append("| " + " | ".join(cells) + " |")
            text.append("")
    spread = ", ".join("%s %d" % (SYSTEM_NAMES[s], runs[s]) for s in SYSTEMS if s in runs)
    text.append("Runs per row (the median is shown; min and max are in collectives.jsonl): %s.\n" % spread)
    for system, op, why in sorted({(r["system"], r["op"], r["unavailable"]) for r in rows if "unavailable" in r}):
        text.append("n/a: %s has no %s (%s).\n" % (SYSTEM_NAMES[system], op, why))
    if plots:
        text.append(plot_collectives(groups, plots))
    return "\n".join(text)


def plot_collectives(groups, plots):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no plot: python3-matplotlib is not installed)\n"
    os.makedirs(plots, exist_ok=True)
    links = []
    for op in sorted({k[0] for k in groups}):
        node_counts = sorted({k[1] for k in groups if k[0] == op})
        fig, axes = plt.subplots(1, len(node_counts), figsize=(5 * len(node_counts), 3.8), squeeze=False)
        for ax, nodes in zip(axes[0], node_counts):
            for s in SYSTEMS:
                points = sorted((k[2], g[s]["busbw_gbps"]) for k, g in groups.items() if k[:2] == (op, nodes) and "busbw_gbps" in g.get(s, {}))
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=SYSTEM_NAMES[s])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes")
            ax.set_ylabel("busbw (GB/s)")
            ax.set_title("%s, %d nodes" % (op, nodes))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = "collectives-%s.png" % op
        fig.savefig(os.path.join(plots, name), dpi=100)
        plt.close(fig)
        links.append("![%s bus bandwidth](benchmarks/%s)" % (op, name))
    return "\n\n".join(links) + "\n"


def scheduling_section(out):
    rows = read_jsonl(os.path.join(out, "scheduling.jsonl"))
    if not rows:
        return "(not run)\n"
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        return "Skipped: %s\n" % skipped[0]["skipped"]
    by_mode = {r["mode"]: r for r in rows}
    text = []
    first = rows[0]
    text.append("Model %s (%s parameters, %s of gradients per step), %d nodes, links shaped to %s Mbit/s, "
                "%s steps per mode and round (the median over rounds shown; min and max over every step):\n"
                % (first.get("model", "?"), "{:,}".format(first.get("params", 0)),
                   size_text(int(first.get("grad_bytes", 0))), first.get("nodes", 0),
                   first.get("rate_mbit", "?"), first.get("steps", "?")))
    text.append("| | median step | min | max | rounds (median of) | priority speedup over it |")
    text.append("|---|---:|---:|---:|---:|---:|")
    priority = by_mode.get("priority")
    names = {"ddp": "torch DDP (gloo)", "fifo": "baton fifo + DistributedOptimizer",
             "priority": "baton priority + ScheduledOptimizer", "compute": "compute only (1 process)",
             "ideal": "ideal bound max(compute, communication)"}
    for mode in ("ddp", "fifo", "priority", "compute", "ideal"):
        r = by_mode.get(mode)
        if not r:
            continue
        med = r.get("median_step_s")
        speed = ""
        if priority and mode in ("ddp", "fifo") and med:
            speed = "**%.2fx**" % (med / priority["median_step_s"])
        elif priority and mode == "ideal" and med:
            speed = "priority is %.0f%% above it" % (100 * (priority["median_step_s"] / med - 1))
        text.append("| %s | %s | %s | %s | %s | %s |" % (
            names[mode], time_text(med) if med else "-",
            time_text(r["min_step_s"]) if r.get("min_step_s") else "-",
            time_text(r["max_step_s"]) if r.get("max_step_s") else "-",
            r.get("rounds", "-"), speed))
    return "\n".join(text) + "\n"


def overheads_section(out):
    text = []
    rate = read_jsonl(os.path.join(out, "overheads.jsonl"))
    if rate:
        runs = max(r.get("run", 1) for r in rate)
        text.append("push_pull on one node (one agent, one trainer, 4-byte tensors), median of %d runs:\n" % runs)
        text.append("| operations in flight | calls/s | round p50 | round p99 |")
        text.append("|---:|---:|---:|---:|")
        for k in sorted({r["in_flight"] for r in rate}):
            mine = [r for r in rate if r["in_flight"] == k]

            def med(key):
                return statistics.median(r[key] for r in mine)

            text.append("| %d | %s | %.0f us | %.0f us |" % (k, "{:,.0f}".format(med("calls_per_s")),
                                                         med("round_p50_us"), med("round_p99_us")))
        text.append("")
    load = read_jsonl(os.path.join(out, "coordinator_load.jsonl"))
    if load:
        text.append("Coordinator load generator (`tools/bench/run_coordinator_load`):\n")
        text.append("| nodes | time to seal | heartbeat p50 | p99 | handling p99 | coordinator RSS (peak) | coordinator CPU | errors |")
        text.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in load:
            if "failed" in r:
                text.append("| %d | failed: %s | | | | | | |" % (r["nodes"], r["failed"]))
                continue
            seal = "%.3f s" % r["seal_s"] if r.get("sealed") else "not sealed"
            p50 = "%.2f ms" % r["p50_ms"] if r.get("latency_samples") else "-"
            p99 = "%.2f ms" % r["p99_ms"] if r.get("latency_samples") else "-"
            # The coordinator's baton_agent_message_seconds over the window.
            handling = "%.2f ms" % r["handling_p99_ms"] if r.get("handled_messages") else "-"
            text.append("| %d | %s | %s | %s | %s | %.0f MiB (%.0f MiB) | %.2f s | %d |" % (
                r["nodes"], seal, p50, p99, handling, r["rss_mib"], r["hwm_mib"], r["cpu_s"],
                r["errors"]))
    return "\n".join(text) + "\n" if text else "(not run)\n"


def replace_blocks(path, sections):
    with open(path) as f:
        doc = f.read()
    for name, body in sections.items():
        pattern = re.compile(r"(<!-- bench:%s -->\n).*?(<!-- /bench:%s -->)" % (name, name), re.S)
        if not pattern.search(doc):
            sys.exit("report.py: %s has no <!-- bench:%s --> ... <!-- /bench:%s --> block" % (path, name, name))
        doc = pattern.sub(lambda m: m.group(1) + body + m.group(2), doc)
    with open(path, "w") as f:
        f.write(doc)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the results directory of tools/bench/run")
    parser.add_argument("--docs", help="markdown file whose bench blocks to replace")
    parser.add_argument("--plots", help="directory for PNG plots")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sections = {
        "machine": machine_section(args.out, args.quick),
        "collectives": collectives_section(args.out, args.plots),
        "scheduling": scheduling_section(args.out),
        "overheads": overheads_section(args.out),
    }
    for name, body in sections.items():
        print("## %s\n\n%s" % (name, body))
    if args.docs:
        replace_blocks(args.docs, sections)


if __name__ == "__main__":
    main()

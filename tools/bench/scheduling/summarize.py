#!/usr/bin/python3
"""Turns the scheduling benchmark's per-trainer results into
OUT/scheduling.jsonl and a markdown table (tools/bench/scheduling/run).

Reads LOGS/compute.json (one process, no communication, before the rounds:
the model's facts and RATE=auto), LOGS/compute.r<R>.json (the same, once in
each round, before its modes), LOGS/concurrent.*.json (NODES such processes
at once, for information) and LOGS/<mode>.r<R>.n<K>.json for each mode and
round. A round's median step is the largest of its nodes'
medians (the slowest node sets the pace); a mode's is the median over its
rounds; min and max are over every node's timed steps.
The ideal bound is max(compute, communication): compute is the single
process's median step (the median over the rounds' measurements when there
are any, else the one before the rounds), communication the bytes each node sends per step in a
ring allreduce of all gradients, 2(n-1)/n x gradient bytes, at the link rate.

CPU (per node and step, G = MiB of gradients, 2^20 bytes):
  trainer CPU      the trainer process's CPU seconds (every thread) over its
                   timed steps / timed steps; median over nodes and rounds
  trainer extra    trainer CPU - the compute-only run's trainer CPU: what
                   communication adds inside the trainer (gloo's threads and
                   DDP's hooks for ddp; the baton client for fifo/priority)
  agent CPU        LOGS/<mode>.r<R>.agents_cpu (every agent's CPU seconds
                   from just before the job's trainers start to just after
                   they all end: start-up and warm-up included) / NODES /
                   STEPS; median over rounds. ~0 for ddp (idle agents)
  ms per MiB       1000 x each of the two above / G
Speedup over DDP (fifo, priority): DDP's median step / the mode's.

Cores per node (every mode): trainer CPU / the mode's median step, agent CPU
/ the same: how much of a core each process kept busy.

An emulated GPU (trainer.py emu-MODEL; --max-cores given): every row states
the dilation k (every modelled time x k, the links' rate / k: a link shaped
to R stands for R x k) and the ideal bound's compute is the profile's x k
(the compute-only run, beside it, shows what the emulator adds). A mode
whose trainer or agent used more than --max-cores cores is refused (its
row says why; exit status 3): with compute that uses no CPU, a process that
busy means the CPU, not the link, may have set the pace.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

BASE_MODES = ["ddp", "ddp-baton", "fifo", "priority"]
# Each also with its gradients sent as float16 (run's MODE+fp16).
MODES = [m + suffix for m in BASE_MODES for suffix in ("", "+fp16", "+topk")]
NAMES = {
    "ddp": "torch DDP (gloo)",
    "ddp-baton": 'torch DDP on the "baton" backend',
    "fifo": "baton fifo + DistributedOptimizer",
    "priority": "baton priority + ScheduledOptimizer",
    "ddp+fp16": "torch DDP (gloo), fp16_compress_hook",
    "ddp-baton+fp16": 'torch DDP on the "baton" backend, fp16_compress_hook',
    "fifo+fp16": "baton fifo + DistributedOptimizer, Compression.fp16",
    "priority+fp16": "baton priority + ScheduledOptimizer, Compression.fp16",
    "fifo+topk": "baton fifo + DistributedOptimizer, Compression.topk(0.01)",
    "priority+topk": "baton priority + ScheduledOptimizer, Compression.topk(0.01)",
    "compute": "compute only (1 process, no communication)",
    "concurrent": "compute only, NODES processes at once",
    "ideal": "ideal bound max(compute, communication)",
}


def load(path):
    with open(path) as f:
        return json.load(f)


def timed(result, warmup):
    steps = result["step_s"][warmup:]
    if not steps:
        sys.exit("summarize: %d steps with %d warm-up leave none to time" % (len(result["step_s"]), warmup))
    return steps


def row(base, mode, rounds, warmup):
    """`rounds`: per round, every node's result."""
    out = dict(base, mode=mode)
    medians, cpu, lo, hi = [], [], [], []
    for results in rounds:
        per_node = [timed(r, warmup) for r in results]
        medians.append(max(statistics.median(s) for s in per_node))
        lo.append(min(min(s) for s in per_node))
        hi.append(max(max(s) for s in per_node))
        # CPU seconds per timed step of each trainer process (all its threads).
        cpu += [(r["cpu_s"][-1] - r["cpu_s"][warmup - 1]) / len(s) for r, s in zip(results, per_node)]
    out.update(
        median_step_s=statistics.median(medians),
        min_step_s=min(lo),
        max_step_s=max(hi),
        round_medians_s=medians,
        trainer_cpu_per_step_s=statistics.median(cpu),
    )
    return out


def tuning(logs):
    """Per baton job, the partition size and credit it ended with and how
    many times the agents changed them (their "partitions of" log lines)."""
    pattern = re.compile(r"job=sched-(\S+) gen=\d+ node=0 partitions of (\d+) bytes "
                         r"\(were \d+\), credit (\d+) bytes")
    jobs = {}
    for path in sorted(glob.glob(os.path.join(logs, "agent*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                m = pattern.search(line)
                if m:
                    changes, _, _ = jobs.get(m.group(1), (0, 0, 0))
                    jobs[m.group(1)] = (changes + 1, int(m.group(2)), int(m.group(3)))
    return ["%s ended at partitions of %d KiB, credit %d KiB (%d change%s)" %
            (job, p >> 10, c >> 10, n, "" if n == 1 else "s")
            for job, (n, p, c) in sorted(jobs.items())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", required=True, help="the trainers' result files")
    parser.add_argument("--jsonl", required=True, help="scheduling.jsonl to write")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--rate-mbit", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--partition-bytes", type=int, help="BATON_PARTITION_BYTES given (default: none)")
    parser.add_argument("--credit-bytes", type=int, help="baton-agent --credit_bytes given (default: none)")
    parser.add_argument("--default-partition-bytes", type=int, help="the coordinator's default, for the text")
    parser.add_argument("--default-credit-bytes", type=int, help="the agent's default, for the text")
    parser.add_argument("--agent-flags", default="", help="AGENT_FLAGS of the run, for the text")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-cores", type=float,
                        help="an emulated GPU's run: refuse a mode whose trainer or agent used more cores")
    args = parser.parse_args()
    if args.max_cores is not None and not args.max_cores > 0:
        parser.error("--max-cores %r: give a positive number" % args.max_cores)

    compute = load(os.path.join(args.logs, "compute.json"))
    n = args.nodes
    # What the baton jobs ran with: a value given to the run, else baton's
    # own default (*_default: true; the value where the run could read it).
    baton = {}
    for name in ("partition_bytes", "credit_bytes"):
        given, default = getattr(args, name), getattr(args, "default_" + name)
        if given is not None:
            baton[name], baton[name + "_default"] = given, False
        else:
            baton[name + "_default"] = True
            if default is not None:
                baton[name] = default
    if args.agent_flags.strip():
        baton["agent_flags"] = args.agent_flags.strip()
        # AGENT_FLAGS has the last word over CREDIT_BYTES (it comes later).
        credit = re.findall(r"(?:^|\s)--?credit_bytes[= ](\d+)", args.agent_flags)
        if credit:
            baton["credit_bytes"], baton["credit_bytes_default"] = int(credit[-1]), False
    base = {
        "bench": "scheduling",
        "nodes": n,
        "rate_mbit": args.rate_mbit,
        "model": compute["model"],
        "params": compute["params"],
        "grad_bytes": compute["grad_bytes"],
        "batch": compute["batch"],
        "steps": args.steps,
        "warmup": args.warmup,
        "dilation": compute.get("dilation", 1.0),
    }
    emulated = "modelled_compute_s" in compute
    if emulated:
        base.update(emulated=True, profile_source=compute.get("profile_source"),
                    emulated_rate_mbit=args.rate_mbit * base["dilation"])
    rows = {}
    for mode in MODES:
        rounds, agents_cpu = [], []
        for r in range(1, args.rounds + 1):
            tag = os.path.join(args.logs, "%s.r%d" % (mode, r))
            results = [load(p) for p in sorted(glob.glob(tag + ".n*.json"))]
            if len(results) == n:
                rounds.append(results)
                # Every agent's CPU over the whole job (start-up included).
                with open(tag + ".agents_cpu") as f:
                    agents_cpu.append(float(f.read()) / args.steps)
        if rounds:
            rows[mode] = row(base, mode, rounds, args.warmup)
            rows[mode]["rounds"] = len(rounds)
            # All NODES agents together (kept as it was), and per node.
            rows[mode]["agents_cpu_per_step_s"] = statistics.median(agents_cpu)
            rows[mode]["agents_cpu_per_node_per_step_s"] = statistics.median(agents_cpu) / n
            if mode.split("+")[0] != "ddp":
                rows[mode].update(baton)
    # This machine's speed drifts between minutes: the compute measured in
    # every round, next to the modes, is the bound's compute.
    per_round = [load(p) for p in sorted(glob.glob(os.path.join(args.logs, "compute.r*.json")))]
    computes = per_round or [compute]
    rows["compute"] = row(base, "compute", [[c] for c in computes], args.warmup)
    rows["compute"]["rounds"] = len(computes)
    phases = [p for c in computes for p in c["phases_s"][args.warmup:]]
    for i, name in enumerate(("forward_s", "backward_s", "update_s")):
        rows["compute"][name] = statistics.median(p[i] for p in phases)
    concurrent = [load(p) for p in sorted(glob.glob(os.path.join(args.logs, "concurrent.*.json")))]
    if concurrent:
        rows["concurrent"] = row(base, "compute_concurrent", [concurrent], args.warmup)
    comm_bytes = 2 * (n - 1) / n * compute["grad_bytes"]
    comm_s = comm_bytes * 8 / (args.rate_mbit * 1e6)
    compute_s = rows["compute"]["median_step_s"]
    if emulated:
        # The profile's compute; the compute-only run says what the emulator adds.
        compute_s = compute["modelled_compute_s"]
        rows["compute"]["modelled_compute_s"] = compute_s
        rows["compute"]["emulator_overhead"] = rows["compute"]["median_step_s"] / compute_s - 1
    ideal = dict(base, mode="ideal", compute_s=compute_s, comm_bytes_per_node=int(comm_bytes), comm_s=comm_s)
    ideal["median_step_s"] = max(compute_s, comm_s)
    priority = rows.get("priority")
    if priority:
        for mode in ("fifo", "ddp"):
            if mode in rows:
                ideal["speedup_%s_over_priority" % mode] = rows[mode]["median_step_s"] / priority["median_step_s"]
        ideal["priority_over_ideal"] = priority["median_step_s"] / ideal["median_step_s"]
        # The nodes of this benchmark share one machine's cores: with them
        # all computing at once, compute is the concurrent run's step.
        if "concurrent" in rows:
            shared = max(rows["concurrent"]["median_step_s"], comm_s)
            ideal["shared_bound_s"] = shared
            ideal["priority_over_shared_bound"] = priority["median_step_s"] / shared
    rows["ideal"] = ideal
    # CPU per node and step, and per MiB of gradients (see the docstring).
    mib = compute["grad_bytes"] / (1 << 20)
    compute_cpu = rows["compute"]["trainer_cpu_per_step_s"]
    for mode in MODES:
        r = rows.get(mode)
        if not r:
            continue
        r["compute_cpu_per_step_s"] = compute_cpu
        r["trainer_extra_cpu_per_step_s"] = r["trainer_cpu_per_step_s"] - compute_cpu
        r["trainer_extra_cpu_ms_per_mib"] = 1000 * r["trainer_extra_cpu_per_step_s"] / mib
        r["agent_cpu_ms_per_mib"] = 1000 * r["agents_cpu_per_node_per_step_s"] / mib
        if mode != "ddp" and "ddp" in rows:
            r["speedup_over_ddp"] = rows["ddp"]["median_step_s"] / r["median_step_s"]
        r["trainer_cores"] = r["trainer_cpu_per_step_s"] / r["median_step_s"]
        r["agent_cores"] = r["agents_cpu_per_node_per_step_s"] / r["median_step_s"]
        if args.max_cores is not None:
            busy = [(who, r[who + "_cores"]) for who in ("trainer", "agent") if r[who + "_cores"] > args.max_cores]
            if busy:
                r["refused"] = "%s used %s cores (more than %g): the CPU may have set the pace" % (
                    " and ".join(w for w, _ in busy), " and ".join("%.2f" % c for _, c in busy), args.max_cores)
    refused = [m for m in MODES if m in rows and "refused" in rows[m]]
    if refused:
        ideal["refused"] = "modes %s refused" % ", ".join(refused)
    with open(args.jsonl, "a") as f:
        for r in rows.values():
            f.write(json.dumps(r) + "\n")

    mb = 1 << 20
    print(
        "%s, %d parameters (%.1f MiB of gradients), batch %d per trainer; %d nodes, links shaped "
        "to %g Mbit/s; %d steps per mode and round (%d rounds), the first %d not timed.\n"
        % (
            base["model"], base["params"], base["grad_bytes"] / mb, base["batch"], n,
            args.rate_mbit, args.steps, args.rounds, args.warmup,
        )
    )
    if emulated:
        print(
            "Emulated GPU, dilation k = %g: every modelled time x %g and links shaped to %g Mbit/s, "
            "standing for the profile's accelerator on %g Mbit/s links; modelled compute %.3f s a step "
            "(%.4f s undilated). Modes whose trainer or agent used more than %g cores are refused.\n"
            % (base["dilation"], base["dilation"], args.rate_mbit, base["emulated_rate_mbit"], compute_s,
               compute_s / base["dilation"], args.max_cores if args.max_cores is not None else float("inf"))
        )
    print(
        "| | median step (s) | min (s) | max (s) | speedup over DDP | priority speedup over it "
        "| CPU s/step per node: trainer, agent | CPU ms/MiB: trainer extra, agent "
        "| cores per node: trainer, agent | dilation |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in MODES + ["compute", "concurrent", "ideal"]:
        r = rows.get(key)
        if not r:
            continue
        speed = ""
        if priority and key in ("ddp", "fifo"):
            speed = "**%.2fx**" % (r["median_step_s"] / priority["median_step_s"])
        elif priority and key == "ideal":
            speed = "priority is %+.0f%% over it" % (100 * (ideal["priority_over_ideal"] - 1))
            if "priority_over_shared_bound" in ideal:
                speed += " (%+.0f%% over max(%d processes' compute, communication) = %.3f s)" % (
                    100 * (ideal["priority_over_shared_bound"] - 1), n, ideal["shared_bound_s"])
        extremes = ("%.3f" % r["min_step_s"], "%.3f" % r["max_step_s"]) if "min_step_s" in r else ("", "")
        name = NAMES[key].replace("NODES", str(n))
        cpu = ""
        if "trainer_cpu_per_step_s" in r:
            cpu = "%.3f" % r["trainer_cpu_per_step_s"]
            if "agents_cpu_per_node_per_step_s" in r:
                cpu += ", %.3f" % r["agents_cpu_per_node_per_step_s"]
        per_mib = ""
        if "agent_cpu_ms_per_mib" in r:
            per_mib = "%.2f, %.2f" % (r["trainer_extra_cpu_ms_per_mib"], r["agent_cpu_ms_per_mib"])
        over_ddp = "%.2fx" % r["speedup_over_ddp"] if "speedup_over_ddp" in r else ""
        cores = "%.2f, %.2f" % (r["trainer_cores"], r["agent_cores"]) if "agent_cores" in r else ""
        if "refused" in r:
            name += " **(refused: %s)**" % r["refused"]
        elif key == "compute" and "emulator_overhead" in r:
            name += " (modelled %.3f s: emulator %+.1f%%)" % (r["modelled_compute_s"], 100 * r["emulator_overhead"])
        print(
            "| %s | %.3f | %s | %s | %s | %s | %s | %s | %s | %g |"
            % ((name, r["median_step_s"]) + extremes + (over_ddp, speed, cpu, per_mib, cores, r["dilation"]))
        )
    c = rows["compute"]
    print(
        "\ncompute = forward %.3f + backward %.3f + update %.3f s (medians); communication = "
        "2(n-1)/n x %.1f MiB = %.1f MiB per node per step at %g Mbit/s = %.3f s."
        % (c["forward_s"], c["backward_s"], c["update_s"], base["grad_bytes"] / mb, comm_bytes / mb, args.rate_mbit, comm_s)
    )
    print(
        "\nCPU, per node and step: trainer = the trainer process's CPU (every thread) per timed step, "
        "median over nodes and rounds; agent = every agent's CPU during the mode's job (start-up and "
        "warm-up included) / %d nodes / %d steps, median over rounds. CPU ms/MiB: trainer extra = "
        "(trainer - the compute-only run's %.3f s) x 1000 / %.2f MiB of gradients, what communication "
        "adds inside the trainer (gloo for DDP, the baton client for fifo and priority); agent = agent "
        "x 1000 / %.2f MiB. Speedup over DDP = DDP's median step / the mode's."
        % (n, args.steps, compute_cpu, mib, mib)
    )
    if "ddp" in rows:
        for mode in ("priority", "fifo"):
            if mode in rows:
                goal, agent = rows["ddp"]["trainer_extra_cpu_ms_per_mib"], rows[mode]["agent_cpu_ms_per_mib"]
                print(
                    "Goal, agent CPU per MiB at most DDP's extra trainer CPU per MiB: %s agent %.2f vs "
                    "DDP %.2f ms/MiB, %s." % (mode, agent, goal, "met" if agent <= goal else "not met")
                )
                break

    def size(name):
        b = baton[name]
        return "%g MiB" % (b / mb) if b % (1 << 16) == 0 else "%d bytes" % b

    if any(m in rows for m in ("fifo", "priority")):
        parts = []
        for name, label in (("partition_bytes", "partition"), ("credit_bytes", "agent credit")):
            if not baton[name + "_default"]:
                parts.append("%s %s" % (label, size(name)))
            elif name in baton:
                parts.append("%s %s (baton's default)" % (label, size(name)))
            else:
                parts.append("%s: baton's default" % label)
        if all(baton[k + "_default"] for k in ("partition_bytes", "credit_bytes")):
            known = ["%s %s" % (label, size(name)) for name, label in
                     (("partition_bytes", "partition"), ("credit_bytes", "agent credit")) if name in baton]
            text = "baton defaults" + (" (tuned online, starting at %s)" % ", ".join(known)
                                       if known else "")
        else:
            text = ", ".join(parts)
        if "agent_flags" in baton:
            text += "; agent flags: %s" % baton["agent_flags"]
        print("\nbaton jobs: %s." % text)
        tuned = tuning(args.logs)
        if tuned:
            print("\nTuning (the agents' logs, node 0): %s." % "; ".join(tuned))
    missing = [m for m in MODES if m not in rows]
    if missing:
        print("\nmissing (failed or not run): %s" % ", ".join(missing))
    if refused:
        print("\nREFUSED: %s." % "; ".join("%s: %s" % (m, rows[m]["refused"]) for m in refused))
        sys.exit(3)


if __name__ == "__main__":
    main()

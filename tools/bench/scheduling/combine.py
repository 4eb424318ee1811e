#!/usr/bin/python3
"""Combines the runs of tools/bench/scheduling/models into one markdown table
(stdout) and OUT/models.jsonl.

Each run MODEL RATE is read from OUT/MODEL.RATE/: scheduling.jsonl (written
by tools/bench/scheduling/run and its summarize.py), run.rc (its exit
status, written by the driver) and run.log (its stderr). A run that failed,
was skipped, was interrupted or never started still gets its row, with
what is known and why the rest is missing.

Columns (from summarize.py's rows; "-" where the mode is missing):
  DDP, fifo, priority   the mode's median step (s): the median over rounds of
                        the slowest node's median timed step
  priority speedup      DDP's median step / priority's, fifo's / priority's
  priority vs bound     priority's median step / the ideal bound - 1, the
                        bound max(compute, 2(n-1)/n x gradient bytes / rate)
  rate                  as given (auto: with the rate it settled on); for
                        an emulated GPU (MODEL=emu-...), with the dilation k
                        and the rate the link stands for (rate x k)
  CPU ms/MiB            per node and step, per MiB of gradients: trainer
                        extra = (the mode's trainer CPU - the compute-only
                        trainer CPU) x 1000 / MiB; agent = (all agents' CPU
                        during the mode's job / NODES / STEPS) x 1000 / MiB
"""

import argparse
import json
import os

MIB = 1 << 20


def read_rows(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass  # a torn line: what is left still counts
    except OSError:
        pass
    return rows


def last_line(path, prefix="scheduling: "):
    """The last line of a run's stderr that the run itself wrote (its reason
    for failing, when it failed), without the prefix."""
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip("\n") for l in f if l.startswith(prefix)]
    except OSError:
        return ""
    return lines[-1][len(prefix):] if lines else ""


def one(out, model, rate, modes):
    d = os.path.join(out, "%s.%s" % (model, rate))
    entry = {"model": model, "rate": rate, "dir": d}
    rc = None
    try:
        with open(os.path.join(d, "run.rc")) as f:
            rc = int(f.read().strip())
    except (OSError, ValueError):
        pass
    entry["exit_code"] = rc
    rows = read_rows(os.path.join(d, "scheduling.jsonl"))
    skipped = [r for r in rows if "skipped" in r]
    by_mode = {r.get("mode"): r for r in rows if "mode" in r}
    if skipped:
        entry["status"] = "skipped: %s" % skipped[0]["skipped"]
        return entry
    if rc is None:  # the driver did not see it end
        entry["status"] = "interrupted"
    missing = [m for m in modes if m not in by_mode]
    if rc is not None:
        if rc == 0 and not missing and by_mode:
            entry["status"] = "ok"
        elif rc in (130, 143):
            entry["status"] = "interrupted"
        else:
            why = last_line(os.path.join(d, "run.log"))
            entry["status"] = "failed (exit %d)%s" % (rc, ": " + why if why else "")
            if len(entry["status"]) > 160:
                entry["status"] = entry["status"][:157] + "..."
    if missing and by_mode:
        entry["status"] += "; missing %s" % ", ".join(missing)

    first = next(iter(by_mode.values()), None)
    if first:
        for key in ("model", "grad_bytes", "params", "batch", "nodes", "rate_mbit", "steps", "warmup", "dilation"):
            if key in first:
                entry["description" if key == "model" else key] = first[key]
    for mode in ("ddp", "fifo", "priority", "compute", "ideal"):
        r = by_mode.get(mode)
        if r and "median_step_s" in r:
            entry["%s_step_s" % mode] = r["median_step_s"]
        if r and "rounds" in r and mode != "ideal":
            entry.setdefault("rounds", r["rounds"])
    for mode in ("ddp", "fifo", "priority"):
        r = by_mode.get(mode) or {}
        for key in ("trainer_extra_cpu_ms_per_mib", "agent_cpu_ms_per_mib", "trainer_cpu_per_step_s",
                    "agents_cpu_per_node_per_step_s", "trainer_extra_cpu_per_step_s"):
            if key in r:
                entry["%s_%s" % (mode, key)] = r[key]
    p = entry.get("priority_step_s")
    if p:
        for mode in ("ddp", "fifo"):
            if entry.get("%s_step_s" % mode):
                entry["priority_speedup_over_%s" % mode] = entry["%s_step_s" % mode] / p
        if entry.get("ideal_step_s"):
            entry["priority_over_ideal"] = p / entry["ideal_step_s"]
        shared = (by_mode.get("ideal") or {}).get("priority_over_shared_bound")
        if shared:
            entry["priority_over_shared_bound"] = shared
    return entry


def fmt(value, spec):
    return "-" if value is None else spec % value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the driver's OUT")
    parser.add_argument("--modes", default="ddp fifo priority", help="the modes each run was to run")
    parser.add_argument("--jsonl", help="where to write (default OUT/models.jsonl)")
    parser.add_argument("--not-run", action="append", default=[], metavar="MODEL.RATE",
                        help="a run not started this time (interrupted before it): shown as such")
    parser.add_argument("runs", nargs="*", metavar="MODEL.RATE", help="the runs, in order")
    args = parser.parse_args()
    modes = args.modes.split()
    entries = []
    for run in args.runs:
        model, _, rate = run.partition(".")
        if run in args.not_run:
            entries.append({"model": model, "rate": rate, "dir": os.path.join(args.out, run),
                            "exit_code": None, "status": "not run (interrupted before it)"})
        else:
            entries.append(one(args.out, model, rate, modes))
    with open(args.jsonl or os.path.join(args.out, "models.jsonl"), "w") as f:
        for e in entries:
            f.write(json.dumps(dict(e, bench="scheduling_models")) + "\n")

    settings = sorted({(e.get("nodes"), e.get("steps"), e.get("warmup"), e.get("rounds"))
                       for e in entries if e.get("nodes")}, key=str)
    if settings:
        print("Scheduling benchmark per model and link rate (tools/bench/scheduling/models); %s.\n"
              % "; ".join("%s nodes, %s steps per mode and round (the first %s not timed), %s rounds" % s
                          for s in settings))
    print("| model | gradients (MiB) | rate | DDP (s/step) | fifo (s/step) | priority (s/step) "
          "| priority speedup over DDP | over fifo | priority vs ideal bound "
          "| DDP CPU ms/MiB: trainer extra, agent | priority CPU ms/MiB: trainer extra, agent | status |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for e in entries:
        rate = e["rate"]
        if e.get("rate_mbit") is not None and rate == "auto":
            rate = "auto (%g Mbit/s)" % e["rate_mbit"]
        if e.get("dilation", 1) != 1:  # an emulated GPU: the link stands for one k times faster
            rate += ", dilation %g (%g Mbit/s emulated)" % (e["dilation"], e["rate_mbit"] * e["dilation"])
        cpu = {}
        for mode in ("ddp", "priority"):
            t, a = e.get("%s_trainer_extra_cpu_ms_per_mib" % mode), e.get("%s_agent_cpu_ms_per_mib" % mode)
            cpu[mode] = "-" if t is None else "%.2f, %.2f" % (t, a)
        bound = e.get("priority_over_ideal")
        shared = e.get("priority_over_shared_bound")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            e["model"],
            fmt(e["grad_bytes"] / MIB if e.get("grad_bytes") else None, "%.1f"),
            rate,
            fmt(e.get("ddp_step_s"), "%.3f"),
            fmt(e.get("fifo_step_s"), "%.3f"),
            fmt(e.get("priority_step_s"), "%.3f"),
            fmt(e.get("priority_speedup_over_ddp"), "%.2fx"),
            fmt(e.get("priority_speedup_over_fifo"), "%.2fx"),
            fmt(100 * (bound - 1) if bound else None, "%+.0f%%")
            + ("" if not shared else " (%+.0f%%)" % (100 * (shared - 1))),
            cpu["ddp"], cpu["priority"],
            e["status"].replace("|", "/"),
        ))
    print(
        "\nSteps: the median over rounds of the slowest node's median timed step. Speedups: DDP's "
        "(fifo's) median step / priority's. Bound: priority's step / max(compute-only step (an emulated "
        "GPU's: the profile's compute x dilation), 2(n-1)/n x gradient bytes / rate) - 1; in parentheses against max(the compute step of all "
        "nodes' processes at once, which share this machine's cores, communication). CPU ms/MiB, per node and step per MiB of gradients: "
        "trainer extra = (the mode's trainer-process CPU per timed step - the compute-only run's) x "
        "1000 / MiB, what communication adds inside the trainer (gloo for DDP, the baton client for "
        "priority); agent = all agents' CPU during the mode's job (start-up and warm-up included) / "
        "nodes / steps x 1000 / MiB (about 0 for DDP). Each run's own table and logs: "
        "OUT/MODEL.RATE/scheduling/."
    )


if __name__ == "__main__":
    main()

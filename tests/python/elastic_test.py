#!/usr/bin/python3
"""Elastic training end to end (issue 18), one trainer per node
(elastic_trainer.py), twice: a 4-node job under `batonrun --min-nodes 3
--restarts 1` whose node n3 (agent and trainer) is killed, and a 3-node job
with min_nodes 2 whose n3 trainer alone is killed and started again.

The killing happens at step KILL (SIGKILL). The survivors re-form and go on
without restarting their processes; n3 comes back and joins the running
job as a new node (the survivors wait for it at step WAIT, so the test does
not depend on how fast it starts) and receives their state before its
first step. The job ends with rc 0, every rank holds the same parameters,
and they equal, bit for bit, those of an undisturbed run started from the
state the elastic run last synchronized.

Usage: elastic_test.py BATONRUN (ctest passes it; PYTHONPATH as for the
other Python tests)."""

import glob
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, KILL, WAIT = 40, 10, 20


def batonrun(batonrun_bin, out, job, nodes, extra_flags, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env.update({
        "ELASTIC_OUT": out,
        "ELASTIC_STEPS": str(STEPS),
        # One partitioning of the one gradient, whatever the timing.
        "BATON_PARTITION_BYTES": str(1 << 20),
    })
    argv = [batonrun_bin, "--nodes", str(nodes), "--procs-per-node", "1", "--job", job,
            "--agent_flags=--partition_tuning=false"] + extra_flags + [
            "--", sys.executable, os.path.join(HERE, "elastic_trainer.py")]
    print("running:", " ".join(argv), flush=True)
    return subprocess.run(argv, env=env, timeout=240).returncode


def finals(out, kind):
    return [torch.load(p) for p in sorted(glob.glob(os.path.join(out, "final.%s.*.pt" % kind)))]


def scenario(batonrun_bin, name, nodes, flags, env):
    """Kills node n3's trainer (and agent, unless env says otherwise) at
    step KILL of a `nodes`-node job; returns what went wrong."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="elastic-test-") as out:
        env = dict(env, ELASTIC_KILL="3:%d" % KILL, ELASTIC_WAIT="%d:%d" % (nodes, WAIT))
        rc = batonrun(batonrun_bin, out, "elastic-" + name, nodes, flags, env)
        if rc != 0:
            return ["the elastic run exited with %d" % rc]
        if not os.path.exists(os.path.join(out, "killed")):
            failures.append("node n3 was never killed")
        # Every survivor kept its process: one life per node, two for n3.
        lives = {}
        for path in glob.glob(os.path.join(out, "pid.*")):
            with open(path) as f:
                lives.setdefault(f.read(), []).append(path)
        want = {str(n): 2 if n == 3 else 1 for n in range(1, nodes + 1)}
        if {k: len(v) for k, v in lives.items()} != want:
            failures.append("trainer lives per node: %s, want %s" % ({k: len(v) for k, v in lives.items()}, want))
        elastic = finals(out, "elastic")
        if len(elastic) != nodes:
            return failures + ["%d ranks finished, want %d" % (len(elastic), nodes)]
        for f in elastic[1:]:
            if not torch.equal(f["model"]["0.weight"], elastic[0]["model"]["0.weight"]):
                failures.append("rank %d (node %s) ends with other parameters than rank %d"
                                % (f["rank"], f["node"], elastic[0]["rank"]))
        survivor = [f for f in elastic if f["node"] == "1"][0]
        # Synchronized at the start, after the loss, after the join.
        if survivor["sizes"] != [nodes, nodes - 1, nodes]:
            failures.append("node n1 synchronized with sizes %s, want %s"
                            % (survivor["sizes"], [nodes, nodes - 1, nodes]))
        syncs = sorted(glob.glob(os.path.join(out, "sync.*.pt")))
        last = torch.load(syncs[-1])
        if last["size"] != nodes or last["step"] != WAIT:
            failures.append("the last sync was at step %d with %d ranks, want step %d with %d"
                            % (last["step"], last["size"], WAIT, nodes))

        # An undisturbed run from the state the elastic run last synchronized.
        rc = batonrun(batonrun_bin, out, "elastic-%s-reference" % name, nodes, [], {"ELASTIC_RESUME": syncs[-1]})
        if rc != 0:
            return failures + ["the undisturbed run exited with %d" % rc]
        resumed = finals(out, "resumed")
        if len(resumed) != nodes:
            failures.append("the undisturbed run left %d results" % len(resumed))
        elif not torch.equal(resumed[0]["model"]["0.weight"], elastic[0]["model"]["0.weight"]):
            diff = (resumed[0]["model"]["0.weight"] - elastic[0]["model"]["0.weight"]).abs().max()
            failures.append("the elastic run's parameters differ from the undisturbed run's "
                            "(max abs difference %g)" % float(diff))
    return failures


def main():
    batonrun_bin = sys.argv[1]
    failures = []
    # The whole node: its agent and its trainer killed, batonrun starts both
    # again, and the node joins as a new one.
    for f in scenario(batonrun_bin, "node", 4, ["--min-nodes", "3", "--restarts", "1"], {}):
        failures.append("node killed: " + f)
    # Only the trainer, as when a trainer pod dies on Kubernetes: its agent
    # leaves the elastic job at once and the restarted trainer (a wrapper
    # process starts it again) joins as a new node.
    for f in scenario(batonrun_bin, "trainer", 3, [],
                      {"BATON_MIN_NODES": "2", "ELASTIC_WRAP": "3", "ELASTIC_KILL_AGENT": "0"}):
        failures.append("trainer killed: " + f)
    for failure in failures:
        print("FAILED:", failure, flush=True)
    if not failures:
        print("ok: node n3 killed at step %d (whole node, then trainer only); the survivors "
              "went on, n3 rejoined at step %d, and the parameters equal an undisturbed "
              "run's" % (KILL, WAIT), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

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

Then a 4-node job whose n4 (agent and trainer) is frozen (SIGSTOP) at step
KILL for FREEZE_S seconds, longer than the coordinator's liveness bound, and
continued: the survivors re-form without it, it comes back when it wakes,
and the same checks hold.

Then a 4-node job whose coordinator is frozen for FREEZE_S seconds: no
re-form at all.

Usage: elastic_test.py [SCENARIO...] (node, trainer, frozen, coordinator; all by
default), with BATONRUN naming the batonrun binary and PYTHONPATH as for the
other Python tests (ctest sets both)."""

import glob
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, KILL, WAIT = 40, 10, 20
# Longer than the coordinator's liveness bound (6 s).
FREEZE_S = 15
# A run takes 10-40 s here: far beyond that it hangs.
RUN_TIMEOUT = 120


def batonrun(batonrun_bin, out, job, nodes, extra_flags, env_extra):
    env = dict(os.environ)
    env.update({
        "ELASTIC_OUT": out,
        "ELASTIC_STEPS": str(STEPS),
        # One partitioning of the one gradient, whatever the timing.
        "BATON_PARTITION_BYTES": str(1 << 20),
    })
    env.update(env_extra)
    argv = [batonrun_bin, "--nodes", str(nodes), "--procs-per-node", "1", "--job", job,
            "--agent_flags=--partition_tuning=false"] + extra_flags + [
            "--", sys.executable, os.path.join(HERE, "elastic_trainer.py")]
    print("running:", " ".join(argv), flush=True)
    try:
        return subprocess.run(argv, env=env, timeout=RUN_TIMEOUT).returncode
    except subprocess.TimeoutExpired:
        # batonrun is killed; its children die with it (PR_SET_PDEATHSIG).
        return "a hang: batonrun still ran after %d s" % RUN_TIMEOUT


def finals(out, kind):
    return [torch.load(p) for p in sorted(glob.glob(os.path.join(out, "final.%s.*.pt" % kind)))]


def scenario(batonrun_bin, name, nodes, flags, env, fault="killed"):
    """Kills node n3's trainer (and agent, unless env says otherwise) at
    step KILL of a `nodes`-node job, or does what env's ELASTIC_FREEZE
    says (fault="frozen": a node; "coordinator": the coordinator); returns
    what went wrong."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="elastic-test-") as out:
        wait = int(env.get("ELASTIC_WAIT_STEP", WAIT))
        env = dict(env, ELASTIC_WAIT="%d:%d" % (nodes, wait))
        if fault == "killed":
            env["ELASTIC_KILL"] = "3:%d" % KILL
        rc = batonrun(batonrun_bin, out, "elastic-" + name, nodes, flags, env)
        if rc != 0:
            return ["the elastic run ended with %s" % (rc if isinstance(rc, str) else "exit code %d" % rc)]
        if not os.path.exists(os.path.join(out, "killed" if fault == "killed" else "frozen")):
            failures.append("nothing was %s" % fault)
        # Every survivor kept its process: one life per node, two for a
        # killed n3 (a frozen node's process lives on).
        lives = {}
        for path in glob.glob(os.path.join(out, "pid.*")):
            with open(path) as f:
                lives.setdefault(f.read(), []).append(path)
        want = {str(n): 2 if n == 3 and fault == "killed" else 1 for n in range(1, nodes + 1)}
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
        # A frozen coordinator is not on the per-step path: no re-form.
        sizes = [nodes] if fault == "coordinator" else [nodes, nodes - 1, nodes]
        if survivor["sizes"] != sizes:
            failures.append("node n1 synchronized with sizes %s, want %s" % (survivor["sizes"], sizes))
        syncs = sorted(glob.glob(os.path.join(out, "sync.*.pt")))
        last = torch.load(syncs[-1])
        # A frozen node joins at whichever commit follows its waking.
        if last["size"] != nodes or (fault == "killed" and last["step"] != wait):
            failures.append("the last sync was at step %d with %d ranks, want step %d with %d"
                            % (last["step"], last["size"], wait, nodes))

        # An undisturbed run from the state the elastic run last synchronized.
        rc = batonrun(batonrun_bin, out, "elastic-%s-reference" % name, nodes, [], {"ELASTIC_RESUME": syncs[-1], "ELASTIC_STEPS": str(env.get("ELASTIC_STEPS", STEPS))})
        if rc != 0:
            return failures + ["the undisturbed run ended with %s" % (rc if isinstance(rc, str) else "exit code %d" % rc)]
        resumed = finals(out, "resumed")
        if len(resumed) != nodes:
            failures.append("the undisturbed run left %d results" % len(resumed))
        elif not torch.equal(resumed[0]["model"]["0.weight"], elastic[0]["model"]["0.weight"]):
            diff = (resumed[0]["model"]["0.weight"] - elastic[0]["model"]["0.weight"]).abs().max()
            failures.append("the elastic run's parameters differ from the undisturbed run's "
                            "(max abs difference %g)" % float(diff))
    return failures


def main():
    batonrun_bin = os.environ["BATONRUN"]
    chosen = set(sys.argv[1:]) or {"node", "trainer", "frozen", "coordinator"}
    failures = []
    scenarios = [
        # The whole node: its agent and its trainer killed, batonrun starts
        # both again, and the node joins as a new one.
        ("node", "node killed", 4, ["--min-nodes", "3", "--restarts", "1"], {}, "killed"),
        # Only the trainer, as when a trainer pod dies on Kubernetes: its
        # agent leaves the elastic job at once and the restarted trainer (a
        # wrapper process starts it again) joins as a new node.
        ("trainer", "trainer killed", 3, [],
         {"BATON_MIN_NODES": "2", "ELASTIC_WRAP": "3", "ELASTIC_KILL_AGENT": "0"}, "killed"),
        # The whole node frozen (SIGSTOP, mid-step) for longer than the
        # coordinator's liveness bound, then continued, with a commit every
        # step: the survivors re-form without it and train on (steps of
        # 0.3 s), and when it wakes it joins at their next commit (they
        # wait for it at step 70 at the latest). Before the fix its agent
        # kept the step it froze in waiting, ran it in the new generation
        # where no other node did, and the job hung.
        ("frozen", "node frozen", 4, ["--min-nodes", "3", "--restarts", "1"],
         {"ELASTIC_FREEZE": "4:%d:%d" % (KILL, FREEZE_S), "ELASTIC_COMMIT_EVERY": "1",
          "ELASTIC_STEP_SECONDS": "0.3", "ELASTIC_STEPS": "80", "ELASTIC_WAIT_STEP": "70"}, "frozen"),
        # The coordinator frozen for 15 s mid-run: the agents' keepalive
        # gives up on it and they reconnect when it wakes. Training goes on
        # meanwhile and nothing re-forms. Before the fix every session that
        # ended counted as a lost node: three re-forms, then the job failed
        # ("every node was lost") under a running training.
        ("coordinator", "coordinator frozen", 4, ["--min-nodes", "3", "--restarts", "1"],
         {"ELASTIC_FREEZE": "1:%d:%d" % (KILL, FREEZE_S), "ELASTIC_FREEZE_WHAT": "coordinator",
          "ELASTIC_STEP_SECONDS": "0.3", "ELASTIC_STEPS": "80"}, "coordinator"),
    ]
    for name, what, nodes, flags, env, fault in scenarios:
        if name in chosen:
            failures += ["%s: %s" % (what, f) for f in scenario(batonrun_bin, name, nodes, flags, env, fault)]
    for failure in failures:
        print("FAILED:", failure, flush=True)
    if not failures:
        print("ok (%s): the survivors went on through the fault, and the parameters equal "
              "an undisturbed run's from the last sync" % ", ".join(sorted(chosen)), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The trainer of elastic_launch_test.py's jobs: it attaches (bt.init()) and,
depending on ELASTIC_SCENARIO, dies on some nodes or waits for a restarted
node. It uses only what baton.torch has today (init, rank, size, shutdown),
no collectives: the survivors see the coordinator re-form the job but have
nothing in flight.

A first-life trainer knows its node from RANK (batonrun's embedded cluster
sets it exactly: node k holds ranks (k-1)*P .. k*P-1). A restarted one gets
no RANK and tells its restart by the marker file its first life left in
ELASTIC_DIR. Every wait is bounded; a trainer that gives up exits 3, which
fails the test with batonrun's exit code."""

import json
import os
import signal
import subprocess
import sys
import time

import baton.torch as bt

DIR = os.environ["ELASTIC_DIR"]
SCENARIO = os.environ["ELASTIC_SCENARIO"]
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
PROCS = int(os.environ["LOCAL_WORLD_SIZE"])
# Never reached when things work; batonrun stops a waiting trainer first
# when the job fails.
WAIT = 180.0


def path(name):
    return os.path.join(DIR, name)


def touch(name, text=""):
    """Writes ELASTIC_DIR/name whole (the readers poll for it)."""
    temporary = "%s.%d.tmp" % (path(name), os.getpid())
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path(name))


def wait_for(what, ready):
    deadline = time.monotonic() + WAIT
    while not ready():
        if time.monotonic() > deadline:
            print("gave up waiting for %s after %.0f s" % (what, WAIT), flush=True)
            sys.exit(3)
        time.sleep(0.05)


def die(node):
    touch("n%d.died" % node)
    print("node n%d dies now" % node, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def members():
    """The job's member node names, as the coordinator lists them."""
    out = subprocess.run(
        [os.environ["BATONCTL"], "--json", "status", os.environ["BATON_JOB"]],
        capture_output=True, text=True, timeout=30,
    )
    if out.returncode != 0:
        return None
    job = json.loads(out.stdout)
    return sorted(m.get("nodeName", m.get("node_name", "")) for m in job.get("members", []))


def first_life(node):
    if SCENARIO == "restart":
        # 3 nodes x 2: n2's local rank 0 dies once; everyone else goes on
        # when the restarted n2 is back (n2's local rank 1 is stopped by
        # batonrun meanwhile).
        if node == 2 and LOCAL_RANK == 0:
            die(node)
        wait_for("the restarted node n2", lambda: os.path.exists(path("back")))
    elif SCENARIO == "lost":
        # 3 nodes x 1, --min-nodes 2: n3 dies; n1 and n2 finish once the
        # coordinator re-formed the job without it.
        if node == 3:
            die(node)
        wait_for("the job without n3", lambda: members() == ["n1", "n2"])
    elif SCENARIO == "below_min":
        # 3 nodes x 1, --min-nodes 2: n2 and n3 die; batonrun stops n1.
        if node in (2, 3):
            die(node)
        wait_for("batonrun to stop this trainer", lambda: False)
    elif SCENARIO in ("exhausted", "interrupted"):
        # 2 nodes x 1, --restarts 1: n2 dies (in every life when
        # "exhausted"); batonrun stops n1, or the test stops batonrun.
        touch("pid.%d" % os.getpid())
        if node == 2:
            die(node)
        wait_for("batonrun to stop this trainer", lambda: False)
    else:
        raise ValueError("unknown ELASTIC_SCENARIO %r" % SCENARIO)


def restarted_life():
    assert os.path.exists(path("n2.died")), "restarted, but no node died"
    assert "WORLD_SIZE" not in os.environ, os.environ["WORLD_SIZE"]
    print("I am back as rank %d of %d" % (bt.rank(), bt.size()), flush=True)
    if SCENARIO == "restart":
        if LOCAL_RANK == 0:
            touch("back")
        return
    touch("pid.%d" % os.getpid())
    if SCENARIO == "exhausted":
        die(2)
    wait_for("batonrun to stop this trainer", lambda: False)


def main():
    # batonrun's directory of sockets and logs, for the test to remove: it
    # is kept after a loss or a restart, and named only when the job ends
    # well.
    touch("cluster", os.path.dirname(os.environ["BATON_AGENT_SOCKET"]))
    if SCENARIO == "early" and os.environ.get("RANK") == "1":
        # 2 x 1: n2 ends before it attached, so the job never formed.
        print("node n2 ends before it joined", flush=True)
        return 3
    bt.init(attach_timeout=WAIT)
    if "RANK" in os.environ:
        rank = int(os.environ["RANK"])
        assert bt.rank() == rank, (bt.rank(), rank)
        first_life(rank // PROCS + 1)
    else:
        restarted_life()
    bt.shutdown()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

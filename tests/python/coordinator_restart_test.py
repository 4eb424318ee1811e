"""batonrun's embedded coordinator killed with SIGKILL in the middle of a
PyTorch job: batonrun starts it again on the same address, the agents
recover the job from it, and training goes on to the end with exact results;
a tensor first used after the kill is planned by the new coordinator.

Runs on every rank of a 2 nodes x 2 trainers job (tests/python/CMakeLists.txt).
"""

import os
import signal
import time

import torch

import baton.torch as bt
from harness import run_tests

STEPS = 30
KILL_AFTER_STEP = 10
LATE_FROM_STEP = 20


def _coordinators_of(parent):
    """The pids of `parent`'s children whose program is baton-coordinator."""
    with open("/proc/%d/task/%d/children" % (parent, parent)) as f:
        children = [int(pid) for pid in f.read().split()]
    found = []
    for pid in children:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue  # gone meanwhile
        if os.path.basename(argv0) == b"baton-coordinator":
            found.append(pid)
    return found


def _dead(pid):
    """Gone, or a zombie not yet reaped ("PID (COMM) STATE ...")."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _kill_the_coordinator():
    """SIGKILLs the baton-coordinator that batonrun (this trainer's parent)
    started, and waits (10 s at most) until it is dead."""
    found = _coordinators_of(os.getppid())
    assert len(found) == 1, "expected one baton-coordinator child of batonrun, found %s" % found
    os.kill(found[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _dead(found[0]):
        assert time.monotonic() < deadline, "the coordinator is alive 10 s after SIGKILL"
        time.sleep(0.01)
    return found[0]


def test_training_goes_on_through_a_killed_coordinator():
    rank, size = bt.rank(), bt.size()
    x = torch.zeros(1000, dtype=torch.float64)
    late = torch.zeros(7, dtype=torch.int64)
    for step in range(STEPS):
        x.copy_(torch.arange(1000, dtype=torch.float64) * (rank + 1) + step)
        out = bt.push_pull(x, average=False, name="restart.x")
        want = torch.arange(1000, dtype=torch.float64) * (size * (size + 1) // 2) + size * step
        assert torch.equal(out, want), (step, out[:4], want[:4])
        if step >= LATE_FROM_STEP:
            # First used after the kill: only the new coordinator can plan it.
            late.fill_(rank + step)
            bt.push_pull_inplace(late, average=False, name="restart.late")
            assert torch.equal(late, torch.full((7,), sum(range(size)) + size * step)), (step, late)
        if step == KILL_AFTER_STEP and rank == 0:
            pid = _kill_the_coordinator()
            print("killed the coordinator (pid %d) after step %d" % (pid, step), flush=True)


if __name__ == "__main__":
    raise SystemExit(run_tests(globals()))

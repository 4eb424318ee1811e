"""A trainer that is killed (SIGKILL) and started again on its node attaches
in place of the lost one and the running job goes on (run by batonrun on 2
nodes x 2 trainers: tests/python/CMakeLists.txt).

Rank 1 (node n1, local rank 1) is a wrapper that runs the trainer as a
child with the same environment and starts it again when it is killed
(batonrun starts each trainer once). The child kills itself after step
KILL_AT. While it is gone every other rank's operation fails with a
BatonError (ABORTED, or UNAVAILABLE from a data plane the lost node closed)
instead of hanging; the ranks retry, and once the new trainer attached they
agree on the step to resume from (rank 0's, broadcast) and finish every
step with exact results."""

import os
import signal
import subprocess
import sys
import time

import torch

import baton
import baton.torch as bt

STEPS = 10
KILL_AT = 4
VICTIM = 1
LIFE = "BATON_TEST_RESTART_LIFE"
# Bounds, never reached when things work.
SYNC_TIMEOUT = 90.0
RETRY_FOR = 180.0


def wrapper():
    """Rank VICTIM under batonrun: runs the trainer, and again once it is
    killed; exits with the second life's code."""
    env = dict(os.environ)
    env[LIFE] = "1"
    first = subprocess.run([sys.executable, __file__], env=env, timeout=600)
    if first.returncode != -signal.SIGKILL:
        print("the first life ended with %d, not SIGKILL" % first.returncode, flush=True)
        return 1
    print("trainer killed; starting it again", flush=True)
    env[LIFE] = "2"
    return subprocess.run([sys.executable, __file__], env=env, timeout=600).returncode


def expected(step):
    return torch.arange(6, dtype=torch.float64) * 10 + 4 * step


def agree(step):
    """Rank 0's step, on every rank."""
    t = torch.tensor([step], dtype=torch.int64)
    bt.synchronize(bt.broadcast_async(t, root_rank=0, name="restart.resume"), timeout=SYNC_TIMEOUT)
    return int(t.item())


def train():
    torch.set_num_threads(1)
    life = int(os.environ.get(LIFE, "0"))
    bt.init(attach_timeout=120)
    rank = bt.rank()
    assert rank == int(os.environ["RANK"]) and bt.size() == 4, (rank, bt.size())
    # Every life declares the job's names in the same order.
    bt.declare("restart.x", torch.zeros(6, dtype=torch.float64))
    bt.declare("restart.resume", torch.zeros(1, dtype=torch.int64), op="broadcast")
    step = 0
    errors = []
    give_up = time.monotonic() + RETRY_FOR
    done = []
    while True:
        try:
            step = agree(step)
            while step < STEPS:
                x = torch.arange(6, dtype=torch.float64) * (rank + 1) + step
                bt.synchronize(bt.push_pull_async_inplace(x, average=False, name="restart.x"), timeout=SYNC_TIMEOUT)
                assert torch.equal(x, expected(step)), (step, x)
                done.append(step)
                if life == 1 and step == KILL_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
                step += 1
            break
        except baton.BatonError as e:
            assert e.code in ("ABORTED", "UNAVAILABLE"), "rank %d step %d: %s %s" % (rank, step, e.code, e)
            assert time.monotonic() < give_up, "rank %d still failing after %.0f s: %s" % (rank, RETRY_FOR, e)
            if not errors:
                print("rank %d step %d failed (%s), retrying: %s" % (rank, step, e.code, e), flush=True)
            errors.append(e)
            time.sleep(0.1)
    bt.shutdown()
    if life == 2:
        # It resumed where the others were, after the step it died in.
        assert done and done[0] == KILL_AT + 1, done
    else:
        assert done == list(range(STEPS)), (rank, done)
        # Every other rank saw the loss as an error, not a hang.
        assert errors, "rank %d saw no error while rank %d was gone" % (rank, VICTIM)
    print("rank %d life %d ok: steps %d..%d exact, %d failed attempts" % (rank, life, done[0], done[-1], len(errors)), flush=True)
    return 0


if __name__ == "__main__":
    if int(os.environ["RANK"]) == VICTIM and LIFE not in os.environ:
        sys.exit(wrapper())
    sys.exit(train())

"""Ctrl-C in a trainer blocked in synchronize() raises KeyboardInterrupt at
once, and the job name runs again on the same agents afterwards.

batonrun (tests/python/CMakeLists.txt) runs this on both ranks of a 2 nodes x
1 trainer job; each rank runs the job's trainers as child processes of its
own (same environment, so the same agent and job name), twice:

1. rank 0's trainer starts push-pull "held", which rank 1's trainer holds
   back (it never starts it), and SIGINTs itself once blocked in
   synchronize(); KeyboardInterrupt must come within the bound, and the
   trainer exits on it. Rank 1's trainer then sees the job fail (BatonError)
   instead of waiting for rank 0 forever.
2. both run a push-pull again under the same job name, and get the sum.
"""

import os
import signal
import subprocess
import sys
import threading
import time

# Generous: the interrupt itself takes at most about 0.1 s.
INTERRUPT_BOUND_S = 10.0
CHILD_TIMEOUT_S = 90


def interrupted_trainer():
    import torch

    import baton.torch as bt

    bt.init()
    handle = bt.push_pull_async(torch.ones(4), name="held")
    sent = []

    def interrupt():
        time.sleep(1.0)  # synchronize() below is blocked by then, or soon
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        bt.synchronize(handle)
    except KeyboardInterrupt:
        print("interrupted after %.2f s" % (time.monotonic() - sent[0]), flush=True)
        raise  # the interpreter exits on it; baton leaves the job at exit
    print("synchronize returned", flush=True)


def holding_trainer():
    import torch

    import baton
    import baton.torch as bt

    bt.init()
    try:
        bt.push_pull(torch.ones(1), name="after")  # rank 0 never gets here
    except baton.BatonError as e:
        print("the job failed: %s" % e, flush=True)
    try:
        bt.shutdown(0.0)
    except baton.BatonError:
        pass


def again_trainer():
    import torch

    import baton.torch as bt

    bt.init(attach_timeout=60)
    t = torch.full((3,), float(bt.rank() + 1))
    bt.push_pull_inplace(t, average=False, name="again")
    assert torch.equal(t, torch.full((3,), 3.0)), t
    bt.shutdown()
    print("ran again", flush=True)


def run_child(role):
    start = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), role],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            "trainer %s did not end within %d s:\n%s\n%s" % (role, CHILD_TIMEOUT_S, e.stdout, e.stderr)
        )
    print("[%s] exit %s after %.1f s\n%s%s" % (role, out.returncode, time.monotonic() - start, out.stdout, out.stderr), flush=True)
    return out


def main():
    if len(sys.argv) > 1:
        {"interrupted": interrupted_trainer, "holding": holding_trainer, "again": again_trainer}[sys.argv[1]]()
        return 0
    rank = int(os.environ.get("RANK", "-1"))
    if rank == 0:
        out = run_child("interrupted")
        assert "interrupted after" in out.stdout, "no KeyboardInterrupt"
        seconds = float(out.stdout.split("interrupted after ")[1].split(" s")[0])
        assert seconds < INTERRUPT_BOUND_S, "KeyboardInterrupt came %.1f s after SIGINT" % seconds
        assert "KeyboardInterrupt" in out.stderr and out.returncode != 0, out.returncode
    else:
        out = run_child("holding")
        assert "the job failed" in out.stdout, "rank 1 did not hear that rank 0 left"
    out = run_child("again")
    assert out.returncode == 0 and "ran again" in out.stdout, "the job name did not run again"
    return 0


if __name__ == "__main__":
    sys.exit(main())

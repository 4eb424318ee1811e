"""A rank that holds back one tensor of a step shows in `batonctl status` as
a stall naming that tensor, the step, the rank and its node, and as the
lagging rank; once it submits, the job goes on and the stall clears (issue
17). Run by batonrun with a short stall threshold
(tests/python/CMakeLists.txt), with 2 trainers per node (the holder's
node-mate submits what it holds back) and with 1 (its node submits nothing
of it)."""

import os
import subprocess
import sys
import time

import torch

import baton.torch as bt
from harness import run_tests

STALLED_STEP = 2
# Far above the stall threshold plus a report interval (a few seconds): only
# a coordinator that never shows the stall reaches it.
STATUS_BOUND_S = 90.0


def _holder():
    return bt.size() - 1


def _holder_node():
    # batonrun names nodes n1, n2, ... and numbers ranks node by node.
    return "n%d" % (_holder() // bt.local_size() + 1)


def _release_file():
    # batonrun's directory, shared by every node of this job and no other.
    return os.path.join(os.path.dirname(os.environ["BATON_AGENT_SOCKET"]), "stall_test.release")


def _checked_file():
    return os.path.join(os.path.dirname(os.environ["BATON_AGENT_SOCKET"]), "stall_test.checked")


def _status():
    """`batonctl status JOB` as a user runs it (BATON_COORDINATOR names the
    coordinator in the trainers' environment)."""
    done = subprocess.run(
        [os.environ["BATONCTL"], "status", os.environ["BATON_JOB"]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, "batonctl status failed: %s" % done.stderr
    return done.stdout


def _await_status(condition, what):
    deadline = time.monotonic() + STATUS_BOUND_S
    text = _status()
    while not condition(text):
        assert time.monotonic() < deadline, "batonctl status never showed %s; last:\n%s" % (what, text)
        time.sleep(0.25)
        text = _status()
    return text


def _section(text, title):
    """The lines of one section of the status text."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = start
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return lines[start:end]


def _run_step(a, b):
    bt.push_pull_inplace(a, average=False, name="stall.a")
    bt.push_pull_inplace(b, average=False, name="stall.b")


def test_a_rank_holding_back_a_tensor_is_the_stall_and_the_lagging_rank():
    a = torch.zeros(8)
    b = torch.zeros(8)
    for _ in range(STALLED_STEP):
        _run_step(a, b)

    # The stalled step: every rank submits stall.a; the holder waits before
    # stall.b, which every other rank has submitted.
    a.fill_(1.0)
    b.fill_(float(bt.rank() + 1))
    bt.push_pull_inplace(a, average=False, name="stall.a")
    if bt.rank() == _holder():
        deadline = time.monotonic() + 2 * STATUS_BOUND_S
        while not os.path.exists(_release_file()):
            assert time.monotonic() < deadline, "rank 0 never released the held tensor"
            time.sleep(0.1)
        bt.push_pull_inplace(b, average=False, name="stall.b")
    else:
        handle = bt.push_pull_async_inplace(b, average=False, name="stall.b")
        if bt.rank() == 0:
            stall = "  tensor stall.b, step %d: waiting for ranks {%d} on nodes {%s}" % (
                STALLED_STEP,
                _holder(),
                _holder_node(),
            )
            try:
                text = _await_status(
                    lambda t: any(line.startswith(stall) for line in _section(t, "Stalls")),
                    "the held tensor's stall",
                )
                assert len(_section(text, "Stalls")) == 1, text
                # The holder lags; the ranks waiting for it do not.
                assert "  lagging ranks: rank %d (step %d, lag 1)" % (
                    _holder(),
                    STALLED_STEP - 1,
                ) in text.splitlines(), text
            finally:
                # Released even when the check failed, so every rank ends.
                open(_release_file(), "w").close()
        bt.synchronize(handle, timeout=2 * STATUS_BOUND_S)
    world = bt.size()
    assert torch.equal(a, torch.full((8,), float(world))), a
    assert torch.equal(b, torch.full((8,), float(world * (world + 1) // 2))), b

    # The job goes on; once the next step completed everywhere, the stall
    # and the lag are gone.
    _run_step(a, b)
    # The others wait on a file, not a collective, so that nothing is pending
    # while rank 0 reads the status, and stay attached until it has.
    if bt.rank() == 0:
        try:
            _await_status(
                lambda t: "  global step: %d" % (STALLED_STEP + 1) in t.splitlines()
                and _section(t, "Stalls") == ["  (none)"]
                and "  lagging ranks: (none)" in t.splitlines(),
                "the stall cleared",
            )
        finally:
            open(_checked_file(), "w").close()
    else:
        deadline = time.monotonic() + 2 * STATUS_BOUND_S
        while not os.path.exists(_checked_file()):
            assert time.monotonic() < deadline, "rank 0 never finished checking the status"
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

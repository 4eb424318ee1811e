"""Which exception means what (docs/api.md, Errors), on every rank of a job
started by batonrun (tests/python/CMakeLists.txt): a misuse raises
ValueError on the rank that made it, at once, and the other ranks go on. That
a failure of the job raises BatonError, even with a code a refused call could
have, is collectives_test's test_nodes_disagreeing_fail_the_operation_on_every_rank_naming_both."""

import os
import subprocess
import sys

import torch

import baton
import baton.torch as bt
from harness import run_tests


def barrier(name):
    bt.push_pull(torch.zeros(1), name=name)


def test_a_second_operation_on_a_name_in_flight_is_a_value_error_and_the_others_go_on():
    """Rank 0 starts "dup" twice before a barrier, the others after it: the
    refusal is rank 0's alone, nothing of it reaches a peer, and every rank
    then finishes "dup" with the right sum."""
    t = torch.full((3,), float(bt.rank() + 1))
    # The ranks use the names in different orders below: declare them first.
    bt.declare("dup", t)
    bt.declare("dup.barrier", torch.zeros(1))

    def start_twice():
        handle = bt.push_pull_async(t, average=False, name="dup")
        try:
            bt.push_pull_async(torch.ones(3), average=False, name="dup")
        except ValueError as e:
            assert 'tensor "dup" already has an operation in flight' in str(e), str(e)
            assert e.code == "FAILED_PRECONDITION", e.code
        else:
            raise AssertionError("a second operation on a name in flight was started")
        return handle

    if bt.rank() == 0:
        handle = start_twice()
        barrier("dup.barrier")
    else:
        barrier("dup.barrier")
        handle = start_twice()
    want = float(sum(range(1, bt.size() + 1)))
    assert torch.equal(bt.synchronize(handle), torch.full((3,), want)), t


def test_misuses_are_value_errors():
    t = torch.ones(2)
    handle = bt.push_pull_async(t, name="misuse")
    try:
        # Declared anew with another shape while in flight.
        bt.declare("misuse", torch.ones(5))
    except ValueError as e:
        assert 'tensor "misuse" is declared anew' in str(e), str(e)
        assert not isinstance(e, baton.BatonError)
    else:
        raise AssertionError("a name in flight was declared anew")
    bt.synchronize(handle)
    for call, text in [
        (lambda: bt.broadcast(torch.zeros(1), root_rank=bt.size(), name="misuse.root"), "is outside"),
        (lambda: bt.synchronize(handle), "unknown baton handle"),
        (lambda: bt.declare_many([("misuse.op", t)], op="allgather"), "op must be"),
    ]:
        try:
            call()
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError("a misuse was accepted (%s)" % text)
    # Before init(): in a process of its own.
    probe = (
        "import baton.torch as bt\n"
        "try:\n"
        "    bt.size()\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert "ValueError: baton is not initialized" in out.stdout, (out.stdout, out.stderr)



def test_a_launcher_rank_the_job_does_not_assign_fails_init():
    """A trainer whose launcher (torchrun) set RANK and WORLD_SIZE other than
    what its job assigns fails init() naming the variable (a ValueError: the
    launch is wrong), as the C++ Session::Init() does; the job of this
    test's ranks goes on. Rank 0 only:
    a one-node job of its own on this agent."""
    if bt.rank() == 0:
        probe = (
            "import baton, baton.torch as bt\n"
            "try:\n"
            "    bt.init()\n"
            "except ValueError as e:\n"
            "    print('ValueError', e.code, e)\n"
        )
        env = dict(os.environ)
        env.update(BATON_JOB="launcher-rank", BATON_NODES="1", BATON_MIN_NODES="1",
                   LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", RANK="3", WORLD_SIZE="1")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=60, env=env)
        assert "ValueError FAILED_PRECONDITION" in out.stdout, (out.stdout, out.stderr)
        assert "set RANK=3 but the job assigned 0" in out.stdout, out.stdout
    barrier("launcher-rank.after")


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

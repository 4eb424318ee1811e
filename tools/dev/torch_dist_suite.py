#!/usr/bin/python3
"""torch's own torch.distributed suite (DistributedTest._DistTestBase of
torch.testing._internal.distributed.distributed_test) on one backend and
world size, run as torch's test/distributed/test_distributed_spawn.py runs
it: each test in world-size processes started with multiprocessing's
"spawn", which call init_process_group(BACKEND) on a file:// store. Meant
to be run by tools/dev/torch-dist-suite, which starts baton's coordinator
and agents and compares the backends; by hand:

  BACKEND=gloo WORLD_SIZE=2 torch_dist_suite.py --results gloo.json [TEST...]
  BACKEND=baton WORLD_SIZE=2 BATON_SUITE_SOCKETS=a.sock,b.sock \\
      BATON_SUITE_JOB=run1 torch_dist_suite.py --results baton.json [TEST...]

Environment (read at import, because the spawned processes import this
module again and must see the same suite):

  BACKEND             "gloo" or "baton"
  WORLD_SIZE          the processes per test (torch's suite wants >= 2)
  BATON_SUITE_SOCKETS (baton) the agents' sockets, comma-separated: rank r
                      attaches to the r-th, as node r of a job of
                      WORLD_SIZE nodes with one trainer each
  BATON_SUITE_JOB     (baton) a prefix for the job names: each test is the
                      job PREFIX.TEST_NAME, one per test, the same in its
                      processes
  DISTRIBUTED_TESTS_DEFAULT_TIMEOUT
                      torch's bound on one test, seconds (torch: 300; the
                      wrapper passes its --timeout); past it the processes
                      are terminated and the test fails

How baton counts. torch's suite decides at import which tests a backend
runs: its skip decorators compare BACKEND with "gloo", "nccl" and "mpi"
and look it up in DistTestCases.backend_feature, where an unknown name
such as "baton" has no feature at all (no DDP, no subgroups, no CPU
reduce_scatter...), so nearly every CPU test would be skipped. Instead the
module imports the suite with BACKEND="gloo", so baton runs exactly the
tests gloo runs, gloo's feature set included (its timeouts, sparse
all-reduce, send/recv, monitored_barrier): a test baton cannot serve fails
rather than hiding as a skip. At run time the suite's BACKEND is "baton":
init_process_group, new_group and the tests' own assertions on the
backend's name use it, and the few test bodies that branch on the name
"gloo" take the path of another backend (docs/api.md lists the tests this
costs).

Results: one JSON object per test (name, outcome "pass", "fail" or
"skip", seconds, reason: the exception's last line or the skip's text),
in a JSON list at --results.
"""

import argparse
import json
import os
import sys
import threading
import time
import types
import unittest

_BACKEND = os.environ.get("BACKEND", "")
if _BACKEND not in ("gloo", "baton"):
    sys.exit('torch_dist_suite: BACKEND must be "gloo" or "baton", not %r' % _BACKEND)
if int(os.environ.get("WORLD_SIZE", "0")) < 2:
    sys.exit("torch_dist_suite: WORLD_SIZE must be at least 2, not %r" % os.environ.get("WORLD_SIZE"))

try:
    import expecttest  # noqa: F401
except ImportError:
    # torch's test helpers build their TestCase on expecttest's (PyPI only,
    # no Debian package); the distributed suite uses none of what it adds
    # (assertExpectedInline), so unittest's stands in.
    _expecttest = types.ModuleType("expecttest")
    _expecttest.TestCase = unittest.TestCase
    _expecttest.ACCEPT = False
    sys.modules["expecttest"] = _expecttest

import torch  # noqa: E402
from torch.nn.parallel import _replicated_tensor_ddp_utils  # noqa: E402

# The suite reads BACKEND when it is imported: its skip decorators see
# gloo (the module's docstring says why); then its BACKEND is the one run.
os.environ["BACKEND"] = "gloo"
from torch.testing._internal.distributed import distributed_test  # noqa: E402

os.environ["BACKEND"] = _BACKEND
distributed_test.BACKEND = _BACKEND
if _BACKEND == "baton":
    import baton.torch  # noqa: E402,F401 - registers the backend "baton"

# How long the other processes of a test may outlive one that crashed.
_CRASH_GRACE_S = 90


def _attach_to_agent(rank, test_name):
    """The environment baton.torch.init reads (client/client.cc,
    ClientOptions::FromEnvironment), for rank `rank` of `test_name`'s job:
    node `rank` of WORLD_SIZE, one trainer on it, its own agent."""
    sockets = os.environ["BATON_SUITE_SOCKETS"].split(",")
    world_size = int(os.environ["WORLD_SIZE"])
    if len(sockets) < world_size:
        raise RuntimeError("BATON_SUITE_SOCKETS names %d agents for %d ranks" % (len(sockets), world_size))
    os.environ.update({
        "BATON_AGENT_SOCKET": sockets[rank],
        "BATON_JOB": "%s.%s" % (os.environ["BATON_SUITE_JOB"], test_name),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "BATON_NODES": str(world_size),
        "GROUP_RANK": str(rank),
    })


class TestDistBackendWithSpawn(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    """test_distributed_spawn.py's class, with each spawned process
    attached to its rank's baton agent before TestDistBackend._run calls
    init_process_group."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _join_processes(self, fn):
        """torch's, and beside it a watcher that ends the test's processes
        _CRASH_GRACE_S after one of them died of a signal (a crash): torch
        ends them at once only when one exits with its error code, and
        would otherwise wait out the test's whole timeout for survivors
        waiting for the dead peer (within the grace period, baton's group
        timeout, 60 s here, fails their calls)."""
        stop = threading.Event()
        watcher = threading.Thread(target=self._end_after_crash, args=(stop,), daemon=True)
        watcher.start()
        try:
            super()._join_processes(fn)
        finally:
            stop.set()
            watcher.join()

    def _end_after_crash(self, stop):
        crashed_at = None
        while not stop.wait(0.1):
            if crashed_at is None and any(p.exitcode is not None and p.exitcode < 0 for p in self.processes):
                crashed_at = time.monotonic()
            if crashed_at is not None and time.monotonic() - crashed_at > _CRASH_GRACE_S:
                for p in self.processes:
                    p.terminate()
                return

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe):
        # TestDistBackend._run turns on DDP's ReplicatedTensor, whose module
        # (torch.distributed._shard) fails to import on Python 3.11 in torch
        # 1.13 (a dataclass field with a mutable default), which would fail
        # every DDP test on either backend. DDP runs as it does outside the
        # harness instead: without it, torch 1.13's default.
        _replicated_tensor_ddp_utils._set_ddp_with_replicated_tensor = lambda value: None
        if _BACKEND == "baton":
            _attach_to_agent(rank, test_name)
        super()._run(rank, test_name, file_name, pipe)


class _Recorder(unittest.TextTestResult):
    """Records each test's outcome, time and reason for --results."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, reason=""):
        started = self._started.pop(test.id(), time.monotonic())
        self.records.append({
            "name": test.id().rsplit(".", 1)[-1],
            "outcome": outcome,
            "seconds": round(time.monotonic() - started, 2),
            "reason": reason,
        })

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", _reason(err))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "fail", _reason(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def _reason(err):
    """The line that says why a test failed: the child's exception (the
    last line of the traceback _check_return_codes relays), a timeout, or
    the assertion in the parent."""
    text = str(err[1]).strip()
    if "timed out after" in text:
        return text.splitlines()[-1][:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ("Error" in line.split(":")[0] or "Exception" in line.split(":")[0]) and not line.startswith("File "):
            return line[:300]
    return (lines[-1] if lines else type(err[1]).__name__)[:300]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="*", help="test names (default: the whole suite)")
    parser.add_argument("--results", required=True, help="where to write the JSON list of results")
    parser.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    args = parser.parse_args()

    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if args.list:
        print("\n".join(names))
        return 0
    unknown = sorted(set(args.tests) - set(names))
    if unknown:
        sys.exit("torch_dist_suite: no such test: %s" % " ".join(unknown))
    selected = args.tests or names
    suite = unittest.TestSuite(TestDistBackendWithSpawn(name) for name in selected)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Recorder)
    result = runner.run(suite)
    with open(args.results, "w") as f:
        json.dump(result.records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

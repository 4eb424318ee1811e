"""Runs a test module's test_* functions, in the order they are defined, on
every rank of a job started by batonrun. All ranks run the same sequence (the
tests use collectives), so the first failure ends this rank with a non-zero
exit and batonrun stops the others."""

import time
import traceback

import torch

import baton.torch as bt


# Every dtype baton takes.
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.int8,
)


def expect_error(fn, *words):
    """fn() raises ValueError whose message names every one of `words`."""
    try:
        fn()
    except ValueError as e:
        for word in words:
            assert word in str(e), "%r does not name %r" % (str(e), word)
        return
    raise AssertionError("no error; expected one naming %s" % (words,))


def run_tests(namespace):
    torch.set_num_threads(1)
    bt.init()
    # Read once: a test may leave the job (bt.shutdown()) before it ends.
    rank = bt.rank()
    tests = [(name, f) for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    for name, test in tests:
        start = time.monotonic()
        try:
            test()
        except BaseException:
            print("FAILED %s on rank %d:\n%s" % (name, rank, traceback.format_exc()), flush=True)
            return 1
        if rank == 0:
            print("ok %s (%.2f s)" % (name, time.monotonic() - start), flush=True)
    bt.shutdown()
    return 0

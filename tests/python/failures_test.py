"""Failures reach the training loop as errors, never as hangs (run by
batonrun: tests/python/CMakeLists.txt)."""

import sys
import time

import torch

import baton
import baton.torch as bt
from harness import run_tests
from optimizers_test import batch, loss_fn, make_model, sgd


def test_a_rank_that_stops_training_fails_the_others_scheduled_optimizer():
    """The second node's ranks skip the last iteration and leave the job:
    the first node's last push-pulls can never complete. They fail naming
    the cause, and the first node's ScheduledOptimizer raises instead of
    waiting forever."""
    model = make_model()
    optimizer = bt.ScheduledOptimizer(model, sgd(model))
    steps = 3 if bt.rank() < bt.local_size() else 2
    start = time.monotonic()
    error = None
    try:
        for step in range(steps):
            x, y = batch(step, bt.rank())
            loss_fn(model, x, y).backward()
            optimizer.step()
        optimizer.finalize()
    except baton.BatonError as e:
        error = e
    elapsed = time.monotonic() - start
    if bt.rank() < bt.local_size():
        assert error is not None, "the stuck push-pulls were not reported"
        assert "Gradient." in str(error) and "a node left" in str(error), str(error)
        assert elapsed < 30, "took %.1f s" % elapsed
    else:
        assert error is None, str(error)
    # The error was delivered; closing does not raise it again.
    optimizer.close()


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

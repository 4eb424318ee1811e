"""The extension's CUDA calls check their arguments before anything reaches
the agent (run by batonrun: tests/python/CMakeLists.txt). Every rank runs the
same checks; nothing is declared, so the job's ranks stay in step, and host
tensors keep working afterwards."""

import sys

import torch

import baton.torch as bt
from baton import _baton
from harness import run_tests

MEMORY = b"m" * 64
EVENT = b"e" * 64


def raises(error, call, *texts):
    try:
        call()
    except error as e:
        for text in texts:
            assert text in str(e), "%r not in %r" % (text, str(e))
        return
    raise AssertionError("no %s from %s" % (error.__name__, call))


def session():
    return bt._core._require()


def test_declare_checks_each_cuda_buffer_naming_the_field():
    cuda = ("g", _baton.FLOAT32, [4], _baton.PUSH_PULL, _baton.MEMORY_CUDA)
    host = ("h", _baton.FLOAT32, [4], _baton.PUSH_PULL)
    s = session()
    raises(
        ValueError,
        lambda: s.declare([cuda], [(0, b"short", 0, EVENT, "")]),
        'tensor "g": CudaBuffer.memory_handle is 5 bytes',
        "cudaIpcMemHandle_t (64 bytes)",
    )
    raises(
        ValueError,
        lambda: s.declare([cuda], [(0, MEMORY, 0, EVENT + b"x", "")]),
        "CudaBuffer.event_handle is 65 bytes",
    )
    raises(ValueError, lambda: s.declare([cuda], [(0, MEMORY, -4, EVENT, "")]), "CudaBuffer.offset is -4")
    raises(ValueError, lambda: s.declare([host, cuda]), 'tensor "g" is in CUDA memory', "has no CudaBuffer")
    raises(
        ValueError,
        lambda: s.declare([host, cuda], [(0, MEMORY, 0, EVENT, ""), (1, MEMORY, 0, EVENT, "")]),
        'tensor "h" is in host memory',
    )
    raises(
        ValueError, lambda: s.declare([cuda], [(1, MEMORY, 0, EVENT, "")]), "CudaBuffer.index 1 is outside"
    )
    raises(ValueError, lambda: s.declare([("x", _baton.FLOAT32, [1])]), "(name, dtype, shape, op)")
    # Handles are bytes, not text.
    raises(TypeError, lambda: s.declare([cuda], [(0, "m" * 64, 0, EVENT, "")]))


def test_device_enqueues_check_their_buffer_too():
    s = session()
    raises(
        ValueError,
        lambda: s.push_pull_device_async("g", _baton.FLOAT32, [4], True, MEMORY[:63], 0, EVENT, ""),
        "CudaBuffer.memory_handle is 63 bytes",
    )
    raises(
        ValueError,
        lambda: s.broadcast_device_async("g", _baton.FLOAT32, [4], 0, MEMORY, -1, EVENT),
        "CudaBuffer.offset is -1",
    )
    raises(TypeError, lambda: s.push_pull_device_async("g", _baton.FLOAT32, [4], True, None, 0, EVENT))


def test_host_tensors_still_work_under_the_names_refused_above():
    for name in ("g", "h"):
        t = torch.full((4,), float(bt.rank()))
        out = bt.push_pull(t, average=False, name=name)
        assert torch.equal(out, torch.full((4,), float(sum(range(bt.size()))))), out


if __name__ == "__main__":
    sys.exit(run_tests(globals()))

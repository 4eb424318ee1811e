"""DistributedDataParallel's gradient buckets through baton: a comm hook.

    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(bt.DDPCommHookState(model), bt.ddp_comm_hook)

DDP keeps doing what it does (bucketing, the broadcast of parameters and
buffers through its own process group, find_unused_parameters); each bucket
it would all-reduce is averaged by the agents instead, so baton's priority
scheduling, partitioning, credit and timeline apply to it.

Names and priority. A bucket is the tensor "<name>.layout<L>.bucket<i>":
`i` is DDP's bucket index, `L` counts the bucket layouts this model has had
(DDP rebuilds its buckets once, in the second iteration, in the order the
gradients became ready). Every layout's names are declared up front, all of
them before its first bucket starts, highest index first: DDP reduces
bucket 0 (the last layers) first, and the highest index holds the first
layers, which the next forward pass needs first, so it is the most urgent.
A layout gets fresh names rather than new versions of the old ones, which
would keep the old priority wherever a bucket's shape happened not to
change. Each layout keeps its shared memory until shutdown.

Completion. baton's client completes operations on its own threads but
offers no callback, so one thread here (started with the first bucket,
stopped at shutdown) synchronizes the buckets in the order they started and
completes their futures: with the averaged bucket, or with the operation's
error (BatonError naming the cause), which DDP raises from backward().
"""

import collections
import threading
import weakref

import torch

from baton.torch import _core as _bt
from baton.torch import compression as _compression
from baton._baton import BatonError

__all__ = ["DDPCommHookState", "ddp_comm_hook"]


def _layout_key(tensor):
    return (tensor.dtype, tensor.numel(), tensor.device)


class DDPCommHookState:
    """The state of `ddp_comm_hook` for one DistributedDataParallel model.

    `model` is the DDP model (held weakly); `name` prefixes its buckets'
    tensor names, so two models of one job need different names. Call it
    after baton.torch.init(), on every rank in the same order: it declares
    the model's buckets. Its forward pre-hook on `model.module` declares
    the rebuilt buckets before the first backward pass that uses them.
    `compression` (baton.torch.compression: Compression.fp16 is DDP's
    fp16_compress_hook, .bf16 its bf16_compress_hook) is what the buckets
    travel as.
    """

    def __init__(self, model, name="DDP", compression=None):
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(
                "DDPCommHookState(model): model must be the "
                "torch.nn.parallel.DistributedDataParallel that the hook is "
                "registered on, not %s" % type(model).__name__
            )
        if not isinstance(name, str) or not (0 < len(name) <= 200 and name.isascii() and name.isprintable()):
            raise ValueError(
                "DDPCommHookState(name=%r): the name must be 1..200 printable "
                "ASCII characters (it prefixes the buckets' tensor names)" % (name,)
            )
        if not hasattr(model.reducer, "_get_zeros_like_grad_buckets"):
            raise ValueError(
                "this torch (%s) does not tell its DDP bucket layout "
                "(Reducer._get_zeros_like_grad_buckets), which baton's DDP "
                "hook needs (torch 1.13 has it)" % torch.__version__
            )
        _compression.check(compression)
        self.name = name
        self.compression = compression
        self._model = weakref.ref(model)
        # Bucket index -> _layout_key of the planned layout (declared).
        self._layout = []
        self._layout_number = -1
        # A bucket did not fit the plan: plan again before the next forward.
        self._stale = False
        self._rebuilt = getattr(model, "_has_rebuilt_buckets", False)
        self._plan(model)
        self._pre_hook = model.module.register_forward_pre_hook(self._before_forward)

    def bucket_name(self, index):
        """The tensor name of bucket `index` in the current layout."""
        return "%s.layout%d.bucket%d" % (self.name, self._layout_number, index)

    def _plan(self, model):
        """Declares the reducer's current buckets, if they are a new layout.
        Not from inside the hook: the reducer holds its lock there."""
        buckets = sorted(model.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
        layout = [_layout_key(b.buffer()) for b in buckets]
        self._stale = False
        if layout == self._layout:
            return
        self._layout = layout
        self._layout_number += 1
        _compression.declare_many(
            self.compression, [(self.bucket_name(b.index()), b.buffer()) for b in reversed(buckets)]
        )

    def _before_forward(self, module, inputs):
        model = self._model()
        if model is None:
            return
        # DDP rebuilds its buckets at the start of a forward pass, before
        # its module's forward: here the new layout is known.
        rebuilt = getattr(model, "_has_rebuilt_buckets", False)
        if self._stale or rebuilt != self._rebuilt:
            self._rebuilt = rebuilt
            self._plan(model)

    def _start(self, bucket):
        buffer = bucket.buffer()
        index = bucket.index()
        if index < len(self._layout) and self._layout[index] == _layout_key(buffer):
            name = self.bucket_name(index)
        else:
            # DDP changed its buckets without our forward pre-hook seeing it
            # (every rank alike): this bucket is declared on first use, in
            # the order of use, and the next forward plans again.
            self._stale = True
            name = "%s.unplanned.bucket%d" % (self.name, index)
        if buffer.is_cuda:
            future = torch.futures.Future(devices=[buffer.device])
        else:
            future = torch.futures.Future()
        handle = _bt.push_pull_async_inplace(buffer, average=True, name=name, compression=self.compression)
        _completions.add(handle, future, name)
        # A Python future keeps set_exception's error as its value and
        # raises it only in Python; DDP reads it from C++ ("Unable to cast
        # ... to Tensor"). Raised in a callback, it becomes the chained
        # future's error, which DDP's backward() raises as it is.
        return future.then(_value)


def _value(future):
    return future.value()


def ddp_comm_hook(state, bucket):
    """DDP communication hook: averages `bucket` over every rank through
    baton, in place, and returns a torch.futures.Future of it.

    `state` is a DDPCommHookState of the model the hook is registered on:
    `model.register_comm_hook(DDPCommHookState(model), ddp_comm_hook)`.
    """
    if not isinstance(state, DDPCommHookState):
        raise ValueError(
            "baton's ddp_comm_hook needs a DDPCommHookState, not %s: "
            "model.register_comm_hook(baton.torch.DDPCommHookState(model), "
            "baton.torch.ddp_comm_hook)" % type(state).__name__
        )
    return state._start(bucket)


class _Completions:
    """Completes bucket futures: one thread synchronizes the operations in
    the order they started. In flight at once: what DDP started in one
    backward pass, as DDP waits for every bucket before the next."""

    # How long one synchronize waits before the thread looks whether it is
    # told to give up; the operation itself is bounded by the agent's
    # --op_timeout_ms.
    _SLICE_S = 0.5

    def __init__(self):
        self._lock = threading.Lock()
        self._worker = None

    def add(self, handle, future, name):
        with self._lock:
            if self._worker is None:
                self._worker = _Worker(self._SLICE_S)
                _bt._drainers.add(self)
            self._worker.add(handle, future, name)

    def close(self, timeout_s=60.0):
        """Before the session closes (baton.torch.shutdown): lets what is in
        flight complete for at most `timeout_s`, fails the rest, and ends
        the thread. A later bucket starts a new one."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close(timeout_s)


class _Worker:
    """One completion thread and its queue of (handle, future, name)."""

    def __init__(self, slice_s):
        self._slice_s = slice_s
        self._cv = threading.Condition()
        self._queue = collections.deque()
        self._stopping = False  # finish what is queued, then end
        self._abandon = False  # fail what is queued, then end
        self._thread = threading.Thread(target=self._serve, name="baton-ddp-completions", daemon=True)
        self._thread.start()

    def add(self, handle, future, name):
        with self._cv:
            self._queue.append((handle, future, name))
            self._cv.notify_all()

    def close(self, timeout_s):
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._queue, timeout=timeout_s)
            # What is left fails at once (one poll each).
            self._abandon = True
        self._thread.join()

    def _serve(self):
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                handle, future, name = self._queue[0]
            result, error = self._wait(handle, name)
            with self._cv:
                self._queue.popleft()
                self._cv.notify_all()
            # Outside the lock: completing runs the future's callbacks.
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def _wait(self, handle, name):
        """(the averaged bucket, None) or (None, the error)."""
        while True:
            with self._cv:
                abandon = self._abandon
            try:
                return _bt.synchronize(handle, timeout=0.0 if abandon else self._slice_s), None
            except TimeoutError:
                if abandon:
                    error = BatonError(
                        'DDP bucket "%s" was still in flight when baton shut '
                        "down: the backward pass that started it cannot "
                        "finish" % name
                    )
                    error.code = "ABORTED"
                    return None, error
            except Exception as e:  # noqa: B902 - delivered to DDP
                return None, e


_completions = _Completions()

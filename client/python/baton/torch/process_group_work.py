"""How the "baton" torch.distributed backend (process_group.py) completes
what it starts: each baton operation of a process-group call is a
_Request, and one thread per group completes their torch futures.

Order and names. A request is one baton operation on one tensor name.
Every rank makes the same calls in the same order (c10d's contract), and
a name has at most one operation in flight per process; so a request
whose name is still busy with an earlier request is deferred, and this
thread starts it as soon as that one finished, never the caller (DDP's
autograd thread must not wait for the network). The first request of a
name is never deferred: it starts, declaring the name, in the caller's
thread, so that every rank declares names in the same order.

Bounds. Every request carries a deadline (the group's timeout, or the
call's own). The thread completes requests in the order they were made; a
request still running at its deadline, or one that fails, poisons the
group: its future and every later one fail with that error, and every
later call raises it at once. A timed-out baton operation stays in flight
in the agents, which end it at their --op_timeout_ms; destroy the group.
"""

import collections
import datetime
import os
import threading
import time

import torch
from torch._C._distributed_c10d import Work as _C10dWork
from torch._C._distributed_c10d import _create_work_from_future

from baton._baton import BatonError
from baton.torch import _core as _bt

__all__ = []


class _Request:
    """One baton operation of a process-group call. `start()` starts it
    and returns its handle; `finish(result)`, given what
    baton.torch.synchronize returned, completes the caller's tensors and
    returns the future's value. `what` names it in errors ("all_reduce of
    float32[4, 3]"). Touched by the caller's thread until submitted, then
    under the queue's lock or by its thread only."""

    __slots__ = ("what", "name", "start", "finish", "future", "timeout_s", "deadline", "handle", "claimed")

    def __init__(self, what, name, start, finish, future, timeout_s):
        self.what = what
        self.name = name
        self.start = start
        self.finish = finish
        self.future = future
        self.timeout_s = timeout_s
        self.deadline = None  # set by submit
        self.handle = None  # set once started
        self.claimed = False  # its future is being completed (under the lock)


class GroupUnusable(RuntimeError):
    """Raised by every call of a baton process group after one of its
    operations failed or ran past its timeout (the group is poisoned, as a
    gloo or NCCL communicator is after an error): destroy it."""


class RequestQueue:
    """The requests of one process group, in the order they were made, and
    the thread that completes them. submit() is called by the group's
    callers (the training thread, DDP's autograd thread); the rest runs on
    the thread, but close(), which baton.torch.shutdown calls (the queue
    is one of its drainers)."""

    # How long one synchronize waits before the thread looks at the
    # deadline and at close().
    _SLICE_S = 0.2

    def __init__(self, label):
        self._label = label
        self._cv = threading.Condition()
        # Guarded by _cv:
        self._queue = collections.deque()  # submitted, not completed
        self._by_name = {}  # name -> deque of its requests, oldest first
        self._failure = None  # what poisoned the group (text)
        self._closing = False
        self._thread = None

    def _unusable(self):
        return GroupUnusable("%s is unusable since an earlier operation failed: %s" % (self._label, self._failure))

    def check_usable(self):
        """Raises GroupUnusable when an earlier operation poisoned the group."""
        with self._cv:
            if self._failure is not None:
                raise self._unusable()

    def submit(self, request):
        """Queues `request` and starts it here unless its name is busy.
        Raises at once, queueing nothing, when the group is poisoned or the
        start is refused (a ValueError naming what is wrong)."""
        request.deadline = time.monotonic() + request.timeout_s
        with self._cv:
            if self._failure is not None:
                raise self._unusable()
            deferred = request.name in self._by_name
            if deferred:
                self._by_name[request.name].append(request)
            else:
                # Busy from now on: no one else starts this name meanwhile.
                self._by_name[request.name] = collections.deque([request])
        if not deferred:
            try:
                request.handle = request.start()
            except BaseException:
                with self._cv:
                    waiting = self._by_name.get(request.name)
                    if waiting and waiting[0] is request:
                        waiting.popleft()
                        if not waiting:
                            del self._by_name[request.name]
                raise
        with self._cv:
            self._queue.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="baton-process-group", daemon=True)
                self._thread.start()
                _bt._drainers.add(self)
            self._cv.notify_all()

    def close(self, timeout_s=60.0):
        """Lets what is queued complete for at most `timeout_s` (and each
        request's own deadline), fails the rest, and ends the thread."""
        with self._cv:
            thread = self._thread
            if thread is None:
                return
            self._closing = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._queue, timeout=timeout_s)
            failed = []
            if self._queue:
                failed = self._poison("%s was shut down with operations in flight" % self._label)
            self._thread = None
        _fail(failed, self._unusable())
        thread.join()
        with self._cv:
            self._closing = False

    def _serve(self):
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                request = self._queue[0]
            value, error = self._complete(request)
            failed = []
            with self._cv:
                mine = not request.claimed
                request.claimed = True
                if mine:
                    self._queue.popleft()
                    self._release(request)
                    if error is not None:
                        failed = self._poison("%s: %s" % (type(error).__name__, error))
                self._cv.notify_all()
            # Outside the lock: completing runs the future's callbacks.
            if mine and error is None:
                request.future.set_result(value)
            elif mine:
                request.future.set_exception(error)
                _fail(failed, self._unusable())

    def _complete(self, request):
        """(the future's value, None) or (None, the error), within the
        request's deadline; (None, None) when close() failed it meanwhile."""
        if request.handle is None:
            # Deferred: the requests before it on its name are done.
            try:
                request.handle = request.start()
            except Exception as e:  # noqa: B902 - delivered to the future
                return None, e
        while True:
            with self._cv:
                if request.claimed:
                    return None, None
            left = request.deadline - time.monotonic()
            try:
                result = _bt.synchronize(request.handle, max(0.0, min(self._SLICE_S, left)))
            except TimeoutError:
                if left <= self._SLICE_S:
                    # RuntimeError, as c10d's own backends raise on a timeout.
                    return None, RuntimeError(
                        "%s: %s did not finish within its timeout of %.1f s (init_process_group's "
                        "timeout)" % (self._label, request.what, request.timeout_s)
                    )
                continue
            except Exception as e:  # noqa: B902 - delivered to the future
                return None, e
            try:
                return request.finish(result), None
            except Exception as e:  # noqa: B902 - delivered to the future
                return None, e

    def _release(self, request):
        """After `request` completed, its name's next request (deferred) is
        the one this thread starts when it reaches it. Under _cv."""
        waiting = self._by_name.get(request.name)
        if waiting and waiting[0] is request:
            waiting.popleft()
            if not waiting:
                del self._by_name[request.name]

    def _poison(self, failure):
        """Records the group's first failure and takes every queued request
        off the queue, claimed; returns them, for _fail outside the lock.
        Under _cv."""
        if self._failure is None:
            self._failure = failure
        failed = [r for r in self._queue if not r.claimed]
        for r in failed:
            r.claimed = True
        self._queue.clear()
        self._by_name.clear()
        return failed


class Work(_C10dWork):
    """c10d's Work of one process-group call, on the torch future its
    requests complete. wait() raises the call's error; torch 1.13's own
    _create_work_from_future makes a Work whose wait() returns True after a
    failure, leaving garbage in the caller's tensors. C++ callers (DDP's
    reducer) take get_future() through c10d's Python trampoline."""

    # A C++ caller (DDP's parameter checks and broadcasts) holds only the
    # C++ half of a Python Work: once Python drops the object, c10d's
    # trampoline no longer finds this wait() and falls back to the base
    # Work's, which never returns. So every Work stays alive until its
    # wait() returned, or until _KEPT later ones were made (C++ callers
    # wait at once; a Python caller that never waits does not leak).
    _KEPT = 1024
    _kept = collections.OrderedDict()
    _kept_lock = threading.Lock()

    def __init__(self, future):
        super().__init__()
        self._future = future
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())
        with Work._kept_lock:
            Work._kept[id(self)] = self
            if len(Work._kept) > Work._KEPT:
                Work._kept.popitem(last=False)

    def wait(self, timeout=datetime.timedelta(0)):
        """Waits for the call (at most `timeout`, when it is not zero) and
        raises its error; RuntimeError when `timeout` passed first."""
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        if not self._done.wait(seconds if seconds > 0 else None):
            raise RuntimeError("a baton process group call did not complete within the %.1f s given to wait()" % seconds)
        with Work._kept_lock:
            Work._kept.pop(id(self), None)
        self._future.wait()  # raises the call's error
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and self.exception() is None

    def exception(self):
        """The call's error once it failed, else None."""
        if not self._future.done():
            return None
        try:
            self._future.wait()
        except Exception as e:  # noqa: B902 - returned, as c10d's Work does
            return e
        return None

    def result(self):
        return self._future.wait()


_AUTOGRAD = os.path.join("torch", "autograd", "__init__.py")


def work_for_caller(future, caller):
    """The Work to return to `caller` (the frame that called the group's
    method): a Work on `future`. c10d's trampoline in torch 1.13 forwards
    only wait() of a Python Work to C++ callers, not get_future(), which
    DDP's reducer calls on its buckets' all-reduces from backward(): there
    (`caller` is autograd's backward, or no frame at all on an autograd
    thread) the Work is c10d's own future-wrapping one, whose future
    carries the error into backward() (as a RuntimeError that quotes it:
    "Got the following error when running the callback: ..."). Everywhere
    else it is a Work whose
    wait() raises the error, which c10d's own does not."""
    if caller is None or caller.f_code.co_filename.endswith(_AUTOGRAD):
        # A future's set_exception() completes it, to C++, with the
        # exception as its value (the reducer would read tensors out of
        # it); an error raised in then() is an error to C++ too.
        return _create_work_from_future(future.then(_value))
    return Work(future)


def _value(future):
    return future.wait()  # raises the call's error


def _fail(requests, error):
    for request in requests:
        request.future.set_exception(error)


def new_future(tensors):
    """A torch future for a request or a call on `tensors` (a list, or a
    list of lists: on their CUDA devices,
    when they are CUDA tensors, so that waiting on it synchronizes them)."""
    flat = []
    for t in tensors:
        flat.extend(t if isinstance(t, (list, tuple)) else [t])
    devices = sorted({t.device for t in flat if t.is_cuda}, key=str)
    return torch.futures.Future(devices=devices) if devices else torch.futures.Future()

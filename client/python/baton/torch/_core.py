"""baton.torch's session and collectives (init, push_pull, broadcast, ...),
which baton.torch exports. The package's other modules (optimizers, ddp,
elastic) build on this one and import it, never the package itself, so
that importing baton.torch runs each module once, in order."""

import atexit
import io
import os
import signal
import sys
import threading
import time
import weakref

import torch

from baton import _baton
from baton._baton import BatonError
from baton.torch import _cuda

__all__ = [
    "BatonError",
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_rank",
    "local_size",
    "push_pull",
    "push_pull_async",
    "push_pull_inplace",
    "push_pull_async_inplace",
    "poll",
    "synchronize",
    "broadcast",
    "broadcast_async",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "declare",
    "declare_many",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "barrier",
    "ReduceOp",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
]


class ReduceOp(object):
    """How a push_pull combines the ranks' tensors, element by element
    (Horovod's hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product; the
    bitwise ones, torch.distributed's BAND/BOR/BXOR, take integer tensors
    only)."""

    def __init__(self, name, code, average=False):
        self.name = name
        self.code = code
        self.average = average

    def __repr__(self):
        return "baton.torch.%s" % self.name


Average = ReduceOp("Average", _baton.REDUCE_SUM, average=True)
Sum = ReduceOp("Sum", _baton.REDUCE_SUM)
Min = ReduceOp("Min", _baton.REDUCE_MIN)
Max = ReduceOp("Max", _baton.REDUCE_MAX)
Product = ReduceOp("Product", _baton.REDUCE_PRODUCT)
BitwiseAnd = ReduceOp("BitwiseAnd", _baton.REDUCE_BAND)
BitwiseOr = ReduceOp("BitwiseOr", _baton.REDUCE_BOR)
BitwiseXor = ReduceOp("BitwiseXor", _baton.REDUCE_BXOR)


def _resolve_op(average, op):
    """(average flag, reduce op code) of a push_pull given `average` and
    `op`: op, when given, supersedes average, which must then be None (as
    in Horovod); neither means the mean."""
    if op is None:
        return (True if average is None else bool(average)), _baton.REDUCE_SUM
    if average is not None:
        raise ValueError("push_pull takes op or average, not both (op=%r, average=%r)" % (op, average))
    if not isinstance(op, ReduceOp):
        raise ValueError(
            "op=%r is not a baton.torch reduce op: give Average, Sum, Min, Max, Product, "
            "BitwiseAnd, BitwiseOr or BitwiseXor" % (op,)
        )
    return op.average, op.code

_DTYPES = {
    torch.float32: _baton.FLOAT32,
    torch.float64: _baton.FLOAT64,
    torch.float16: _baton.FLOAT16,
    torch.bfloat16: _baton.BFLOAT16,
    torch.int32: _baton.INT32,
    torch.int64: _baton.INT64,
    torch.uint8: _baton.UINT8,
    torch.int8: _baton.INT8,
    torch.int16: _baton.INT16,
}

_lock = threading.Lock()
_session = None
# Whether this process ever attached (its tensors may view shared memory).
_session_ever_started = False
# Things to drain before the session closes (ScheduledOptimizers).
_drainers = weakref.WeakSet()
# handle id -> _Pending; ids are never reused.
_pending = {}
# Handles of grouped operations (grouped_allreduce_async) -> _Group.
_groups = {}
# Handles of compressed push-pulls -> their compression.CompressedOperation,
# which wraps the push-pull of the payload and decompresses at synchronize.
_compressed = {}
_next_handle = 0
# Unnamed calls: (kind,) -> slots in use. The calls in flight together are
# matched across ranks by order (their slot), whatever their tensors, so
# ranks whose tensors differ meet on one name and get an error, not a wait.
_unnamed_busy = {}
# Host tensor name -> weakref of the tensor (a parameter) whose gradient
# lives in its shared memory (_shared_views).
_shared_owners = {}
# CUDA tensor name -> _DeviceSlot of its latest declaration; earlier ones
# (the name was declared anew) in _retired_slots. Kept until shutdown: the
# agent holds their memory open until this process detaches.
_device_slots = {}
_retired_slots = []


class _Pending:
    __slots__ = ("operation", "tensor", "target", "unnamed_key", "slot", "finish")

    def __init__(self, operation, tensor, target, unnamed_key, slot=None, finish=None):
        self.operation = operation
        # Host: what the agent's bytes are written into. CUDA: where the
        # staging tensor is copied after completion (None: nowhere).
        self.tensor = tensor
        # Host: the caller's tensor when it is not `tensor` (written from
        # it), else None. CUDA: what synchronize() returns.
        self.target = target
        self.unnamed_key = unnamed_key
        self.slot = slot  # the _DeviceSlot of a CUDA tensor
        # Host: what synchronize() returns is finish(result) when set (an
        # allgather's padded rows cut out).
        self.finish = finish


class _DeviceSlot:
    """One CUDA tensor name: baton's staging tensor on the tensor's device,
    shared with the agent (CUDA IPC memory handle and interprocess ready
    event), and what is in flight on it.

    An operation copies the caller's tensor into `staging` on the current
    stream and records `event` there before it is enqueued; the agent waits
    for the event, runs the collective on `staging` and writes the result
    there, in place, before the completion arrives; synchronize() then
    copies `staging` into the caller's tensor on the current stream.
    """

    __slots__ = ("device", "dtype", "shape", "code", "staging", "event", "location", "declared", "busy", "stream")

    def __init__(self, tensor, code):
        self.device = tensor.device
        self.code = code  # the collective it is declared for
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)
        self.staging = _cuda.allocate_staging(tensor)
        memory_handle, offset = _cuda.share_memory(self.staging)
        self.event, event_handle = _cuda.create_event(self.device)
        # CudaBuffer: memory_handle, offset, event_handle, pci_bus_id.
        self.location = (memory_handle, offset, event_handle, _cuda.pci_bus_id(self.device))
        self.declared = False  # the agent accepted it
        self.busy = False  # an operation on it is in flight (guarded by _lock)
        # The stream of this process's last copy into or out of `staging`.
        self.stream = None

    def fits(self, tensor, code):
        return (
            tensor.device == self.device
            and tensor.dtype == self.dtype
            and tuple(tensor.shape) == self.shape
            and code == self.code
        )


def init(attach_timeout=None):
    """Attaches this process to its node's baton-agent and joins the job.

    Reads BATON_AGENT_SOCKET, BATON_JOB, LOCAL_RANK and LOCAL_WORLD_SIZE
    (batonrun sets them) and waits until every node of the job has joined
    (at most `attach_timeout` seconds; default 300). Calling it again while
    initialized does nothing.
    """
    global _session, _session_ever_started
    with _lock:
        if _session is not None:
            return
        _session = _baton.Session.init(attach_timeout)
        _session_ever_started = True


def is_initialized():
    return _session is not None


def shutdown(drain_timeout=60.0):
    """Drains what is in flight (ScheduledOptimizer updates included, for at
    most `drain_timeout` seconds), then leaves the job. Safe to call twice;
    also runs at interpreter exit, without the drain when the interpreter
    exits on an uncaught exception (Ctrl-C included): then the peers hear at
    once that this rank left instead of waiting for the drain. Ctrl-C during
    the drain leaves the job at once, abandoning what is in flight."""
    global _session
    deadline = time.monotonic() + drain_timeout
    try:
        for drainer in list(_drainers):
            drainer.close()
        _drain(deadline)
    except KeyboardInterrupt:
        _close(0.0, quiet=True)
        raise
    _close(max(0.0, deadline - time.monotonic()))


def _close(drain_timeout, quiet=False):
    """Leaves the job; `quiet`: raises nothing (another error is on its way)."""
    global _session
    with _lock:
        session, _session = _session, None
        _pending.clear()
        _compressed.clear()
        _unnamed_busy.clear()
        _shared_owners.clear()
    try:
        if session is not None:
            session.shutdown(drain_timeout)
    except Exception:  # noqa: B902
        if not quiet:
            raise
    finally:
        # Only now: the agent has closed its handles to the staging tensors.
        with _lock:
            _device_slots.clear()
            del _retired_slots[:]


def _drain(deadline):
    """Waits until what is in flight finished or `deadline` passed, in short
    sleeps so that Ctrl-C interrupts it (session.shutdown's own drain
    cannot be interrupted)."""
    session = _session
    if session is None:
        return
    with _lock:
        operations = [pending.operation for pending in _pending.values()]
    for operation in operations:
        while not session.poll(operation) and time.monotonic() < deadline:
            time.sleep(0.01)


def _shutdown_at_exit():
    # At exit a failure was already reported where it happened (or the
    # script is ending on its own error): say it in one line, no traceback.
    # An uncaught exception (sys.last_value) means this rank will not do
    # its part of what is in flight: draining would only keep the peers
    # waiting for it.
    error = getattr(sys, "last_value", None)
    try:
        shutdown(0.0 if error is not None else 60.0)
    except Exception as e:  # noqa: B902
        sys.stderr.write("baton: shutdown at exit: %s\n" % e)
    if error is not None and _session_ever_started:
        _exit_now(error)


def _exit_now(error):
    """Ends the process as Python would after the uncaught `error` (exit
    code 1; death by SIGINT for KeyboardInterrupt), without the rest of the
    interpreter's finalization: torch 1.13 keeps a backward pass that an
    error interrupted (in a gradient hook, say) in a C++ thread-local, and
    frees it after the interpreter is gone; freeing a tensor that views
    baton's shared memory then waits forever for the GIL, and the trainer
    never exits."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: B902 - a closed stream: nothing to flush
            pass
    if isinstance(error, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(1)


atexit.register(_shutdown_at_exit)


def _require():
    session = _session
    if session is None:
        raise ValueError("baton is not initialized: call baton.torch.init() first")
    return session


def size():
    """Number of ranks in the job."""
    return _require().size()


def rank():
    """This process's rank in the job (0 .. size()-1)."""
    return _require().rank()


def local_rank():
    """This process's rank among the job's processes on this node."""
    return _require().local_rank()


def local_size():
    """Number of the job's processes on this node."""
    return _require().local_size()


def _dtype_of(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("%s must be a torch.Tensor, not %s" % (what, type(tensor).__name__))
    if tensor.device.type != "cpu" and not _cuda.is_cuda(tensor):
        raise ValueError(
            "%s is on %s: baton takes CPU and CUDA tensors; move it with .cpu()"
            % (what, tensor.device)
        )
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(
            "%s has dtype %s; baton supports %s"
            % (what, tensor.dtype, ", ".join(str(d) for d in _DTYPES))
        )
    if dtype == _baton.INT16 and _cuda.is_cuda(tensor):
        raise ValueError("%s is an int16 CUDA tensor: NCCL has no int16; use a host tensor or int32" % what)
    return dtype


def _contiguous(tensor):
    """The tensor itself when dense, else a dense copy to write back from."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _register(operation, tensor, target, unnamed_key, slot=None, finish=None):
    global _next_handle
    with _lock:
        _next_handle += 1
        _pending[_next_handle] = _Pending(operation, tensor, target, unnamed_key, slot, finish)
        return _next_handle


def _unnamed_name(kind):
    """The name of an unnamed call of `kind` ("Allgather"),
    "<kind>.noname.<slot>", and the key that _release_unnamed frees: calls
    in flight together are matched across ranks by order (their slot)."""
    key = (kind,)
    with _lock:
        busy = _unnamed_busy.setdefault(key, set())
        slot = 0
        while slot in busy:
            slot += 1
        busy.add(slot)
    return "%s.noname.%d" % (kind, slot), (key, slot)


def _release_unnamed(unnamed_key):
    if unnamed_key is None:
        return
    key, slot = unnamed_key
    with _lock:
        _unnamed_busy.get(key, set()).discard(slot)


def _ranks_by(values):
    """"a on ranks {0,1}; b on ranks {2}": which ranks hold which value."""
    by = {}
    for rank, value in enumerate(values):
        by.setdefault(value, []).append(rank)
    return "; ".join("%s on ranks {%s}" % (v, ",".join(map(str, rs))) for v, rs in by.items())


# An unnamed tensor's descriptor: dtype code, on a CUDA device, dimensions,
# then the shape (TensorSpec allows 8 dimensions).
_UNNAMED_DESCRIPTOR = 3 + 8


def _agreed_unnamed_name(session, kind, what, tensor, dtype):
    """The name of an unnamed push-pull or broadcast (`kind`), and its key
    for _release_unnamed. Horovod matches unnamed calls by order, whatever
    their tensors, while baton's names stand for one dtype and shape. So
    the ranks first gather a descriptor of their tensors under the call's
    slot (baton.<kind>.noname.<slot>): where the tensors differ, every rank
    raises ValueError naming what differs and on which ranks, and the next
    call works; where they agree, the tensor is
    <kind>.noname[.cuda].<dtype>.<shape>.<slot>, which comes back every
    step. Name a tensor to skip this round."""
    if tensor.dim() > 8:
        raise ValueError("%s has %d dimensions; baton takes at most 8" % (what, tensor.dim()))
    slot_name, unnamed_key = _unnamed_name(kind)
    try:
        on_device = _cuda.is_cuda(tensor)
        shape = list(tensor.shape)
        descriptor = torch.tensor([dtype, int(on_device), len(shape)] + shape + [0] * (8 - len(shape)), dtype=torch.int64)
        gathered = torch.empty((session.size(), _UNNAMED_DESCRIPTOR), dtype=torch.int64)
        operation = session.allgather_async(
            "baton." + slot_name, descriptor.data_ptr(), _baton.INT64, [_UNNAMED_DESCRIPTOR], gathered.data_ptr()
        )
        synchronize(_register(operation, gathered, None, None))
        dtypes = {code: str(t).replace("torch.", "") for t, code in _DTYPES.items()}
        fields = (
            ("dtype", [dtypes.get(int(d[0]), int(d[0])) for d in gathered]),
            ("device", ["cuda" if d[1] else "cpu" for d in gathered]),
            ("shape", [str([int(x) for x in d[3 : 3 + int(d[2])]]) for d in gathered]),
        )
        for field, values in fields:
            if len(set(values)) > 1:
                raise ValueError(
                    "%s: the ranks' tensors differ in %s: %s (unnamed calls are matched by order)"
                    % (what, field, _ranks_by(values))
                )
    except BaseException:
        _release_unnamed(unnamed_key)
        raise
    return "%s.noname.%s%s.%s.%d" % (
        kind,
        "cuda." if on_device else "",
        str(tensor.dtype).replace("torch.", ""),
        "x".join(str(d) for d in shape) or "scalar",
        unnamed_key[1],
    ), unnamed_key


def push_pull_async(tensor, average=None, name=None, op=None, compression=None):
    """Starts the mean (average None or True) or sum (average=False) of
    `tensor` over all ranks into a new tensor and returns a handle for
    poll() and synchronize(), which returns that new tensor. `tensor` is
    left as it is (BytePS's push_pull_async; Horovod's allreduce_async).
    `op` (Average, Sum, Min, Max, Product, BitwiseAnd/Or/Xor) supersedes
    `average`, which must then be left None; every rank must pass the same
    op, or the operation fails on every rank naming both.

    `name` identifies the tensor across ranks; every rank must start the
    same names in the same order. A name may change its dtype, shape or
    device between operations (it is then declared anew on every rank), not
    while one of its operations is in flight. Without a name, calls in
    flight together are matched by order. The input is copied before this
    returns (a CUDA tensor's on the current stream), so `tensor` may be
    changed at once.

    `compression` (Horovod's and BytePS's compression=: Compression.fp16,
    .bf16, an instance of Compression.topk(k) or .onebit(), or a Horovod
    compressor) is what travels instead of the tensor: see
    baton.torch.compression.
    """
    return _start_push_pull(tensor, average, name, None, op, compression)


def _start_bool_push_pull(tensor, average, name, output, op, compression=None):
    """A bool tensor travels as its bytes (0 or 1): Sum and Max are any
    (logical or) and Min and Product all (logical and), as the bytes' max
    or min; a bool has no mean, and nothing to compress."""
    from baton.torch.compression import NoneCompressor

    if not (compression is None or compression is NoneCompressor or isinstance(compression, NoneCompressor)):
        raise ValueError(
            "push_pull of bool tensor %r: compression=%r does not apply to bools (one byte each); "
            "pass Compression.none" % (name, compression)
        )
    average, code = _resolve_op(average, op)
    if average or code not in (_baton.REDUCE_SUM, _baton.REDUCE_MAX, _baton.REDUCE_MIN, _baton.REDUCE_PRODUCT):
        raise ValueError(
            "push_pull of bool tensor %r: give op=Sum or Max (any rank's True), Min or Product (every "
            "rank's True); a bool has no mean" % (name,)
        )
    target = torch.empty_like(tensor) if output is None else output
    handle = _start_push_pull(
        tensor.view(torch.uint8), None, name, target.view(torch.uint8), Max if code in (_baton.REDUCE_SUM, _baton.REDUCE_MAX) else Min
    )
    with _lock:
        _pending[handle].finish = lambda _: target
    return handle


def push_pull_async_inplace(tensor, average=None, name=None, op=None, compression=None):
    """push_pull_async whose result goes into `tensor` itself when the
    handle is synchronized (BytePS's push_pull_async_inplace; Horovod's
    allreduce_async_); synchronize() returns `tensor`."""
    return _start_push_pull(tensor, average, name, tensor, op, compression)


def _start_push_pull(tensor, average, name, output, op=None, compression=None):
    """Starts the push-pull of `tensor` into `output`: `tensor` itself, a
    dense tensor shaped and typed like it, or None for a new one. A host
    result is written straight into a dense output (a non-contiguous
    `tensor` is copied back into at synchronize)."""
    if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bool:
        return _start_bool_push_pull(tensor, average, name, output, op, compression)
    if compression is not None:
        # compression builds on this module (onebit push-pulls a scale), so
        # it is imported here, not at the top.
        from baton.torch import compression as _compression

        handle = _compression.start(tensor, average, name, output, op, compression)
        if handle is not None:
            return handle
    session = _require()
    what = "push_pull tensor %r" % (name,) if name else "push_pull tensor"
    dtype = _dtype_of(tensor, what)
    average, op_code = _resolve_op(average, op)
    unnamed_key = None
    if name is None:
        name, unnamed_key = _agreed_unnamed_name(session, "PushPull", what, tensor, dtype)
    try:
        if output is None:
            output = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)
        if _cuda.is_cuda(tensor):
            return _start_on_device(
                session,
                name,
                tensor,
                dtype,
                _baton.PUSH_PULL,
                output,
                unnamed_key,
                average=average,
                op=op_code,
            )
        dense = _contiguous(tensor)
        result = dense if output is tensor else output
        operation = session.push_pull_async(
            name, dense.data_ptr(), dtype, list(dense.shape), average, result.data_ptr(), op_code
        )
    except BaseException:
        _release_unnamed(unnamed_key)
        raise
    return _register(operation, result, output if result is not output else None, unnamed_key)


def _push_pull_async_to(tensor, output, name, compression=None):
    """Averages `tensor` into `output` (dense, same shape and dtype), leaving
    `tensor` alone; for optimizers whose gradients stay the user's."""
    return _start_push_pull(tensor, True, name, output, None, compression)


def _register_compressed(operation):
    """A handle for a compressed push-pull (compression.CompressedOperation)."""
    global _next_handle
    with _lock:
        _next_handle += 1
        _compressed[_next_handle] = operation
        return _next_handle


def _synchronize_compressed(handle, operation, timeout):
    """Its result, decompressed; forgotten unless the wait timed out."""
    try:
        result = operation.synchronize(timeout)
    except TimeoutError:
        raise
    except BaseException:
        with _lock:
            _compressed.pop(handle, None)
        raise
    with _lock:
        _compressed.pop(handle, None)
    return result


def broadcast_async(tensor, root_rank, name=None):
    """Starts an in-place broadcast of root_rank's `tensor` to every rank.
    Without a name, broadcasts in flight together are matched by order."""
    if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bool:
        # Its bytes travel (the spec says uint8).
        handle = broadcast_async(tensor.view(torch.uint8), root_rank, name)
        with _lock:
            _pending[handle].finish = lambda _: tensor
        return handle
    session = _require()
    what = "broadcast tensor %r" % (name,) if name else "broadcast tensor"
    dtype = _dtype_of(tensor, what)
    unnamed_key = None
    if name is None:
        name, unnamed_key = _agreed_unnamed_name(session, "Broadcast", what, tensor, dtype)
    try:
        if _cuda.is_cuda(tensor):
            return _start_on_device(
                session, name, tensor, dtype, _baton.BROADCAST, tensor, unnamed_key, root_rank=int(root_rank)
            )
        dense = _contiguous(tensor)
        operation = session.broadcast_async(
            name, dense.data_ptr(), dtype, list(dense.shape), int(root_rank)
        )
    except BaseException:
        _release_unnamed(unnamed_key)
        raise
    return _register(operation, dense, tensor if dense is not tensor else None, unnamed_key)


def _device_slot(name, tensor, code):
    """The _DeviceSlot of CUDA tensor `name` used as `tensor` with
    collective `code`: the name's slot when it fits, else a new one (made
    on the name's first use, or when it is used on another device, dtype,
    shape or collective: then it is declared anew, as its next version,
    which needs the old one's operation synchronized). The agent has it once
    _declare succeeded."""
    with _lock:
        slot = _device_slots.get(name)
        if slot is not None and slot.fits(tensor, code):
            return slot
        if slot is not None and slot.busy:
            raise _in_flight(name)
    made = _DeviceSlot(tensor, code)
    with _lock:
        current = _device_slots.get(name)
        if current is not None and current.fits(tensor, code):
            return current  # another thread made it meanwhile
        if current is not None and current.busy:
            raise _in_flight(name)  # started meanwhile
        if current is not None and current.declared:
            _retired_slots.append(current)
        _device_slots[name] = made
    return made


def _forget_undeclared(names_and_slots):
    """Drops the slots of names whose declaration failed: nothing refers to
    them, and their staging memory goes back to torch."""
    with _lock:
        for name, slot in names_and_slots:
            if not slot.declared and _device_slots.get(name) is slot:
                del _device_slots[name]


def _declare(session, named_tensors, code):
    """Declares [(name, tensor)] with collective `code` in one round trip,
    CUDA tensors with their slots (made for new names). Names already
    declared alike cost nothing; differently, they are declared anew (their
    next version) unless an operation of theirs is in flight."""
    specs = []
    cuda_buffers = []
    slots = []
    try:
        for name, tensor in named_tensors:
            dtype = _dtype_of(tensor, "tensor %r" % (name,))
            if _cuda.is_cuda(tensor):
                slot = _device_slot(name, tensor, code)
                slots.append((name, slot))
                cuda_buffers.append((len(specs),) + slot.location)
                specs.append((name, dtype, list(tensor.shape), code, _baton.MEMORY_CUDA))
            else:
                specs.append((name, dtype, list(tensor.shape), code))
        session.declare(specs, cuda_buffers)
    except BaseException:
        _forget_undeclared(slots)
        raise
    for _, slot in slots:
        slot.declared = True


def _in_flight(name):
    error = ValueError(
        'tensor "%s" already has an operation in flight: synchronize it before '
        "starting the next one" % name
    )
    error.code = "FAILED_PRECONDITION"
    return error


def _start_on_device(
    session, name, tensor, dtype, code, destination, unnamed_key, average=False, root_rank=0, op=0
):
    """Starts a push-pull or broadcast of CUDA `tensor`: copies it into its
    slot's staging tensor (not on a broadcast's other ranks) and records the
    ready event on the current stream, then enqueues. synchronize() copies
    the result into `destination` (`tensor`, or an optimizer's output)."""
    slot = _device_slot(name, tensor, code)
    if not slot.declared:
        # Declares the name (anew, when its slot changed), or fails naming
        # why, before anything is written into the staging tensor.
        _declare(session, [(name, tensor)], code)
    with _lock:
        if slot.busy:
            raise _in_flight(name)
        slot.busy = True
    try:
        is_root = code == _baton.BROADCAST and session.rank() == root_rank
        stream = _cuda.current_stream(slot.device)
        if slot.stream is not None and slot.stream != stream:
            # The last copy into or out of the staging tensor ran on another
            # stream: neither this copy nor the agent may overwrite it first.
            _cuda.wait_stream(stream, slot.stream)
        slot.stream = stream
        if code == _baton.PUSH_PULL or is_root:
            with torch.no_grad():
                slot.staging.copy_(tensor)
        _cuda.record_event(slot.event, stream)
        memory_handle, offset, event_handle, pci_bus_id = slot.location
        if code == _baton.PUSH_PULL:
            operation = session.push_pull_device_async(
                name, dtype, list(tensor.shape), average, memory_handle, offset, event_handle, pci_bus_id, op
            )
        else:
            operation = session.broadcast_device_async(
                name, dtype, list(tensor.shape), root_rank, memory_handle, offset, event_handle, pci_bus_id
            )
    except BaseException:
        with _lock:
            slot.busy = False
        raise
    # The root's tensor already holds the result.
    if is_root:
        return _register(operation, None, tensor, unnamed_key, slot)
    return _register(operation, destination, destination, unnamed_key, slot)


def _deliver_on_device(pending):
    """After a completion: the result is in the staging tensor; copy it out
    on the current stream."""
    slot = pending.slot
    if pending.tensor is not None:
        stream = _cuda.current_stream(slot.device)
        with torch.no_grad():
            pending.tensor.copy_(slot.staging)
        slot.stream = stream
    return pending.target


def _take(handle):
    with _lock:
        pending = _pending.get(handle)
    if pending is None:
        raise ValueError(
            "unknown baton handle %r: it was synchronized already or never "
            "returned by push_pull_async" % (handle,)
        )
    return pending


class _Group:
    """The handles of one grouped_allreduce_async, in the tensors' order,
    and the results synchronized so far (a timeout leaves the rest in
    flight)."""

    __slots__ = ("handles", "results", "failure")

    def __init__(self, handles):
        self.handles = handles
        self.results = []
        self.failure = None  # the first member's failure, raised at the end


def _start_group(tensors, average, name, op, inplace, compression=None):
    """Starts one push-pull per tensor, after checking them all (nothing
    starts when one is refused here), and returns the group's handle."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError("grouped_allreduce takes a non-empty list of tensors, not %r" % (type(tensors),))
    for i, tensor in enumerate(tensors):
        _dtype_of(tensor, "grouped_allreduce tensor %d" % i)
    _resolve_op(average, op)
    handles = []
    try:
        for i, tensor in enumerate(tensors):
            member = None if name is None else "%s.%d" % (name, i)
            start = push_pull_async_inplace if inplace else push_pull_async
            handles.append(start(tensor, average, member, op, compression))
    except BaseException:
        # Started ones run on; their results are dropped.
        for handle in handles:
            try:
                synchronize(handle)
            except Exception:
                pass
        raise
    global _next_handle
    with _lock:
        _next_handle += 1
        _groups[_next_handle] = _Group(handles)
        return _next_handle


def grouped_allreduce_async(tensors, average=None, name=None, op=None, compression=None):
    """Horovod's grouped_allreduce_async: starts the push-pull of every
    tensor in `tensors` (out of place, as push_pull_async) as one group and
    returns one handle; synchronize() returns the list of new tensors, in
    order. `name` names the group (tensor i is "<name>.<i>"); without it,
    calls are matched by order, as unnamed push_pulls are. `average`, `op`
    and `compression` as for push_pull, for every tensor."""
    return _start_group(tensors, average, name, op, inplace=False, compression=compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, compression=None):
    """grouped_allreduce_async in place: synchronize() writes each result
    into its tensor and returns `tensors` as a list."""
    return _start_group(tensors, average, name, op, inplace=True, compression=compression)


def grouped_allreduce(tensors, average=None, name=None, op=None, compression=None):
    """Horovod's grouped_allreduce: the list of new tensors holding each
    tensor's mean, sum or `op` over all ranks."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, compression=None):
    """Horovod's grouped_allreduce_: every tensor in place; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, compression))


def barrier(timeout=None):
    """Horovod's barrier(): returns once every rank of the job called it (a
    one-element push-pull named "baton.barrier"). TimeoutError after
    `timeout` seconds (the barrier stays in flight: call synchronize on
    nothing; the next barrier() waits for it first), BatonError when the
    job's generation ends meanwhile (a lost node), as every operation."""
    global _barrier_handle
    if _barrier_handle is None:
        _barrier_handle = push_pull_async(torch.ones(1, dtype=torch.int32), False, "baton.barrier")
    count = synchronize(_barrier_handle, timeout)
    _barrier_handle = None
    if int(count[0]) != size():
        raise BatonError("barrier counted %d ranks in a job of %d" % (int(count[0]), size()))


_barrier_handle = None


def poll(handle):
    """True when the operation finished (synchronize() then returns at once)."""
    with _lock:
        group = _groups.get(handle)
        compressed = _compressed.get(handle)
    if group is not None:
        return all(poll(h) for h in group.handles[len(group.results) :])
    if compressed is not None:
        return compressed.poll()
    return _require().poll(_take(handle).operation)


def synchronize(handle, timeout=None):
    """Waits for the operation and returns the tensor holding its result:
    the new tensor of push_pull_async, the tensor given to
    push_pull_async_inplace or broadcast_async.

    Raises TimeoutError after `timeout` seconds, and KeyboardInterrupt
    within 0.1 s of Ctrl-C (either way the operation stays in flight:
    synchronize it again, or shutdown abandons it), and BatonError naming
    the cause when the operation failed (a lost node: code ABORTED; the
    agent gone: UNAVAILABLE). A grouped handle returns the list of results;
    when one of its operations failed, the others are still synchronized
    before the first failure is raised."""
    with _lock:
        group = _groups.get(handle)
        compressed = _compressed.get(handle)
    if group is not None:
        return _synchronize_group(handle, group, timeout)
    if compressed is not None:
        return _synchronize_compressed(handle, compressed, timeout)
    session = _require()
    pending = _take(handle)
    try:
        session.synchronize(pending.operation, 86400.0 if timeout is None else float(timeout))
    except TimeoutError:
        raise
    except BaseException:
        _forget(handle, pending)
        raise
    if pending.slot is not None:
        try:
            return _deliver_on_device(pending)
        finally:
            _forget(handle, pending)
    _forget(handle, pending)
    result = pending.tensor
    if pending.target is not None:
        with torch.no_grad():
            pending.target.copy_(pending.tensor)
        result = pending.target
    return result if pending.finish is None else pending.finish(result)


def _synchronize_group(handle, group, timeout):
    """Synchronizes the members in order; a TimeoutError leaves the group
    (and a member's failure seen so far) for the next call."""
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    while len(group.results) < len(group.handles):
        member = group.handles[len(group.results)]
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            group.results.append(synchronize(member, left))
        except TimeoutError:
            raise
        except Exception as e:  # noqa: BLE001 - raised once all are done
            if group.failure is None:
                group.failure = e
            group.results.append(None)
    with _lock:
        _groups.pop(handle, None)
    if group.failure is not None:
        raise group.failure
    return list(group.results)


def _forget(handle, pending):
    with _lock:
        _pending.pop(handle, None)
        if pending.slot is not None:
            pending.slot.busy = False
    _release_unnamed(pending.unnamed_key)


def push_pull(tensor, average=None, name=None, op=None, compression=None):
    """push_pull_async + synchronize: returns a new tensor holding the mean,
    sum or `op` over all ranks; `tensor` is left as it is."""
    return synchronize(push_pull_async(tensor, average, name, op, compression))


def push_pull_inplace(tensor, average=None, name=None, op=None, compression=None):
    """push_pull_async_inplace + synchronize: `tensor` holds the mean, sum
    or `op` over all ranks, and is returned."""
    return synchronize(push_pull_async_inplace(tensor, average, name, op, compression))


def broadcast(tensor, root_rank, name=None):
    """broadcast_async + synchronize: `tensor` holds root_rank's values."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def declare(name, tensor, op="push_pull"):
    """Declares a tensor ahead of its first use. Declaration order is the
    default priority (first declared = first needed by the forward pass)."""
    declare_many([(name, tensor)], op)


def declare_many(named_tensors, op="push_pull"):
    """Declares [(name, tensor)] in order, in one round trip. CUDA tensors
    get their staging tensors here (one extra copy of each on its device)."""
    session = _require()
    code = {"push_pull": _baton.PUSH_PULL, "broadcast": _baton.BROADCAST}.get(op)
    if code is None:
        raise ValueError("op must be 'push_pull' or 'broadcast', not %r" % (op,))
    _declare(session, list(named_tensors), code)


def _shared_views(name, owner):
    """(input, result): tensors shaped and typed like `owner` over declared
    host tensor `name`'s shared memory on this node, or None (a CUDA or
    empty tensor, or a name whose memory another live tensor already owns:
    two models with the same parameter names must not share gradients). A
    push-pull of the input view copies nothing in; one into the result view
    copies nothing out. The views keep the session's mapping alive."""
    if _cuda.is_cuda(owner) or owner.numel() == 0:
        return None
    with _lock:
        current = _shared_owners.get(name)
        current = current() if current is not None else None
        if current is not None and current is not owner:
            return None
        _shared_owners[name] = weakref.ref(owner)
    regions = _require().host_regions(name)
    return tuple(
        torch.frombuffer(region, dtype=torch.uint8).view(owner.dtype).view(owner.shape)
        for region in regions
    )


def _release_shared(name, owner):
    """`owner` no longer uses `name`'s shared memory (its optimizer closed)."""
    with _lock:
        current = _shared_owners.get(name)
        if current is not None and current() is owner:
            del _shared_owners[name]


def broadcast_parameters(params, root_rank):
    """Makes every rank hold root_rank's values of `params`, exactly.

    `params` is a dict (e.g. model.state_dict(); broadcast in
    sorted(params.items()) order) or a list of tensors or (name, tensor)
    tuples (e.g. model.named_parameters()).
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    named = []
    for index, (name, tensor) in enumerate(params):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                "broadcast_parameters: entry %r is a %s, not a torch.Tensor"
                % (name if name is not None else index, type(tensor).__name__)
            )
        if name is None:
            shape = "x".join(str(d) for d in tensor.shape) or "scalar"
            name = "unnamed.%d.%s.%s" % (index, str(tensor.dtype).replace("torch.", ""), shape)
        named.append(("Parameter." + str(name), tensor))
    if not named:
        return
    declare_many([(n, t) for n, t in named], op="broadcast")
    handles = []
    try:
        with torch.no_grad():
            for name, tensor in named:
                handles.append(broadcast_async(tensor.data if tensor.requires_grad else tensor, root_rank, name))
    finally:
        # Everything started is finished before returning, even after an
        # error, so nothing is written behind the caller's back.
        errors = []
        for handle in handles:
            try:
                synchronize(handle)
            except BaseException as e:  # noqa: B902 - re-raised below
                errors.append(e)
        if errors:
            raise errors[0]


def broadcast_object(obj, root_rank=0, name=None):
    """Returns root_rank's `obj` on every rank (Horovod's broadcast_object):
    it travels pickled (torch.save, so tensors inside keep their dtype and
    bytes exactly); every rank must call it with the same `name` (default
    "Object"), in the same order as its other operations."""
    name = "Object" if name is None else str(name)
    is_root = rank() == root_rank
    payload = None
    if is_root:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([payload.numel() if is_root else 0], dtype=torch.int64)
    broadcast(length, root_rank, name + ".bytes")
    n = int(length.item())
    # A name per size: a name keeps its shape while an operation of it runs.
    data = payload if is_root else torch.empty(n, dtype=torch.uint8)
    broadcast(data, root_rank, "%s.%d" % (name, n))
    if is_root:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()))


def _abandon_in_flight(timeout):
    """Waits (at most `timeout` seconds in all) for every operation this
    process started and has not synchronized, whatever its outcome: after a
    re-form they fail at once (ABORTED). TimeoutError when one is still
    running at the deadline."""
    deadline = time.monotonic() + timeout
    with _lock:
        # Compressed ones first: each synchronizes its own push-pulls.
        handles = list(_compressed) + list(_pending)
    for handle in handles:
        try:
            synchronize(handle, max(0.0, deadline - time.monotonic()))
        except BatonError:
            pass  # failed; synchronize forgot it
        except ValueError:
            pass  # another thread synchronized it meanwhile


def broadcast_optimizer_state(optimizer, root_rank):
    """Makes every rank's optimizer state (per-parameter state such as
    momentum buffers and Adam moments, and every param group's
    hyperparameters) equal root_rank's, exactly.

    The state travels serialized (torch.save), so any optimizer and any
    state layout work; every rank's optimizer must hold the same parameters
    in the same groups.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state: it keeps closures")
    inner = getattr(optimizer, "optimizer", optimizer)
    is_root = rank() == root_rank
    state = broadcast_object(inner.state_dict() if is_root else None, root_rank, "OptimizerState")
    if not is_root:
        inner.load_state_dict(state)


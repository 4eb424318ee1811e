"""Horovod's PyTorch API (horovod.torch) on baton:

    import baton.compat.horovod.torch as hvd    # was: import horovod.torch as hvd

The names, argument orders and defaults are Horovod's, and so are the
semantics: allreduce, allgather and broadcast return new tensors (and are
differentiable), the _ forms work in place, op defaults to Average. Each
function names baton.torch's own; what baton lacks (Adasum, process sets
other than the global one, join, ...) raises
NotSupportedError naming it. docs/api.md lists the remaining differences.
"""

import warnings

import baton.torch as bt
from baton._baton import BatonError
from baton.torch import (  # noqa: F401 - Horovod's names, baton's functions
    broadcast_parameters,
    is_initialized,
    local_rank,
    local_size,
    poll,
    rank,
    shutdown,
    size,
    synchronize,
)
from baton.compat import _built
from baton.compat._common import (  # noqa: F401 - NotSupportedError: hvd.NotSupportedError
    Allgather,
    Alltoall,
    Broadcast,
    NotSupportedError,
    PushPull,
    not_supported,
    scaled,
    unsupported,
)

# Horovod's error for a failed collective; its elastic mode catches it.
HorovodInternalError = BatonError

Average, Sum, Min, Max, Product = bt.Average, bt.Sum, bt.Min, bt.Max, bt.Product
Compression = bt.Compression


class _Adasum(object):
    def __repr__(self):
        return "hvd.Adasum"


Adasum = _Adasum()



def init(comm=None, process_sets=None):
    """Joins the job (bt.init). `comm` (an MPI communicator) and
    `process_sets` are not supported: baton has no MPI and no process sets
    yet."""
    if comm is not None:
        not_supported("hvd.init(comm=...)", "baton starts without MPI; every trainer of the job takes part")
    if process_sets:
        _no_process_sets("hvd.init(process_sets=...)")
    bt.init()


# --- what this build of baton is ---


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    """True: every baton agent links gloo (--data_transport=gloo)."""
    return True


def gloo_enabled():
    """False: baton's own coordinator runs the job, not a gloo controller
    (gloo may still carry the agents' data: --data_transport=gloo)."""
    return False


def nccl_built():
    """NCCL_VERSION_CODE of the NCCL this build's agent links for CUDA
    tensors, or 0 (Horovod's convention)."""
    return _built.NCCL_VERSION_CODE


def cuda_built():
    """Whether this build's agent has its CUDA transport (CUDA tensors)."""
    return _built.NCCL_VERSION_CODE != 0


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cross_size():
    """The job's node count. baton's nodes run the same number of trainers
    each (batonrun --procs-per-node), which this assumes."""
    return bt.size() // bt.local_size()


def cross_rank():
    """This node's rank among the job's nodes (ranks are node offset +
    local_rank, with the same trainer count on every node)."""
    return bt.rank() // bt.local_size()


# --- process sets: only the global one ---


def _no_process_sets(what):
    not_supported(what, "baton has no process sets yet: every collective spans the whole job")


class ProcessSet(object):
    """Horovod's process set. Only the global one (every rank) exists in
    baton; making one is allowed, using it raises NotSupportedError."""

    def __init__(self, ranks_or_comm):
        self.ranks = ranks_or_comm

    def size(self):
        return bt.size() if self is global_process_set else _no_process_sets("ProcessSet.size()")

    def rank(self):
        return bt.rank() if self is global_process_set else _no_process_sets("ProcessSet.rank()")

    def included(self):
        return True if self is global_process_set else _no_process_sets("ProcessSet.included()")

    def __repr__(self):
        return "ProcessSet(global)" if self is global_process_set else "ProcessSet(%r)" % (self.ranks,)


global_process_set = ProcessSet(None)


def add_process_set(process_set):
    _no_process_sets("hvd.add_process_set")


def remove_process_set(process_set):
    _no_process_sets("hvd.remove_process_set")


def _global(process_set, what):
    if process_set is not global_process_set:
        _no_process_sets("%s(process_set=%r)" % (what, process_set))


def _op(op):
    if op is Adasum:
        not_supported("op=hvd.Adasum", "use op=hvd.Average (Adasum's adaptive summation is not implemented)")
    return op


def _scaling(prescale_factor, postscale_factor):
    return scaled(None, prescale_factor, postscale_factor)


# --- allreduce ---


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """A new tensor: the mean (op None or Average), or `op`, of `tensor`
    over every rank; `tensor` is unchanged. Differentiable."""
    _global(process_set, "hvd.allreduce")
    scaling = _scaling(prescale_factor, postscale_factor)
    return PushPull.apply(
        tensor, average, name, _op(op), scaled(compression, prescale_factor, postscale_factor), scaling
    )


def _allreduce_form(start, what, doc):
    """Horovod's allreduce form `what` (no compression argument) on baton's
    `start`, with Horovod's arguments."""

    def form(
        tensor=None,
        average=None,
        name=None,
        op=None,
        prescale_factor=1.0,
        postscale_factor=1.0,
        process_set=global_process_set,
        tensors=None,
    ):
        # The grouped forms' first argument is `tensors` in Horovod.
        _global(process_set, what)
        data = tensor if tensors is None else tensors
        return start(data, average, name, _op(op), _scaling(prescale_factor, postscale_factor))

    form.__name__ = what[len("hvd.") :]
    form.__doc__ = doc
    return form


allreduce_async = _allreduce_form(
    bt.push_pull_async, "hvd.allreduce_async", "Starts allreduce; synchronize(handle) returns the new tensor."
)
allreduce_ = _allreduce_form(
    bt.push_pull_inplace, "hvd.allreduce_", "allreduce in place: `tensor` becomes the result and is returned."
)
allreduce_async_ = _allreduce_form(
    bt.push_pull_async_inplace, "hvd.allreduce_async_", "Starts allreduce_; synchronize(handle) writes `tensor`."
)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
):
    """The list of new tensors holding each tensor's mean or `op`."""
    _global(process_set, "hvd.grouped_allreduce")
    return bt.grouped_allreduce(
        tensors, average, name, _op(op), scaled(compression, prescale_factor, postscale_factor)
    )


grouped_allreduce_async = _allreduce_form(
    bt.grouped_allreduce_async,
    "hvd.grouped_allreduce_async",
    "Starts grouped_allreduce; synchronize(handle) returns the list of new tensors.",
)
grouped_allreduce_ = _allreduce_form(
    bt.grouped_allreduce_, "hvd.grouped_allreduce_", "grouped_allreduce in place; returns the tensors."
)
grouped_allreduce_async_ = _allreduce_form(
    bt.grouped_allreduce_async_,
    "hvd.grouped_allreduce_async_",
    "Starts grouped_allreduce_; synchronize(handle) writes the tensors.",
)


# --- allgather ---


def allgather(tensor, name=None, process_set=global_process_set):
    """A new tensor: every rank's `tensor` concatenated along the first
    dimension in rank order (which may differ per rank). Differentiable."""
    _global(process_set, "hvd.allgather")
    return Allgather.apply(tensor, name)


def allgather_async(tensor, name=None, process_set=global_process_set):
    _global(process_set, "hvd.allgather_async")
    return bt.allgather_async(tensor, name)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj`, as a list in rank order."""
    _global(process_set, "hvd.allgather_object")
    return bt.allgather_object(obj, name)


# --- alltoall ---


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """`tensor`'s rows scattered to the ranks (`splits` rows each, in rank
    order; equal parts without splits) and the rows every rank sent here,
    concatenated in rank order. With `splits`: (tensor, received_splits).
    Differentiable."""
    _global(process_set, "hvd.alltoall")
    if splits is None:
        if tensor.dim() == 0 or tensor.shape[0] % size():
            return bt.alltoall(tensor, name=name)  # raises on every rank, naming why
        output, _ = Alltoall.apply(tensor, [tensor.shape[0] // size()] * size(), name)
        return output
    return Alltoall.apply(tensor, splits, name)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts alltoall; synchronize(handle) returns what alltoall does."""
    _global(process_set, "hvd.alltoall_async")
    return bt.alltoall_async(tensor, splits, name)


# --- reducescatter ---


def reducescatter(tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's part of `tensor` reduced over every rank (the mean by
    default), split along the first dimension, the first ranks taking one
    row more. Not differentiable (Horovod's is)."""
    _global(process_set, "hvd.reducescatter")
    scaling = _scaling(prescale_factor, postscale_factor)
    if scaling is None:
        return bt.reducescatter(tensor, _op(op), name)
    payload, ctx = scaling.compress(tensor)
    return scaling.decompress(bt.reducescatter(payload, _op(op), name), ctx)


def reducescatter_async(tensor, op=None, name=None, process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescatter; synchronize(handle) returns this rank's part
    (postscale_factor is not applied: pass it as prescale_factor)."""
    _global(process_set, "hvd.reducescatter_async")
    if postscale_factor != 1.0:
        raise ValueError("hvd.reducescatter_async: give the factor as prescale_factor (the same result for a sum or mean)")
    scaling = _scaling(prescale_factor, 1.0)
    payload = tensor if scaling is None else scaling.compress(tensor)[0]
    return bt.reducescatter_async(payload, _op(op), name)


# --- broadcast ---


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's `tensor`; `tensor` is unchanged.
    Differentiable."""
    _global(process_set, "hvd.broadcast")
    return Broadcast.apply(tensor, root_rank, name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcast; synchronize(handle) returns the new tensor."""
    _global(process_set, "hvd.broadcast_async")
    return bt.broadcast_async(tensor.detach().clone(), root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place: `tensor` becomes root_rank's values and is returned."""
    _global(process_set, "hvd.broadcast_")
    return bt.broadcast(tensor, root_rank, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _global(process_set, "hvd.broadcast_async_")
    return bt.broadcast_async(tensor, root_rank, name)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` on every rank (pickled)."""
    _global(process_set, "hvd.broadcast_object")
    return bt.broadcast_object(obj, root_rank, name)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Every rank's optimizer state becomes root_rank's, exactly. `model`
    is not needed: the whole state_dict travels."""
    return bt.broadcast_optimizer_state(optimizer, root_rank)


def barrier(process_set=global_process_set):
    _global(process_set, "hvd.barrier")
    bt.barrier()


# --- the optimizer ---


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=global_process_set,
):
    """bt.DistributedOptimizer with Horovod's arguments. Gradients are
    averaged (op=Average; Sum, Adasum and the others are not supported);
    gradient_predivide_factor f divides each gradient by f before the sum
    and multiplies the mean by f after it, as Horovod's. `groups` and
    `num_groups` are checked as Horovod checks them; baton's agents fuse
    small tensors on their own. A sparse gradient is averaged dense
    (sparse_as_dense=True or not) and p.grad stays dense."""
    _global(process_set, "hvd.DistributedOptimizer")
    _op(op)
    if op is not Average:
        not_supported(
            "hvd.DistributedOptimizer(op=%r)" % (op,),
            "baton's DistributedOptimizer averages the gradients: pass op=hvd.Average",
        )
    if gradient_predivide_factor != 1.0:
        compression = scaled(compression, 1.0 / gradient_predivide_factor, gradient_predivide_factor)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`", DeprecationWarning)
        groups = num_groups if groups is None else groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    return bt.DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step)


# --- what baton does not have ---

join = unsupported(
    "hvd.join", "ranks with uneven data must run the same number of steps (or allreduce a 'done' flag each step)"
)
grouped_reducescatter = unsupported("hvd.grouped_reducescatter", "not in baton yet (issue 33)")
grouped_reducescatter_async = unsupported("hvd.grouped_reducescatter_async", "not in baton yet (issue 33)")
grouped_allgather = unsupported("hvd.grouped_allgather", "call hvd.allgather_async per tensor")
grouped_allgather_async = unsupported("hvd.grouped_allgather_async", "call hvd.allgather_async per tensor")
sparse_allreduce_async = unsupported(
    "hvd.sparse_allreduce_async", "allreduce grad.to_dense() (DistributedOptimizer does so itself)"
)
SyncBatchNorm = bt.SyncBatchNorm
start_timeline = unsupported("hvd.start_timeline", "`batonctl timeline JOB -o trace.json` records every job's timeline")
stop_timeline = unsupported("hvd.stop_timeline", "`batonctl timeline JOB -o trace.json` records every job's timeline")

from baton.compat.horovod.torch import elastic  # noqa: E402,F401 - hvd.elastic, as in Horovod


"""Horovod's gathering collectives on baton: allgather (whose tensors'
first dimension may differ per rank), allgather_object, reducescatter and
alltoall (with splits). baton.torch exports them; like the package's other
modules this one imports _core, never the package.

An allgather takes two rounds. First every rank gathers a small
descriptor of its tensor (rows, dtype, the other dimensions, and the
capacity it knows for the name), so that every rank sees the same facts:
a disagreement raises the same error on every rank before any data moves,
and every rank picks the same padded shape. Then the agents gather the
data, each rank's rows padded to that shape (none when the ranks have
equal rows, the usual case), and synchronize() cuts the padding out.
"""

import io
import numbers

import torch

from baton import _baton
from baton.torch import _core, _cuda

__all__ = [
    "allgather",
    "allgather_async",
    "allgather_object",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
]

# The descriptor: rows, dtype code, dimensions, capacity, then the
# dimensions after the first (TensorSpec allows 8 in all).
_ROWS, _DTYPE, _NDIM, _CAPACITY, _DIMS = 0, 1, 2, 3, 4
_MAX_DIMS = 8
_DESCRIPTOR = _DIMS + _MAX_DIMS - 1

# Name -> the padded rows its last ragged allgather was declared with, so
# that sizes moving about within a factor of four do not declare the name
# anew each time. Every rank reports its own in the descriptor and all take
# the largest, so a rank that joined later agrees with the others.
_capacity = {}


def _padded_rows(rows, capacity):
    """Rows each rank sends: exactly the rows when all ranks have as many;
    otherwise the agreed capacity while it holds the largest and is under
    four times it, else the next power of two."""
    need = max(rows)
    if min(rows) == need:
        return need
    if need <= capacity < 4 * max(need, 1):
        return capacity
    return 1 << max(need - 1, 0).bit_length()


def _describe(tensor, dtype, capacity):
    descriptor = torch.zeros(_DESCRIPTOR, dtype=torch.int64)
    descriptor[_ROWS] = tensor.shape[0]
    descriptor[_DTYPE] = dtype
    descriptor[_NDIM] = tensor.dim()
    descriptor[_CAPACITY] = capacity
    for i, d in enumerate(tensor.shape[1:]):
        descriptor[_DIMS + i] = d
    return descriptor


def _exchange_descriptors(session, name, host, dtype, capacity=0, extra=(), timeout=None):
    """Every rank's descriptor of its tensor, rank after rank (the first
    round of an allgather, a reduce-scatter or an alltoall, named
    baton.<name>), each followed by its `extra` integers (an alltoall's
    splits), which every rank gives as many of. TimeoutError after
    `timeout` seconds (None: the agents' operation timeout bounds it)."""
    descriptor = torch.cat([_describe(host, dtype, capacity), torch.tensor(list(extra), dtype=torch.int64)])
    width = descriptor.numel()
    gathered = torch.empty((session.size(), width), dtype=torch.int64)
    meta = session.allgather_async(
        "baton." + name, descriptor.data_ptr(), _baton.INT64, [width], gathered.data_ptr()
    )
    _core.synchronize(_core._register(meta, gathered, None, None), timeout)
    return gathered


def _disagreement(what, name, gathered, rows_may_differ):
    """The error every rank raises when the ranks' tensors do not fit
    together (each rank holds the same descriptors), or None."""
    dtypes = {code: str(t).replace("torch.", "") for t, code in _core._DTYPES.items()}
    ranks_by = _core._ranks_by

    codes = [int(d[_DTYPE]) for d in gathered]
    if len(set(codes)) > 1:
        return "%s of %r: the ranks' tensors differ in dtype: %s" % (
            what,
            name,
            ranks_by([dtypes.get(c, c) for c in codes]),
        )
    trailing = [tuple(int(x) for x in d[_DIMS : _DIMS + int(d[_NDIM]) - 1]) for d in gathered]
    if len(set(trailing)) > 1:
        return "%s of %r: the ranks' tensors differ after the first dimension%s: %s" % (
            what,
            name,
            " (only the first may differ)" if rows_may_differ else "",
            ranks_by(["[*, %s]" % ", ".join(map(str, t)) for t in trailing]),
        )
    rows = [int(d[_ROWS]) for d in gathered]
    if not rows_may_differ and len(set(rows)) > 1:
        return "%s of %r: the ranks' tensors differ in the first dimension: %s" % (
            what,
            name,
            ranks_by(rows),
        )
    return None


def _ranks_text(ranks):
    return "{%s}" % ",".join(str(r) for r in ranks)


def allgather_async(tensor, name=None):
    """Starts the gathering of `tensor` from every rank, concatenated along
    the first dimension in rank order (Horovod's allgather_async), and
    returns a handle for poll() and synchronize(), which returns the new
    tensor. The ranks' tensors may differ in their first dimension only;
    otherwise every rank raises ValueError naming what differs and on which
    ranks, and nothing is gathered. `name` identifies the call across ranks
    (without one, calls are matched by order). The input is copied before
    this returns. A CUDA tensor is gathered through a host copy, and the
    result is returned on its device."""
    session = _core._require()
    dtype, host, device = _host_copy(tensor, "allgather tensor %r" % (name,) if name else "allgather tensor")
    unnamed_key = None
    if name is None:
        name, unnamed_key = _core._unnamed_name("Allgather")
    try:
        world = session.size()
        gathered = _exchange_descriptors(session, "allgather." + name, host, dtype, _capacity.get(name, 0))
        problem = _disagreement("allgather", name, gathered, rows_may_differ=True)
        if problem is not None:
            raise ValueError(problem)
        rows = [int(r) for r in gathered[:, _ROWS]]
        padded = _padded_rows(rows, max(int(c) for c in gathered[:, _CAPACITY]))
        if min(rows) != max(rows):
            _capacity[name] = padded
        rest = tuple(host.shape[1:])
        source = host
        if host.shape[0] != padded:
            source = torch.zeros((padded,) + rest, dtype=host.dtype)
            source[: host.shape[0]] = host
        output = torch.empty((world, padded) + rest, dtype=host.dtype)
        operation = session.allgather_async(
            name, source.data_ptr(), dtype, [padded] + list(rest), output.data_ptr()
        )
    except BaseException:
        _core._release_unnamed(unnamed_key)
        raise

    def finish(result):
        if all(r == padded for r in rows):
            result = result.reshape((world * padded,) + rest)
        else:
            result = torch.cat([result[r, :n] for r, n in enumerate(rows)])
        return result if device is None else result.to(device)

    return _core._register(operation, output, None, unnamed_key, finish=finish)


def _host_copy(tensor, label):
    """(dtype code, dense host tensor, the CUDA device to return to or
    None) of an allgather's or reduce-scatter's input."""
    dtype = _core._dtype_of(tensor, label)
    if tensor.dim() == 0:
        raise ValueError("%s is a scalar: it is split or joined along its first dimension; pass tensor.reshape(1)" % label)
    if tensor.dim() > _MAX_DIMS:
        raise ValueError("%s has %d dimensions; baton takes at most %d" % (label, tensor.dim(), _MAX_DIMS))
    device = tensor.device if _cuda.is_cuda(tensor) else None
    host = _core._contiguous(tensor.detach().cpu() if device is not None else tensor.detach())
    return dtype, host, device


def allgather(tensor, name=None):
    """allgather_async + synchronize: a new tensor holding every rank's
    `tensor`, concatenated along the first dimension in rank order
    (Horovod's allgather)."""
    return _core.synchronize(allgather_async(tensor, name))


def allgather_object(obj, name=None):
    """Every rank's `obj`, as a list in rank order (Horovod's
    allgather_object): each travels pickled with torch.save, so tensors
    inside keep their dtype and bytes exactly. Every rank calls it with
    the same `name` (default "Object.allgather"), in the same order as its
    other operations."""
    name = "Object.allgather" if name is None else str(name)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name + ".bytes")
    data = allgather(payload, name)
    objects, at = [], 0
    for n in sizes.tolist():
        objects.append(torch.load(io.BytesIO(data[at : at + n].numpy().tobytes())))
        at += n
    return objects


def reducescatter_async(tensor, op=None, name=None, average=None):
    """Starts Horovod's reducescatter: `tensor` (the same dtype and shape on
    every rank) is reduced over all ranks (the mean by default; `op` and
    `average` as for push_pull) and split along its first dimension, the
    first ranks taking one row more where it does not divide evenly; this
    rank's part comes back from synchronize() as a new tensor. Ranks whose
    tensors differ raise ValueError on every rank naming what differs.
    `name` identifies the call across ranks (without one, calls are matched
    by order). The input is copied before this returns; a CUDA tensor goes
    through a host copy and its part is returned on its device."""
    session = _core._require()
    dtype, host, device = _host_copy(tensor, "reducescatter tensor %r" % (name,) if name else "reducescatter tensor")
    average, op_code = _core._resolve_op(average, op)
    unnamed_key = None
    if name is None:
        name, unnamed_key = _core._unnamed_name("ReduceScatter")
    try:
        world, rank = session.size(), session.rank()
        gathered = _exchange_descriptors(session, "reducescatter." + name, host, dtype)
        problem = _disagreement("reducescatter", name, gathered, rows_may_differ=False)
        if problem is not None:
            raise ValueError(problem)
        rows, rest = host.shape[0], tuple(host.shape[1:])
        counts = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
        part = counts[0]
        source = host
        if rows % world:
            # Each rank's rows at the start of its equal slot; the padding
            # is cut off again at synchronize.
            source = torch.zeros((world * part,) + rest, dtype=host.dtype)
            begin = 0
            for r, n in enumerate(counts):
                source[r * part : r * part + n] = host[begin : begin + n]
                begin += n
        output = torch.empty((part,) + rest, dtype=host.dtype)
        operation = session.reduce_scatter_async(
            name, source.data_ptr(), dtype, [world * part] + list(rest), output.data_ptr(), average, op_code
        )
    except BaseException:
        _core._release_unnamed(unnamed_key)
        raise
    mine = counts[rank]

    def finish(result):
        result = result[:mine]
        return result if device is None else result.to(device)

    return _core._register(operation, output, None, unnamed_key, finish=finish)


def reducescatter(tensor, op=None, name=None, average=None):
    """reducescatter_async + synchronize: this rank's part of `tensor`
    reduced over all ranks (Horovod's reducescatter)."""
    return _core.synchronize(reducescatter_async(tensor, op, name, average))


def _own_splits(splits, rows, world, label):
    """(this rank's splits as a list, None) or (None, what is wrong with
    them): `splits` has one non-negative integer per rank adding up to the
    rows; without splits the rows divide evenly among the ranks."""
    if splits is None:
        if rows % world:
            return None, "%s has %d rows, which do not split evenly among %d ranks: pass splits=" % (label, rows, world)
        return [rows // world] * world, None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.dtype.is_complex:
            return None, "%s: splits is a %s tensor of shape %s; give a 1-D integer tensor or a list" % (
                label,
                str(splits.dtype).replace("torch.", ""),
                list(splits.shape),
            )
        splits = splits.tolist()
    try:
        values = list(splits)
    except TypeError:
        values = None
    if values is None or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in values):
        return None, "%s: splits %r are not a list of integers" % (label, splits)
    values = [int(v) for v in values]
    if len(values) != world:
        return None, "%s: %d splits for %d ranks; give one per rank" % (label, len(values), world)
    if any(v < 0 for v in values):
        return None, "%s: splits %s include a negative count" % (label, values)
    if sum(values) != rows:
        return None, "%s: splits %s add up to %d, but the tensor has %d rows" % (label, values, sum(values), rows)
    return values, None


def alltoall_async(tensor, splits=None, name=None):
    """Starts Horovod's alltoall: `tensor` is cut along its first dimension
    into one part per rank (`splits` rows each, in rank order; without
    splits, equal parts), part d goes to rank d, and synchronize() returns
    the parts this rank received, concatenated in rank order, as a new
    tensor; with `splits` given, it returns (tensor, received_splits), the
    rows received from each rank as an int64 tensor. The ranks' tensors
    must agree in dtype and in every dimension after the first; splits that
    do not fit their tensor, or ranks that differ, make every rank raise
    ValueError naming the ranks and what differs, and nothing is sent.
    `name` identifies the call across ranks (without one, calls are matched
    by order). The input is copied before this returns; a CUDA tensor goes
    through a host copy and the result is returned on its device."""
    return _alltoall_async(tensor, splits, name)


def _alltoall_async(tensor, splits, name, timeout=None):
    """alltoall_async, its descriptor round bounded by `timeout` seconds
    (the torch.distributed backend's group timeout)."""
    session = _core._require()
    label = "alltoall tensor %r" % (name,) if name else "alltoall tensor"
    dtype, host, device = _host_copy(tensor, label)
    world, rank = session.size(), session.rank()
    mine, problem = _own_splits(splits, host.shape[0], world, label)
    unnamed_key = None
    if name is None:
        name, unnamed_key = _core._unnamed_name("Alltoall")
    try:
        # Splits that do not fit travel as -1s, so that every rank raises.
        gathered = _exchange_descriptors(
            session,
            "alltoall." + name,
            host,
            dtype,
            _capacity.get(name, 0),
            mine if mine else [-1] * world,
            timeout,
        )
        if problem is not None:
            raise ValueError(problem)
        wrong = [r for r in range(world) if int(gathered[r, _DESCRIPTOR]) < 0]
        if wrong:
            raise ValueError(
                "alltoall of %r: the splits of ranks %s do not fit their tensors (those ranks name why)"
                % (name, _ranks_text(wrong))
            )
        problem = _disagreement("alltoall", name, gathered, rows_may_differ=True)
        if problem is not None:
            raise ValueError(problem)
        matrix = gathered[:, _DESCRIPTOR:]  # rows rank s sends rank d
        counts = [int(v) for v in matrix.flatten()]
        padded = _padded_rows(counts, max(int(c) for c in gathered[:, _CAPACITY]))
        if min(counts) != max(counts):
            _capacity[name] = padded
        received = [int(v) for v in matrix[:, rank]]
        rest = tuple(host.shape[1:])
        source = host
        if any(n != padded for n in mine):
            source = torch.zeros((world * padded,) + rest, dtype=host.dtype)
            begin = 0
            for d, n in enumerate(mine):
                source[d * padded : d * padded + n] = host[begin : begin + n]
                begin += n
        output = torch.empty((world * padded,) + rest, dtype=host.dtype)
        operation = session.alltoall_async(
            name, source.data_ptr(), dtype, [world * padded] + list(rest), output.data_ptr()
        )
    except BaseException:
        _core._release_unnamed(unnamed_key)
        raise

    def finish(result):
        if any(n != padded for n in received):
            result = torch.cat([result[s * padded : s * padded + n] for s, n in enumerate(received)])
        if device is not None:
            result = result.to(device)
        if splits is None:
            return result
        return result, torch.tensor(received, dtype=torch.int64)

    return _core._register(operation, output, None, unnamed_key, finish=finish)


def alltoall(tensor, splits=None, name=None):
    """alltoall_async + synchronize (Horovod's alltoall): the rows every
    rank sent this one, in rank order; with `splits`, (tensor,
    received_splits)."""
    return _core.synchronize(alltoall_async(tensor, splits, name))

"""torch.distributed's "baton" backend: a c10d ProcessGroup whose
collectives are baton.torch's, so that a torch.distributed script (DDP
included, with no hook) runs on baton by changing one word:

    import baton.torch  # registers the backend
    torch.distributed.init_process_group("baton")  # env://, as with gloo
    model = torch.nn.parallel.DistributedDataParallel(model)

The group takes its rank and size from c10d, as every backend does, and
attaches this process to its node's agent (baton.torch.init, from the
environment batonrun or torchrun sets); baton's rank and size must be
c10d's. Its collectives span every rank of the job: a group of fewer ranks
(new_group(ranks=...)) is refused. What each call does on baton, and what
it costs, is in docs/api.md ("torch.distributed backend").

Every call returns a Work on a torch future (async_op=True, work.wait(),
work.get_future() and DDP all use it), completed by the group's thread
(process_group_work.py), with the call's tensors or the error; an operation that fails or outlasts the group's timeout poisons the
group. Calls the backend cannot serve raise at once, naming the call and
what to use instead.

Names. Every call's tensor is named by the group, its kind, dtype, device
kind, shape and place in the call's list ("c10d.0.allreduce.float32.cpu.
4x3.0"; an all-to-all's leaves out its rows, which differ by rank, and
its dtype, which its descriptor round compares): the ranks make the same
calls in the same order, so they agree,
and a name comes back at every step, which is what baton's plan wants (a
name is declared once). A name's calls run one at a time, in the order
made. DDP's buckets therefore keep one name each (their sizes), declared
at their first use in DDP's order: bucket 0 (the last layers) first, and
baton's declaration order is its priority.
"""

import datetime
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from baton._baton import BatonError
from baton.torch import _core as _bt
from baton.torch import collectives as _collectives
from baton.torch import process_group_work as _work

__all__ = ["ProcessGroupBaton", "register"]

BACKEND_NAME = "baton"

_REDUCE_OPS = {
    "SUM": _bt.Sum,
    "AVG": _bt.Average,
    "PRODUCT": _bt.Product,
    "MIN": _bt.Min,
    "MAX": _bt.Max,
    "BAND": _bt.BitwiseAnd,
    "BOR": _bt.BitwiseOr,
    "BXOR": _bt.BitwiseXor,
}

_BITWISE = (_bt.BitwiseAnd, _bt.BitwiseOr, _bt.BitwiseXor)

# Groups created in this process so far: the next one's number. Every rank
# creates its groups in the same order (c10d's rule for new_group), so the
# numbers, which prefix the groups' tensor names, agree.
_groups_created = 0


def _op_name(reduce_op):
    """The name of a c10d reduce op (a ReduceOp or its RedOpType)."""
    return getattr(getattr(reduce_op, "op", reduce_op), "name", str(reduce_op))


def _shape_text(tensor):
    return "x".join(str(d) for d in tensor.shape) or "scalar"


def _describe(tensor):
    return "%s%s" % (str(tensor.dtype).replace("torch.", ""), list(tensor.shape))


class ProcessGroupBaton(ProcessGroup):
    """A c10d ProcessGroup on baton.torch; made by init_process_group("baton")
    or new_group(backend="baton") through the function `register` hands
    to torch. Its calls may come from any thread (DDP calls from autograd's);
    what they start is completed by the group's own thread."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        global _groups_created
        self._timeout_s = _seconds(timeout)
        if not _bt.is_initialized():
            _bt.init(attach_timeout=self._timeout_s)
        if (_bt.rank(), _bt.size()) != (rank, size):
            if size != _bt.size():
                raise ValueError(
                    "the baton process group spans every rank of the job: c10d asked for a group of %d "
                    "rank(s) (rank %d in it), but the baton job has %d (this process is its rank %d); "
                    "use backend=\"gloo\" for a group of fewer ranks" % (size, rank, _bt.size(), _bt.rank())
                )
            raise ValueError(
                "c10d's rank %d of %d is not baton's rank %d of %d: start the trainers with batonrun "
                "(or give init_process_group the RANK batonrun sets)" % (rank, size, _bt.rank(), _bt.size())
            )
        self._number = _groups_created
        _groups_created += 1
        self._prefix = "c10d.%d" % self._number
        self._label = 'baton process group %d ("%s")' % (self._number, BACKEND_NAME)
        self._requests = _work.RequestQueue(self._label)

    def getBackendName(self):
        return BACKEND_NAME

    # Reductions.

    def allreduce(self, tensors, opts=None):
        op = self._reduce_op("all_reduce", opts)
        tensors = self._tensors("all_reduce", tensors)
        return self._all(
            [self._push_pull("all_reduce", "allreduce", i, t, op, t) for i, t in enumerate(tensors)], tensors
        )

    def allreduce_coalesced(self, tensors, opts=None):
        op = self._reduce_op("all_reduce_coalesced", opts)
        tensors = self._tensors("all_reduce_coalesced", tensors)
        return self._all(
            [self._push_pull("all_reduce_coalesced", "allreduce", i, t, op, t) for i, t in enumerate(tensors)],
            tensors,
        )

    def reduce(self, tensors, opts=None):
        """An all-reduce whose result only the root keeps: every rank
        receives it (the cost of an all-reduce, not of a reduce); the other
        ranks' tensors are left as they were."""
        op = self._reduce_op("reduce", opts)
        tensors = self._tensors("reduce", tensors)
        root = self._root("reduce", opts)
        keep = self.rank() == root
        return self._all(
            [self._push_pull("reduce", "reduce", i, t, op, t if keep else None) for i, t in enumerate(tensors)],
            tensors,
        )

    def _push_pull(self, call, kind, index, tensor, op, into):
        """A request for the all-reduce of `tensor` (by `op`) whose result
        is written into `into` (None: dropped)."""
        self._op_fits(call, op, tensor)
        name = self._name(kind, index, tensor)
        in_place = into is tensor

        def start():
            if in_place:
                return _bt.push_pull_async_inplace(tensor, name=name, op=op)
            return _bt.push_pull_async(tensor, name=name, op=op)

        def finish(result):
            if into is not None and not in_place:
                with torch.no_grad():
                    into.copy_(result)
            return into

        return self._request(call, tensor, name, start, finish)

    def barrier(self, opts=None):
        """Every rank's 1 summed: returns once all ranks called it."""
        ones = torch.ones(1, dtype=torch.int32)
        name = "%s.barrier" % self._prefix

        def start():
            return _bt.push_pull_async(ones, name=name, op=_bt.Sum)

        def finish(count):
            if int(count[0]) != self.size():
                raise BatonError("%s: the barrier counted %d ranks of %d" % (self._label, int(count[0]), self.size()))
            return None

        return self._all([self._request("barrier", ones, name, start, finish, opts)], [])

    # Broadcasts.

    def broadcast(self, tensors, opts=None):
        tensors = self._tensors("broadcast", tensors)
        root = self._root("broadcast", opts)
        requests = []
        for i, tensor in enumerate(tensors):
            name = self._name("broadcast", i, tensor)
            requests.append(self._broadcast_request("broadcast", tensor, root, name))
        return self._all(requests, tensors)

    def _broadcast_request(self, call, tensor, root, name):
        """root's `tensor` into every rank's, in place."""

        def start():
            return _bt.broadcast_async(tensor, root, name)

        def finish(result):
            return tensor

        return self._request(call, tensor, name, start, finish)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """The root's tensors, stacked, broadcast to every rank, which
        keeps its own row: each rank receives size() times its share."""
        outputs = self._tensors("scatter", output_tensors)
        root = self._root("scatter", opts)
        if len(outputs) != 1:
            raise ValueError("%s: scatter takes one output tensor, not %d" % (self._label, len(outputs)))
        output = outputs[0]
        if self.rank() == root:
            inputs = self._lists("scatter", input_tensors, "scatter_list", len(outputs))
            self._same_as("scatter", inputs[0], output, "scatter_list")
            stacked = torch.stack([t.detach() for t in inputs[0]])
        else:
            stacked = torch.empty((self.size(),) + tuple(output.shape), dtype=output.dtype, device=output.device)
        name = self._name("scatter", 0, stacked)
        request = self._broadcast_request("scatter", stacked, root, name)
        finish = request.finish
        rank = self.rank()

        def take_row(result):
            finish(result)
            with torch.no_grad():
                output.copy_(stacked[rank])
            return [output]

        request.finish = take_row
        return self._all([request], outputs)

    # Gathers.

    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = self._tensors("all_gather", input_tensors)
        outputs = self._lists("all_gather", output_tensors, "tensor_list", len(inputs))
        requests = []
        for i, (tensor, into) in enumerate(zip(inputs, outputs)):
            self._same_as("all_gather", into, tensor, "tensor_list")
            requests.append(self._allgather_request("all_gather", "allgather", i, tensor, into))
        return self._all(requests, outputs)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """all_gather_coalesced: output_lists[r][i] receives rank r's
        input_list[i] (rank-major, where all_gather's lists are
        tensor-major)."""
        inputs = self._tensors("all_gather_coalesced", input_list)
        if len(output_lists) != self.size() or any(len(tl) != len(inputs) for tl in output_lists):
            raise ValueError(
                "%s: all_gather_coalesced needs output_tensor_lists of one list per rank (%d), each of one "
                "tensor per input (%d), not %s" % (self._label, self.size(), len(inputs), [len(tl) for tl in output_lists])
            )
        outputs = [self._tensors("all_gather_coalesced", tl) for tl in output_lists]
        requests = []
        for i, tensor in enumerate(inputs):
            into = [outputs[r][i] for r in range(self.size())]
            self._same_as("all_gather_coalesced", into, tensor, "output_tensor_lists[*]")
            requests.append(self._allgather_request("all_gather_coalesced", "allgather", i, tensor, into))
        return self._all(requests, outputs)

    def _allgather_base(self, output_tensor, input_tensor, opts=None):
        """all_gather_into_tensor: `output_tensor` holds size() times
        `input_tensor`'s elements, rank after rank."""
        (output,) = self._tensors("all_gather_into_tensor", [output_tensor])
        (tensor,) = self._tensors("all_gather_into_tensor", [input_tensor])
        if output.dtype != tensor.dtype or output.numel() != self.size() * tensor.numel():
            raise ValueError(
                "%s: all_gather_into_tensor's output is %s; it must hold %d x the input's %s elements, "
                "of its dtype" % (self._label, _describe(output), self.size(), _describe(tensor))
            )
        rows = list(output.reshape((self.size(),) + tuple(tensor.shape)).unbind(0)) if output.is_contiguous() else None
        if rows is None:
            rows = [torch.empty_like(tensor) for _ in range(self.size())]
        request = self._allgather_request("all_gather_into_tensor", "allgather", 0, tensor, rows)
        if not output.is_contiguous():
            finish = request.finish

            def write_back(result):
                finish(result)
                with torch.no_grad():
                    output.copy_(torch.stack(rows).reshape(output.shape))
                return output

            request.finish = write_back
        return self._all([request], [output])

    def gather(self, output_tensors, input_tensors, opts=None):
        """An all-gather whose result only the root keeps: every rank
        receives size() times its tensor."""
        inputs = self._tensors("gather", input_tensors)
        root = self._root("gather", opts)
        if len(inputs) != 1:
            raise ValueError("%s: gather takes one input tensor, not %d" % (self._label, len(inputs)))
        if self.rank() == root:
            outputs = self._lists("gather", output_tensors, "gather_list", 1)[0]
            self._same_as("gather", outputs, inputs[0], "gather_list")
        else:
            outputs = None
        request = self._allgather_request("gather", "gather", 0, inputs[0], outputs)
        return self._all([request], [] if outputs is None else [outputs])

    def _allgather_request(self, call, kind, index, tensor, into):
        """Every rank's `tensor` (the same dtype and shape on every rank,
        c10d's contract) into the list `into` (None: dropped), in one
        baton allgather of the host tensor (a CUDA one goes through a
        host copy)."""
        host = tensor.detach().cpu().contiguous().reshape(tuple(tensor.shape) or (1,))
        dtype = _bt._dtype_of(host, "%s tensor" % call)
        world = self.size()
        name = self._name(kind, index, tensor)

        def start():
            gathered = torch.empty((world,) + tuple(host.shape), dtype=host.dtype)
            operation = _bt._require().allgather_async(
                name, host.data_ptr(), dtype, list(host.shape), gathered.data_ptr()
            )
            return _bt._register(operation, gathered, None, None)

        def finish(gathered):
            if into is None:
                return None
            with torch.no_grad():
                for r, out in enumerate(into):
                    out.copy_(gathered[r].reshape(out.shape))
            return into

        return self._request(call, tensor, name, start, finish)

    # Reduce-scatter.

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = self._reduce_op("reduce_scatter", opts)
        outputs = self._tensors("reduce_scatter", output_tensors)
        inputs = self._lists("reduce_scatter", input_tensors, "input_list", len(outputs))
        requests = []
        for i, (output, parts) in enumerate(zip(outputs, inputs)):
            self._same_as("reduce_scatter", parts, output, "input_list")
            stacked = torch.stack([p.detach().cpu() for p in parts])
            requests.append(self._reduce_scatter_request("reduce_scatter", i, stacked, op, output))
        return self._all(requests, outputs)

    def _reduce_scatter_base(self, output_tensor, input_tensor, opts=None):
        """reduce_scatter_tensor: `input_tensor` holds size() times
        `output_tensor`'s elements; rank r gets the reduction of the r-th
        share."""
        op = self._reduce_op("reduce_scatter_tensor", opts)
        (output,) = self._tensors("reduce_scatter_tensor", [output_tensor])
        (tensor,) = self._tensors("reduce_scatter_tensor", [input_tensor])
        if output.dtype != tensor.dtype or tensor.numel() != self.size() * output.numel():
            raise ValueError(
                "%s: reduce_scatter_tensor's input is %s; it must hold %d x the output's %s elements, "
                "of its dtype" % (self._label, _describe(tensor), self.size(), _describe(output))
            )
        stacked = tensor.detach().cpu().reshape((self.size(),) + tuple(output.shape))
        return self._all([self._reduce_scatter_request("reduce_scatter_tensor", 0, stacked, op, output)], [output])

    def _reduce_scatter_request(self, call, index, stacked, op, output):
        """`stacked` ([size(), output's shape]) reduced by `op` over every
        rank; this rank's row goes into `output`."""
        host = stacked.contiguous().reshape((self.size(),) + (tuple(stacked.shape[1:]) or (1,)))
        dtype = _bt._dtype_of(host, "%s tensor" % call)
        self._op_fits(call, op, output)
        average, op_code = _bt._resolve_op(None, op)
        name = self._name("reducescatter", index, output)

        def start():
            part = torch.empty(tuple(host.shape[1:]), dtype=host.dtype).unsqueeze(0)
            operation = _bt._require().reduce_scatter_async(
                name, host.data_ptr(), dtype, list(host.shape), part.data_ptr(), average, op_code
            )
            return _bt._register(operation, part, None, None)

        def finish(part):
            with torch.no_grad():
                output.copy_(part.reshape(output.shape))
            return output

        return self._request(call, output, name, start, finish)

    # All-to-all.

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: `input`'s rows cut by input_split_sizes (equal
        shares without), share d to rank d; `output` receives, rank after
        rank, the share each rank cut for this one, output_split_sizes[s]
        rows from rank s (equal shares without). One baton alltoall, after
        a descriptor round in which the ranks check each other's splits."""
        call = "all_to_all_single"
        (output,) = self._tensors(call, [output])
        (tensor,) = self._tensors(call, [input])
        if tensor.dim() == 0 or output.dtype != tensor.dtype or output.shape[1:] != tensor.shape[1:]:
            raise ValueError(
                "%s: %s's output is %s and its input %s: they must have one dtype and agree after the first "
                "dimension" % (self._label, call, _describe(output), _describe(tensor))
            )
        sent = self._splits(call, "input_split_sizes", input_split_sizes, tensor)
        expected = self._splits(call, "output_split_sizes", output_split_sizes, output)
        return self._all([self._alltoall_request(call, 0, tensor, sent, expected, [output])], [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all: input_tensors[d] to rank d, which receives it in its
        output_tensors[this rank]; the tensors' shapes may differ, their
        dtype may not. One baton alltoall of the inputs' elements, cut by
        their sizes."""
        call = "all_to_all"
        inputs = self._lists(call, [input_tensors], "input_tensor_list", 1)[0]
        outputs = self._lists(call, [output_tensors], "output_tensor_list", 1)[0]
        for what, tensors in (("input_tensor_list", inputs), ("output_tensor_list", outputs)):
            for r, t in enumerate(tensors):
                if t.dtype != inputs[0].dtype:
                    raise ValueError(
                        "%s: %s's %s[%d] is %s, but input_tensor_list[0] is %s: they must have one dtype"
                        % (self._label, call, what, r, _describe(t), _describe(inputs[0]))
                    )
        flat = torch.cat([t.detach().reshape(-1) for t in inputs])
        sent = [t.numel() for t in inputs]
        expected = [t.numel() for t in outputs]
        return self._all([self._alltoall_request(call, 0, flat, sent, expected, outputs)], outputs)

    def _splits(self, call, what, sizes, tensor):
        """`sizes` (rows per rank) checked against `tensor`'s rows; equal
        shares where `sizes` is empty."""
        rows = tensor.shape[0]
        world = self.size()
        sizes = [int(s) for s in sizes] if sizes is not None else []
        if not sizes:
            if rows % world:
                raise ValueError(
                    "%s: %s of %s has no %s, and its %d rows do not split evenly among %d ranks"
                    % (self._label, call, _describe(tensor), what, rows, world)
                )
            return [rows // world] * world
        if len(sizes) != world or min(sizes) < 0 or sum(sizes) != rows:
            raise ValueError(
                "%s: %s's %s %s must be %d non-negative counts adding up to the tensor's %d rows (%s)"
                % (self._label, call, what, sizes, world, rows, _describe(tensor))
            )
        return sizes

    def _alltoall_request(self, call, index, tensor, sent, expected, outputs):
        """`tensor`'s rows cut by `sent`, part d to rank d; what arrives
        (`expected` rows from each rank, else every rank's call fails naming
        the counts) is cut into `outputs`, one per source rank when there
        are size() of them, else into the one output whole."""
        # The ranks' rows differ, and a dtype that differs is named by the
        # descriptor round: the name holds neither.
        name = "%s.alltoall.%s.%s.%d" % (
            self._prefix,
            tensor.device.type,
            "x".join(["*"] + [str(d) for d in tensor.shape[1:]]),
            index,
        )
        label = self._label
        timeout_s = self._timeout_s

        def start():
            # The descriptor round waits for the other ranks here: bounded by
            # the group's timeout, like the rest of the call.
            return _collectives._alltoall_async(tensor, sent, name, timeout_s)

        def finish(result):
            received, counts = result
            counts = [int(c) for c in counts]
            if counts != expected:
                raise ValueError(
                    "%s: %s: this rank expected %s rows from the ranks but they sent %s"
                    % (label, call, expected, counts)
                )
            with torch.no_grad():
                if len(outputs) == 1:
                    outputs[0].copy_(received.reshape(outputs[0].shape))
                else:
                    for out, part in zip(outputs, received.split(counts)):
                        out.copy_(part.reshape(out.shape))
            return outputs

        return self._request(call, tensor, name, start, finish)

    # What the backend does not do.

    def send(self, tensors, dst_rank, tag):
        raise _unsupported("send", _POINT_TO_POINT)

    def recv(self, tensors, src_rank, tag):
        raise _unsupported("recv", _POINT_TO_POINT)

    def recv_anysource(self, tensors, tag):
        raise _unsupported("recv", _POINT_TO_POINT)

    # Helpers.

    def _name(self, kind, index, tensor):
        return "%s.%s.%s.%s.%s.%d" % (
            self._prefix,
            kind,
            str(tensor.dtype).replace("torch.", ""),
            tensor.device.type,
            _shape_text(tensor),
            index,
        )

    def _request(self, call, tensor, name, start, finish, opts=None):
        timeout_s = self._timeout_s
        if opts is not None and _seconds(opts.timeout) > 0:
            timeout_s = _seconds(opts.timeout)
        what = "%s of %s" % (call, _describe(tensor))
        return _work._Request(what, name, start, finish, _work.new_future([tensor]), timeout_s)

    def _all(self, requests, tensors):
        """Submits `requests` in order and returns one Work whose future's
        value is `tensors` (c10d's result) once they all completed, or the
        first one's error."""
        for request in requests:
            self._submit(request)
        combined = _work.new_future(tensors)
        futures = [r.future for r in requests]

        def settle(_):
            # Not a then(): its future would wrap the error in a traceback.
            for f in futures:
                try:
                    f.wait()
                except Exception as e:  # noqa: B902 - the call's error, as it is
                    combined.set_exception(e)
                    return
            combined.set_result(tensors)

        source = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
        source.add_done_callback(settle)
        return _work.work_for_caller(combined, _frame(2))

    def _submit(self, request):
        try:
            self._requests.submit(request)
        except ValueError as e:
            raise type(e)("%s: %s: %s" % (self._label, request.what, e)) from e

    def _tensors(self, call, tensors):
        self._requests.check_usable()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise ValueError("%s: %s takes tensors, not %s" % (self._label, call, type(t).__name__))
            if t.is_sparse:
                raise _unsupported("%s of a sparse tensor" % call, "baton reduces dense tensors; use a gloo "
                                   "group (dist.new_group(backend=\"gloo\")) or .to_dense()")
        return list(tensors)

    def _lists(self, call, lists, what, count):
        """`lists` as `count` lists of size() tensors each."""
        if len(lists) != count or any(len(tl) != self.size() for tl in lists):
            raise ValueError(
                "%s: %s needs %s with one tensor per rank (%d), not %s"
                % (self._label, call, what, self.size(), [len(tl) for tl in lists])
            )
        for tl in lists:
            self._tensors(call, tl)
        return [list(tl) for tl in lists]

    def _same_as(self, call, tensors, like, what):
        for r, t in enumerate(tensors):
            if t.dtype != like.dtype or t.shape != like.shape:
                raise ValueError(
                    "%s: %s's %s[%d] is %s, but the tensor is %s: they must match"
                    % (self._label, call, what, r, _describe(t), _describe(like))
                )

    def _root(self, call, opts):
        if opts is None:
            raise ValueError("%s: %s needs its options (the root rank)" % (self._label, call))
        root = opts.rootRank
        if not 0 <= root < self.size():
            raise ValueError("%s: %s's root rank %d is outside the group (0..%d)" % (self._label, call, root, self.size() - 1))
        return root

    def _op_fits(self, call, op, tensor):
        """ValueError unless `op` reduces `tensor`'s dtype: the bitwise ops
        take integer (and bool) tensors only."""
        if op in _BITWISE and (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
            raise ValueError(
                "%s: %s of %s by %s: the bitwise ops take integer tensors only"
                % (self._label, call, _describe(tensor), [k for k, v in _REDUCE_OPS.items() if v is op][0])
            )

    def _reduce_op(self, call, opts):
        self._requests.check_usable()
        name = _op_name(dist.ReduceOp.SUM if opts is None else opts.reduceOp)
        op = _REDUCE_OPS.get(name)
        if op is None:
            raise _unsupported("%s with ReduceOp.%s" % (call, name), "baton reduces by SUM, AVG, PRODUCT, MIN, "
                               "MAX, BAND, BOR and BXOR; scale the tensor yourself and use SUM")
        return op


_POINT_TO_POINT = (
    "baton's operations are collectives over every rank; use broadcast, all_gather or scatter, or a "
    "gloo group (dist.new_group(backend=\"gloo\")) for point-to-point messages"
)


class UnsupportedOperation(RuntimeError):
    """A torch.distributed call that the baton backend does not serve;
    raised at once, naming the call and what to use instead."""


def _unsupported(call, instead):
    return UnsupportedOperation('the baton process group does not support %s: %s' % (call, instead))


def _frame(depth):
    """The frame `depth` calls above the caller; None where the stack is
    shallower (a method called from C++ on a thread of its own)."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _create(store, rank, size, timeout):
    return ProcessGroupBaton(store, rank, size, timeout)


def register():
    """Registers the backend with torch.distributed as "baton" (import
    baton.torch does); again: nothing."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create)

"""What the Horovod and BytePS modules share: the error for what baton does
not have, pre- and post-scaling as a compressor, and the differentiable
forms of the out-of-place collectives (Horovod's allreduce, allgather and
broadcast, BytePS's push_pull are autograd functions)."""

import torch

import baton.torch as bt
from baton.torch import compression as _compression


class NotSupportedError(ValueError, NotImplementedError):
    """A peer's feature that baton does not have (yet). Both a ValueError,
    as baton's misuse errors are, and a NotImplementedError, as Horovod's
    are for what it cannot do, so either `except` catches it. Raised on the
    calling rank only, before anything is started."""


def not_supported(feature, instead):
    """Raises NotSupportedError: `feature` is not in baton; `instead` says
    what to do."""
    raise NotSupportedError("%s is not supported by baton: %s" % (feature, instead))


def unsupported(feature, instead):
    """A function of the peer's API that baton does not have: calling it
    raises NotSupportedError naming `feature`."""

    def call(*args, **kwargs):
        not_supported(feature, instead)

    call.__name__ = feature.split("(")[0].split(".")[-1]
    call.__doc__ = "Not supported by baton: %s" % instead
    return call


class ScaledCompressor(object):
    """Horovod's prescale_factor and postscale_factor (and the optimizer's
    gradient_predivide_factor) as a compressor around `inner`: the tensor
    is multiplied by `prescale` before it is compressed and the reduced
    result by `postscale` after it is decompressed, as Horovod scales before
    and after its sum."""

    def __init__(self, inner, prescale, postscale):
        if isinstance(inner, type) and issubclass(inner, _compression._ErrorFeedback) or isinstance(
            inner, _compression._ErrorFeedback
        ):
            not_supported(
                "scaling (prescale_factor, postscale_factor, gradient_predivide_factor) "
                "with compression=%r" % (inner,),
                "error-feedback compressors keep residuals of the unscaled gradient; "
                "leave the factors at 1.0 or use Compression.none, fp16 or bf16",
            )
        self.inner = bt.Compression.none if inner is None else inner
        self.prescale = float(prescale)
        self.postscale = float(postscale)

    def __repr__(self):
        return "scaled(%r, prescale=%g, postscale=%g)" % (self.inner, self.prescale, self.postscale)

    def compress(self, tensor):
        if not tensor.dtype.is_floating_point:
            raise ValueError(
                "prescale_factor/postscale_factor apply to floating-point tensors in baton, "
                "not %s" % tensor.dtype
            )
        return self.inner.compress(tensor * self.prescale)

    def decompress(self, tensor, ctx):
        return self.inner.decompress(tensor, ctx).mul_(self.postscale)


def scaled(compression, prescale, postscale):
    """`compression` with the scaling applied, or as it is when both factors
    are 1."""
    if prescale == 1.0 and postscale == 1.0:
        return compression
    return ScaledCompressor(compression, prescale, postscale)


class PushPull(torch.autograd.Function):
    """bt.push_pull as an autograd function: the gradient is reduced the
    same way (average or op, with the same scaling), as in Horovod and
    BytePS."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, compression, backward_compression):
        ctx.average, ctx.op, ctx.backward_compression = average, op, backward_compression
        return bt.push_pull(tensor, average, name, op, compression=compression)

    @staticmethod
    def backward(ctx, grad):
        reduced = bt.push_pull(grad, ctx.average, None, ctx.op, compression=ctx.backward_compression)
        return reduced, None, None, None, None, None


class Broadcast(torch.autograd.Function):
    """An out-of-place broadcast: a copy of `tensor` that bt.broadcast
    fills with `root_rank`'s values. Its gradient is the sum of every
    rank's, on the root (zeros elsewhere), as Horovod's."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return bt.broadcast(tensor.detach().clone(), root_rank, name)

    @staticmethod
    def backward(ctx, grad):
        reduced = bt.push_pull(grad, average=False)
        if bt.rank() != ctx.root_rank:
            reduced.zero_()
        return reduced, None, None


class Alltoall(torch.autograd.Function):
    """bt.alltoall as an autograd function (Horovod's): the gradient goes
    back the way the rows came, an alltoall with the received splits.
    Returns (tensor, received_splits); the splits carry no gradient."""

    @staticmethod
    def forward(ctx, tensor, splits, name):
        output, received = bt.alltoall(tensor, splits=splits, name=name)
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _):
        back, _ = bt.alltoall(grad.contiguous(), splits=ctx.received)
        return back, None, None


class Allgather(torch.autograd.Function):
    """bt.allgather as an autograd function: the gradient of this rank's
    rows is the average over the ranks of the gradient of the gathered
    tensor, cut to its rows (Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0]
        return bt.allgather(tensor, name)

    @staticmethod
    def backward(ctx, grad):
        reduced = bt.push_pull(grad, average=True)
        rows = bt.allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        offset = int(rows[: bt.rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None

"""Batch normalization over every rank's batch: Horovod's hvd.SyncBatchNorm
(torch.nn.SyncBatchNorm's semantics) on baton's push_pull.

In training, each rank sums its batch's values and squares per channel and
counts its elements; one push_pull adds those up over the ranks, so every
rank normalizes with the mean and variance of the whole global batch and
updates the same running statistics (the unbiased variance, as torch does).
The sum's gradient is the sum of every rank's gradient (its backward is a
push_pull too), which is what the global loss's gradient needs. In eval, or
alone, it is a plain batch norm. Each module is named by its place among the
SyncBatchNorms made in this process, so every rank must build its model the
same way (as every rank's optimizer needs anyway).
"""

import itertools

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from baton.torch import _core

__all__ = ["SyncBatchNorm"]

_made = itertools.count()


class _SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        return _core.push_pull(tensor, average=False, name=name)

    @staticmethod
    def backward(ctx, grad):
        return _core.push_pull(grad.contiguous(), average=False, name=ctx.name + ".grad"), None


class SyncBatchNorm(_BatchNorm):
    """hvd.SyncBatchNorm(num_features, eps, momentum, affine,
    track_running_stats): BatchNorm over the inputs of every rank. Takes
    inputs of 2 or more dimensions (N, C, ...), as BatchNorm1d/2d/3d do."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._baton_name = "baton.SyncBatchNorm.%d" % next(_made)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm: expected an input of 2 or more dimensions (N, C, ...), got %dD" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or not _core.is_initialized() or _core.size() == 1:
            return super().forward(input)
        channels = input.shape[1]
        if channels != self.num_features:
            raise ValueError(
                "SyncBatchNorm(%d): the input has %d channels (dimension 1)" % (self.num_features, channels)
            )
        dims = [0] + list(range(2, input.dim()))
        values = input.float()
        count = input.numel() // max(channels, 1)
        local = torch.cat([values.sum(dims), (values * values).sum(dims), values.new_tensor([float(count)])])
        total = _SumOverRanks.apply(local, self._baton_name)
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels : 2 * channels] / n - mean * mean).clamp(min=0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * (n / (n - 1)) if n.item() > 1 else var
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (values - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out.to(input.dtype)

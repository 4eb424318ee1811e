"""Gradient compression: what a push-pull puts on the wire instead of the
tensor itself, spelled as Horovod's hvd.Compression and BytePS's
bps.Compression.

    bt.push_pull(t, name="t", compression=bt.Compression.fp16)
    bt.DistributedOptimizer(opt, named_parameters=..., compression=bt.Compression.fp16)
    bt.DistributedOptimizer(opt, named_parameters=...,
                            compression=bt.Compression.topk(0.01))

A compressor turns a tensor into a payload and a context,
`compress(tensor) -> (payload, ctx)`; every rank's payload is summed (or
averaged) by the agents; `decompress(summed payload, ctx) -> tensor` gives
the result. A Horovod compressor class (static compress and decompress)
works as it is.

- Compression.none sends the tensor as it is.
- Compression.fp16 / Compression.bf16 send floating-point tensors as
  float16 / bfloat16 (half the bytes; other dtypes as they are). The agents
  combine float16 and bfloat16 in float32 and round once, so the sum of N
  ranks carries one rounding where a float16 ring (NCCL's, Horovod's and
  BytePS's float16 allreduce) carries N-1.
- Compression.topk(k) and Compression.onebit() are error-feedback
  compressors for slow links (BytePS's "topk" and "onebit" with
  "ef": "vanilla"): what a step's compression leaves out of a tensor is kept
  on this rank (its residual, per tensor name) and added to that tensor's
  next gradient, so nothing is lost, only delayed. They apply to
  floating-point tensors of at least `min_compress_bytes` (default 64 KiB;
  smaller ones go uncompressed, as BytePS skips small tensors) and to sums
  and means only. Create one instance per model (its residuals are keyed
  by tensor name) and keep it for the whole run.

Residuals and failures. A residual changes only when its push-pull
succeeds: an operation that fails (a lost node, a re-form) leaves it as it
was before that step, so after a re-form (baton.torch.elastic) every
survivor goes on with the residual of its last completed step; a node that
joins starts with none. Residuals are this rank's own and are never
broadcast (elastic's State does not hold them): after a rollback to a
commit they may still hold the unsent part of the steps that are redone.
"""

import math
import threading

import torch

from baton.torch import _core as _bt

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor",
           "TopKCompressor", "OneBitCompressor"]

# Tensors smaller than this (in bytes) are not compressed by the
# error-feedback compressors: their compression would cost more time than
# the bytes it saves (BytePS skips small tensors too).
DEFAULT_MIN_COMPRESS_BYTES = 64 * 1024


class Compressor(object):
    """Horovod's interface: compress(tensor) -> (payload, ctx) and
    decompress(payload, ctx) -> tensor, both static."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Sends the tensor as it is (Horovod's and BytePS's Compression.none)."""


class _CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype`; others as they are."""

    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    @staticmethod
    def decompress_into(tensor, ctx, out):
        """decompress() straight into `out` (shaped and typed like the
        original tensor): one pass, no intermediate tensor."""
        out.copy_(tensor)
        return out


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 (Horovod's and BytePS's
    Compression.fp16; DDP's fp16_compress_hook)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16 (DDP's bf16_compress_hook):
    float32's range, 8 bits of mantissa."""

    wire_dtype = torch.bfloat16


class _ErrorFeedback(object):
    """Error feedback (BytePS's "vanilla" ef) around one tensor encoding.

    compress adds the tensor's residual to it (the corrected gradient c)
    and encodes c; decompress decodes the summed payload and sets the
    residual to c minus what this rank sent. Subclasses provide
    _encode(c, name) -> (payload, extra) and _decode(summed payload, extra,
    dtype) -> (result, sent), where `sent` is this rank's own contribution
    to the sum as the result counts it; _abandon(extra) cleans up after a
    failed push-pull; declarations(name, tensor) -> [(name, tensor like the
    payload)] for each push-pull that one compressed push-pull makes.
    """

    def __init__(self, min_compress_bytes):
        if not isinstance(min_compress_bytes, int) or isinstance(min_compress_bytes, bool) or min_compress_bytes < 0:
            raise ValueError(
                "%s(min_compress_bytes=%r): give a number of bytes, an int >= 0"
                % (type(self).__name__, min_compress_bytes)
            )
        self.min_compress_bytes = min_compress_bytes
        # Tensor name -> residual (the tensor's dtype, shape and device).
        # One operation per name is in flight at a time, so each name is
        # touched by one thread at a time; the lock guards the dict.
        self._residuals = {}
        self._lock = threading.Lock()

    def bind(self, name, tensor):
        """The compressor for one push-pull of `tensor` under `name`, or
        None where this compressor leaves it uncompressed (not floating
        point, or smaller than min_compress_bytes)."""
        if not tensor.dtype.is_floating_point:
            return None
        if tensor.numel() * tensor.element_size() < self.min_compress_bytes:
            return None
        if name is None:
            raise ValueError(
                "compression=%r keeps a residual per tensor name: give the "
                "push_pull a name" % (self,)
            )
        return _BoundErrorFeedback(self, name)

    def residual(self, name):
        """A copy of tensor `name`'s residual on this rank (None before its
        first compressed push-pull completed)."""
        with self._lock:
            residual = self._residuals.get(name)
        return None if residual is None else residual.clone()

    def reset(self):
        """Forgets every residual (the unsent part of past gradients)."""
        with self._lock:
            self._residuals.clear()

    def _corrected(self, name, tensor):
        with self._lock:
            residual = self._residuals.get(name)
        corrected = tensor.detach().clone()
        if residual is not None and residual.shape == corrected.shape and residual.dtype == corrected.dtype:
            corrected += residual
        return corrected

    def _adopt(self, name, residual):
        with self._lock:
            self._residuals[name] = residual



class _BoundErrorFeedback(object):
    """An _ErrorFeedback compressor bound to one tensor name."""

    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def compress(self, tensor):
        corrected = self.owner._corrected(self.name, tensor)
        payload, extra = self.owner._encode(corrected, self.name)
        return payload, (corrected, extra)

    def decompress(self, tensor, ctx):
        corrected, extra = ctx
        result, sent = self.owner._decode(tensor, extra, corrected.dtype)
        self.owner._adopt(self.name, corrected.sub_(sent))
        return result

    def abandon(self, ctx):
        """The push-pull failed: the residual stays as it was."""
        self.owner._abandon(ctx[1])


class TopKCompressor(_ErrorFeedback):
    """Top-k sparsification with error feedback (BytePS's "topk"): each rank
    sends the k elements of largest magnitude of its corrected gradient;
    the rest stays in its residual.

    `k` < 1 is a fraction of the elements (at least one), `k` >= 1 a count.
    The exchange is dense: the k values are scattered into zeros, which the
    agents sum. That is exact, but it saves no bytes on the wire (an
    allgather of (index, value) pairs would, and is not used yet); it saves
    bytes of *update* a rank contributes, which is what error feedback
    needs for its accuracy."""

    def __init__(self, k=0.01, min_compress_bytes=DEFAULT_MIN_COMPRESS_BYTES):
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (k > 0) or (k >= 1 and k != int(k)):
            raise ValueError(
                "Compression.topk(k=%r): give a fraction of the elements in (0, 1) "
                "or a whole count >= 1" % (k,)
            )
        super(TopKCompressor, self).__init__(min_compress_bytes)
        self.k = k

    def __repr__(self):
        return "baton.torch.Compression.topk(k=%r, min_compress_bytes=%d)" % (self.k, self.min_compress_bytes)

    def count(self, numel):
        """How many elements a tensor of `numel` elements sends."""
        if self.k >= 1:
            return min(int(self.k), numel)
        return max(1, min(numel, int(math.ceil(self.k * numel))))

    def _encode(self, corrected, name):
        flat = corrected.view(-1)
        indices = flat.abs().topk(self.count(flat.numel()), sorted=False).indices
        payload = torch.zeros_like(flat)
        payload[indices] = flat[indices]
        # What this rank sends, for its residual: the payload itself is
        # overwritten by the sum.
        return payload.view(corrected.shape), (indices, payload[indices])

    def _decode(self, tensor, extra, dtype):
        indices, values = extra
        sent = torch.zeros_like(tensor)
        sent.view(-1)[indices] = values
        return tensor, sent

    def _abandon(self, extra):
        pass

    def declarations(self, name, tensor):
        return [(name, tensor)]


class OneBitCompressor(_ErrorFeedback):
    """Scaled sign compression with error feedback (BytePS's "onebit" with
    scaling): each element travels as its sign, one int8 (+1 or -1), so a
    float32 tensor costs a quarter of the bytes. The scale is the mean of
    the ranks' mean absolute values of their corrected gradients, exchanged
    in a one-element push-pull of its own ("<name>/onebit.scale") that runs
    beside the signs; the result is scale * (sum of the signs). Each rank's
    residual is its corrected gradient minus scale * its signs, so error
    feedback accounts for exactly what the sum holds.

    The agents sum the signs as int8: jobs of up to 127 ranks. Larger jobs
    send them as float16 (exact sums up to 2048 ranks), then float32.
    Signs, not bits: push-pull sums, and packed bits do not add up."""

    def __init__(self, min_compress_bytes=DEFAULT_MIN_COMPRESS_BYTES):
        super(OneBitCompressor, self).__init__(min_compress_bytes)

    def __repr__(self):
        return "baton.torch.Compression.onebit(min_compress_bytes=%d)" % self.min_compress_bytes

    @staticmethod
    def scale_name(name):
        return name + "/onebit.scale"

    @staticmethod
    def _sign_dtype():
        size = _bt.size()
        if size <= 127:
            return torch.int8
        return torch.float16 if size <= 2048 else torch.float32

    def _encode(self, corrected, name):
        scale = corrected.abs().mean().reshape(1).to(torch.float32)
        handle = _bt.push_pull_async(scale, average=True, name=self.scale_name(name))
        signs = torch.where(corrected >= 0, 1, -1).to(self._sign_dtype())
        return signs, (handle, signs.clone())

    def _decode(self, tensor, extra, dtype):
        handle, signs = extra
        scale = _bt.synchronize(handle)[0].item()
        result = tensor.to(dtype).mul_(scale)
        return result, signs.to(dtype).mul_(scale)

    def _abandon(self, extra):
        handle = extra[0]
        try:
            _bt.synchronize(handle)
        except (_bt.BatonError, ValueError):
            pass  # failed as well, or forgotten already (an elastic drain)

    def declarations(self, name, tensor):
        return [
            (name, torch.empty(tuple(tensor.shape), dtype=self._sign_dtype(), device=tensor.device)),
            (self.scale_name(name), torch.empty(1, dtype=torch.float32, device=tensor.device)),
        ]


class Compression(object):
    """The compressors, spelled as Horovod's hvd.Compression and BytePS's
    bps.Compression (none, fp16), with DDP's bf16 and BytePS's
    error-feedback ones, which are made per model: topk(k), onebit()."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    topk = TopKCompressor
    onebit = OneBitCompressor


_ERROR_FEEDBACK_CLASSES = (TopKCompressor, OneBitCompressor)


def _usage(compression):
    return (
        "compression=%r is not a compressor: pass bt.Compression.none, "
        "bt.Compression.fp16, bt.Compression.bf16, an instance of "
        "bt.Compression.topk(k) or bt.Compression.onebit(), or a class or "
        "object with compress(tensor) -> (tensor, ctx) and "
        "decompress(tensor, ctx) (Horovod's interface)" % (compression,)
    )


def check(compression):
    """Raises ValueError, saying what to pass, unless `compression` is
    something push_pull's compression= takes."""
    if compression is None or isinstance(compression, (_ErrorFeedback, NoneCompressor)):
        return
    if compression in _ERROR_FEEDBACK_CLASSES:
        spelled = "topk" if compression is TopKCompressor else "onebit"
        raise ValueError(
            "compression=bt.Compression.%s: create one, bt.Compression.%s(...), "
            "per model (it keeps a residual per tensor name)" % (spelled, spelled)
        )
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise ValueError(_usage(compression))


def bind(compression, name, tensor, op_code):
    """The compressor to use for one push-pull of `tensor` named `name` with
    reduce op `op_code`, or None to send it uncompressed."""
    check(compression)
    if compression is None or compression is NoneCompressor or isinstance(compression, NoneCompressor):
        return None
    if isinstance(compression, _ErrorFeedback):
        if op_code != _bt._baton.REDUCE_SUM:
            raise ValueError(
                "compression=%r applies to sums and means only: leave op None, "
                "or give bt.Sum or bt.Average" % (compression,)
            )
        return compression.bind(name, tensor)
    return compression


def compresses(compression, name, tensor):
    """Whether push-pulls of `tensor` named `name` travel compressed."""
    return bind(compression, name, tensor, _bt._baton.REDUCE_SUM) is not None


def declare_many(compression, named_tensors):
    """Declares, in order, the tensors that push-pulls of [(name, tensor)]
    under `compression` use (their payloads': declaration order is
    priority), and returns the [(name, tensor)] among them that go
    uncompressed."""
    declared, uncompressed = [], []
    for name, tensor in named_tensors:
        compressor = bind(compression, name, tensor, _bt._baton.REDUCE_SUM)
        if compressor is None:
            declared.append((name, tensor))
            uncompressed.append((name, tensor))
        elif isinstance(compressor, _BoundErrorFeedback):
            declared += compressor.owner.declarations(name, tensor)
        else:
            # A Horovod-style compressor is stateless: compressing zeros
            # shows the payload's dtype and shape.
            payload, _ = compressor.compress(torch.zeros_like(tensor))
            declared.append((name, payload))
    _bt.declare_many(declared)
    return uncompressed


def start(tensor, average, name, output, op, compression):
    """Starts the push-pull of `tensor`'s payload under `compression` and
    returns its handle (see _core._start_push_pull for `output`), or None
    when `tensor` goes uncompressed (Compression.none; a tensor an
    error-feedback compressor skips)."""
    what = "push_pull tensor %r" % (name,) if name else "push_pull tensor"
    _bt._dtype_of(tensor, what)
    average, op_code = _bt._resolve_op(average, op)
    compressor = bind(compression, name, tensor, op_code)
    if compressor is None:
        return None
    payload, ctx = compressor.compress(tensor)
    try:
        if not isinstance(payload, torch.Tensor):
            raise ValueError(
                "compression=%r: compress() returned %s as the payload, not a torch.Tensor"
                % (compression, type(payload).__name__)
            )
        if payload.numel() and payload.data_ptr() == tensor.data_ptr():
            # The push-pull writes its result into the payload.
            payload = payload.clone()
        # An integer payload (onebit's signs) travels as a sum: the mean of
        # integers would be truncated. The decompressed sum is divided.
        divide = average and not payload.dtype.is_floating_point
        if op_code == _bt._baton.REDUCE_SUM:
            inner = _bt._start_push_pull(payload, average and not divide, name, payload)
        else:
            inner = _bt._start_push_pull(payload, None, name, payload, op)
    except BaseException:
        _abandon(compressor, ctx)
        raise
    return _bt._register_compressed(CompressedOperation(inner, compressor, ctx, divide, output))


def _abandon(compressor, ctx):
    abandon = getattr(compressor, "abandon", None)
    if abandon is not None:
        abandon(ctx)


class CompressedOperation(object):
    """A compressed push-pull in flight: the push-pull of its payload and
    what turns the summed payload into the result."""

    __slots__ = ("inner", "compressor", "ctx", "divide", "output")

    def __init__(self, inner, compressor, ctx, divide, output):
        self.inner = inner  # the payload's push-pull handle
        self.compressor = compressor
        self.ctx = ctx
        self.divide = divide  # the payload is a sum: divide by size()
        # The caller's tensor (in place), an optimizer's, or None: new.
        self.output = output

    def poll(self):
        return _bt.poll(self.inner)

    def synchronize(self, timeout):
        try:
            payload = _bt.synchronize(self.inner, timeout)
        except TimeoutError:
            raise
        except BaseException:
            _abandon(self.compressor, self.ctx)
            raise
        with torch.no_grad():
            return self._decompress(payload)

    def _decompress(self, payload):
        compressor, ctx, output = self.compressor, self.ctx, self.output
        into = getattr(compressor, "decompress_into", None)
        if output is not None and not self.divide and into is not None:
            return into(payload, ctx, output)
        result = compressor.decompress(payload, ctx)
        if self.divide:
            result = result.div_(_bt.size()) if result.is_floating_point() else result / _bt.size()
        if output is None:
            return result
        output.copy_(result)
        return output

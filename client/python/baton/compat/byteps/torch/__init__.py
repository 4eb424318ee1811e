"""BytePS's PyTorch API (byteps.torch) on baton:

    import baton.compat.byteps.torch as bps     # was: import byteps.torch as bps

The names, argument orders and defaults are BytePS's, and so are the
semantics: push_pull returns a new tensor (and is differentiable),
push_pull_inplace and the _inplace forms write the input, `average`
defaults to True, DistributedOptimizer names its gradients
"Gradient.<name>". Each function names baton.torch's own. BytePS's
`version` and `priority` arguments are accepted and not used: baton
schedules by declaration order (first declared, most urgent).
docs/api.md lists the remaining differences.
"""

import baton.torch as bt
from baton.compat._common import NotSupportedError, PushPull, unsupported  # noqa: F401 - bps.NotSupportedError
from baton.torch import (  # noqa: F401 - BytePS's names, baton's functions
    Compression,
    DistributedOptimizer,
    broadcast_object,
    local_rank,
    local_size,
    poll,
    rank,
    shutdown,
    size,
    synchronize,
)


def init(lazy=True):
    """Joins the job (bt.init); `lazy` has no meaning in baton."""
    bt.init()


def push_pull(tensor, average=True, name=None, version=0, priority=0, compression=Compression.none):
    """A new tensor: the mean (or with average=False the sum) of `tensor`
    over every rank; `tensor` is unchanged. Differentiable."""
    return PushPull.apply(tensor, average, name, None, compression, None)


def push_pull_async(tensor, average=True, name=None, version=0, priority=0):
    """Starts push_pull; synchronize(handle) returns the new tensor."""
    return bt.push_pull_async(tensor, average, name)


def push_pull_inplace(tensor, average=True, name=None, version=0, priority=0):
    """push_pull in place: `tensor` becomes the result and is returned."""
    return bt.push_pull_inplace(tensor, average, name)


def push_pull_async_inplace(tensor, average=True, name=None, version=0, priority=0):
    """Starts push_pull_inplace; synchronize(handle) writes `tensor`."""
    return bt.push_pull_async_inplace(tensor, average, name)


byteps_push_pull = push_pull_async_inplace


def declare(name, tensor=None):
    """BytePS declares a name ahead of use to fix its key and priority.
    baton needs the tensor's dtype and shape to declare: given `tensor`,
    it is declared now (bt.declare); without, the name is declared by its
    first push_pull, in the order of first use. Returns 0, as BytePS's."""
    if not isinstance(name, str):
        raise ValueError("declare: name must be a str, not %s" % type(name).__name__)
    if tensor is None:
        bt.size()  # not initialized: ValueError, as every call
    else:
        bt.declare(name, tensor)
    return 0


def broadcast_parameters(params, root_rank, prefix="Parameter."):
    """Every rank holds root_rank's `params` exactly (a dict such as
    model.state_dict(), or a list). baton names them "Parameter.<name>"
    whatever `prefix`."""
    bt.broadcast_parameters(params, root_rank)


def broadcast_optimizer_state(optimizer, root_rank, prefix="Parameter."):
    """Every rank's optimizer state becomes root_rank's, exactly (the
    optimizer's state_dict travels whole)."""
    bt.broadcast_optimizer_state(optimizer, root_rank)


suspend = unsupported("bps.suspend", "baton re-forms a job on its own: use baton.torch.elastic (or hvd.elastic)")
resume = unsupported("bps.resume", "baton re-forms a job on its own: use baton.torch.elastic (or hvd.elastic)")
get_pushpull_speed = unsupported("bps.get_pushpull_speed", "`batonctl status` and `batonctl timeline` show the job's rates")


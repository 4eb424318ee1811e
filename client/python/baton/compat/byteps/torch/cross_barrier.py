"""BytePS's cross-barrier scheduling (byteps.torch.cross_barrier) on
baton's ScheduledOptimizer:

    import baton.compat.byteps.torch.cross_barrier as bps
    optimizer = bps.CrossBarrier(model, optimizer, named_parameters, compression,
                                 backward_passes_per_step, num_steps)

CrossBarrier(model, optimizer, ...) wraps a plain optimizer in BytePS's
DistributedOptimizer form and _CrossBarrier(model, byteps_opt, num_steps)
takes either that form (bps.DistributedOptimizer(opt, named_parameters=...))
or a plain optimizer: both are bt.ScheduledOptimizer, whose gradients go
once, under the DistributedOptimizer's tensor names. Unlike BytePS, the
first step() communicates too (BytePS's first step() is a local one, for
broadcast_optimizer_state to create the optimizer's state; baton's
broadcast_optimizer_state needs none), and any torch.optim optimizer but
LBFGS works, not only SGD, Adam and RMSprop.
"""

import baton.torch as bt
from baton.compat.byteps.torch import (  # noqa: F401 - the module's API, as BytePS's
    Compression,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    local_rank,
    local_size,
    poll,
    rank,
    shutdown,
    size,
    synchronize,
)


def _CrossBarrier(model, byteps_opt, num_steps=10**6):
    """bt.ScheduledOptimizer(model, byteps_opt, num_steps): `byteps_opt` is
    a DistributedOptimizer of this module or a plain torch optimizer."""
    return bt.ScheduledOptimizer(model, byteps_opt, num_steps)


def CrossBarrier(
    model, optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1, num_steps=10**6
):
    """BytePS's CrossBarrier: `optimizer` wrapped in DistributedOptimizer
    (named_parameters, compression, backward_passes_per_step: only 1, as
    every step's gradients are applied), then in _CrossBarrier."""
    if backward_passes_per_step != 1:
        raise ValueError(
            "CrossBarrier(backward_passes_per_step=%r): baton's ScheduledOptimizer applies "
            "every step's gradients; pass 1" % (backward_passes_per_step,)
        )
    distributed = DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step)
    return _CrossBarrier(model, distributed, num_steps)


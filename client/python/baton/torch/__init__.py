"""baton for PyTorch: push-pull, broadcast and optimizers, BytePS/Horovod style.

    import baton.torch as bt
    bt.init()
    bt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = bt.ScheduledOptimizer(model, torch.optim.SGD(...), num_steps)
    mean = bt.push_pull(metric, name="metric")  # a new tensor; metric unchanged
    bt.push_pull_inplace(metric, name="metric")  # metric becomes the mean

As in BytePS, push_pull and push_pull_async return a new tensor and leave
their input alone (Horovod's allreduce); push_pull_inplace and
push_pull_async_inplace write the result into it (Horovod's allreduce_).
broadcast and broadcast_async work in place.

CPU tensors travel through shared memory to this node's baton-agent. A CUDA
tensor goes through a staging tensor that baton keeps on its device (one per
tensor name, until shutdown), shared with the agent through CUDA IPC: its
bytes never leave the device here, and the agent writes the result there in
place. Between nodes they travel over the agents' data plane.

Importing the package also registers torch.distributed's "baton" backend
(process_group.py): dist.init_process_group("baton") runs a DDP or
torch.distributed script on baton's collectives unchanged.
"""

from baton.torch._core import *  # noqa: F401,F403
from baton.torch._core import __all__ as _core_all
from baton.torch.collectives import *  # noqa: F401,F403
from baton.torch.collectives import __all__ as _collectives_all
from baton.torch.optimizers import DistributedOptimizer, ScheduledOptimizer
from baton.torch.ddp import DDPCommHookState, ddp_comm_hook
from baton.torch.compression import Compression
from baton.torch.sync_batch_norm import SyncBatchNorm
from baton.torch import elastic  # noqa: F401
import torch.distributed as _dist

if _dist.is_available():
    from baton.torch import process_group as _process_group

    _process_group.register()  # torch.distributed.init_process_group("baton")

__all__ = _core_all + _collectives_all + ["DistributedOptimizer", "ScheduledOptimizer", "DDPCommHookState", "ddp_comm_hook",
                                         "Compression"]

"""baton: gradient communication and job coordination for data-parallel training.

`baton.torch` is the PyTorch API (init, push_pull, broadcast_parameters,
DistributedOptimizer, ScheduledOptimizer). This module holds what does not
need torch.
"""

from baton._baton import BatonError, job_status_text

__all__ = ["BatonError", "job_status_text"]

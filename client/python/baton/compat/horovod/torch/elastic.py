"""Horovod's elastic training (hvd.elastic) on baton.torch.elastic:

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state): ...

TorchState is baton's elastic.State (commit, restore, sync,
register_reset_callbacks, fields as attributes) with Horovod's
check_host_updates; run is baton's. A re-form does not restart the
trainers' sessions (Horovod's shutdown()/init() between generations): the
process keeps its session, and rank() and size() change under it.
"""

from baton.compat._common import unsupported
from baton.torch import elastic as _elastic

run = _elastic.run


class TorchState(_elastic.State):
    """State(model=None, optimizer=None, **fields), as Horovod's."""

    def check_host_updates(self):
        """Stops the training function when the job re-formed or nodes wait
        to join (baton's check_reform), to be resumed by run()."""
        self.check_reform()


ElasticSampler = unsupported(
    "hvd.elastic.ElasticSampler",
    "shard the data by hvd.rank() and hvd.size() in a reset callback, and keep the position in a TorchState field",
)

"""Horovod's and BytePS's PyTorch APIs on baton, so that a script moves over
by its import line alone:

    import baton.compat.horovod.torch as hvd          # was: import horovod.torch as hvd
    import baton.compat.byteps.torch as bps           # was: import byteps.torch as bps
    import baton.compat.byteps.torch.cross_barrier as bps

Each module names baton.torch's own functions with the peer's spellings and
adapts where the semantics differ (an out-of-place broadcast, a default
op, arguments baton has no use for); nothing here communicates on its
own. What baton does not have raises NotSupportedError (a ValueError and a
NotImplementedError) naming it. docs/api.md, "Moving a Horovod or BytePS
script over", lists every difference that remains.
"""

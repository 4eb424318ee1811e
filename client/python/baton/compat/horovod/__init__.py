"""Horovod's APIs on baton: baton.compat.horovod.torch."""

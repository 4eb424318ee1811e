"""BytePS's APIs on baton: baton.compat.byteps.torch (and its cross_barrier)."""

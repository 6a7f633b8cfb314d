"""Every Horovod rank syncs its state after every change of the group, a removal too.

``hvd.elastic.run`` skips the state sync when the change it was told of was a
removal only (``HostsUpdatedInterrupt(skip_sync=True)``): the survivors hold
the same state, so the broadcast is saved. But a host added before the new
group forms (a node given back to the job seconds after one was taken, which
pilots do all the time) puts new ranks in that group, and they sync: the
survivors go straight to their first allreduce while the new ranks wait in
the sync's broadcast, and the job hangs silently (horovod/horovod#3494, open
in 0.28.1). A rank of the Horovod runtime therefore always syncs; the cost is
one broadcast of the state per removal.
"""

from __future__ import annotations

import importlib.util


def always_sync() -> bool:
    """Make every ``HostsUpdatedInterrupt`` of this process ask for the sync; False where Horovod is not installed.
    Call it before the app's code runs (its ``hvd.elastic.run`` reads the flag off the interrupt)."""
    try:
        if importlib.util.find_spec("horovod") is None:
            return False
        from horovod.common.exceptions import HostsUpdatedInterrupt
    except Exception:  # a broken Horovod install: the app's own import of it says what is wrong
        return False
    if getattr(HostsUpdatedInterrupt, "pilotfill_always_sync", False):
        return True

    def __init__(self, skip_sync: bool) -> None:
        RuntimeError.__init__(self)
        self.skip_sync = False

    HostsUpdatedInterrupt.__init__ = __init__
    HostsUpdatedInterrupt.pilotfill_always_sync = True
    return True

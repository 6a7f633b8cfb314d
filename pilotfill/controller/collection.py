"""How often Python's cycle collector runs while a controller decides: rarely.

A decision at machine scale makes hundreds of thousands of objects that live
for that decision only. With Python's defaults a young collection runs every
700 allocations and traverses them again and again, then once more in the
older generations. Collecting every 20,000 lets them die first (reference
counting frees them) and keeps the controller's long-lived state out of most
collections (``benchmarks/bench_replay.py --only saturating`` times the
passes). What lives as long as the controller is frozen out of the collector's
sight by the controller itself (``gc.freeze`` in :mod:`.core`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG = 20_000
"""Allocations (less deallocations) between young collections (Python's default: 700)."""
OLDER = 20
"""Collections of a generation between collections of the next (Python's default: 10)."""


@contextmanager
def collecting_rarely() -> Iterator[None]:
    """The collector's thresholds for a controller's loop, restored after it (a replay runs in the caller's process)."""
    before = gc.get_threshold()
    gc.set_threshold(YOUNG, OLDER, OLDER)
    try:
        yield
    finally:
        gc.set_threshold(*before)

"""How often Python's cycle collector runs while a controller decides: rarely.

A decision at machine scale (thousands of open jobs) makes hundreds of
thousands of objects that live for that decision only: views, rows, tuples.
With Python's defaults a young collection runs every 700 of them, traverses
the decision's own temporaries again and again and moves them to the older
generations, where they are traversed once more. Collecting every 20,000
allocations lets them die first (they are freed by reference counting) and
keeps the controller's long-lived state out of most collections: the saturating
replay's slowest passes are shorter for it (``benchmarks/bench_replay.py --only
saturating`` times them). What lives as long as the controller is frozen out of
the collector's sight by the controller itself (``gc.freeze`` in :mod:`.core`).
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

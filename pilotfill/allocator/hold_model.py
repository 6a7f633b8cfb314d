"""How long a node is expected to stay: the allocator's horizon, learned from the machine.

BFTrainer values every change over one constant look-ahead, T_fwd (10 s in its
replayer). Against a rescale cost of the same size that constant cancels every
growth of a running job, and it says nothing about the machine: on one, idle
nodes stay for hours; on another, they come and go every few seconds. A
running pilotfill knows better, so the horizon of a decision is what the
nodes of the pool are expected to give:

* a hard end per node — its pilot's walltime left (and whatever else the batch
  system promises, passed in as the node's bound);
* the median residual hold learned online from the holds that have ended on
  this machine so far: for a node that has stayed ``a`` seconds, the median of
  ``d − a`` over the ended holds ``d > a`` (the past only: a replay learns it
  from the trace as it goes). The median, not the mean: the few holds of many
  hours that dominate a mean are not what the next decision can count on
  (on the shared Summit week the mean's longer horizon lost samples to
  rescales that did not pay);
* where too few ended holds are longer than ``a`` (a new machine, or a node
  older than anything seen), Lindy's rule: a node that has stayed ``a`` is
  expected to stay about as long again, and at least ``prior_s``.

The decision's horizon is the median over the pool of each node's expectation
(bounded by its hard end). Pure: durations and ages in, seconds out; the controller says when.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

PRIOR_S = 60.0
"""Expected hold of a fresh node before this machine has shown anything: more than a rescale costs."""
MIN_SAMPLES = 20
"""Ended holds longer than a node's age needed before their mean residual is trusted for it."""
KEEP = 20_000
"""Ended holds remembered (the newest): the machine's recent behaviour, in bounded memory."""
MERGE_EVERY = 4096
"""Observations kept aside before they are merged into the sorted holds even if nothing reads them."""
FLOOR_S = 1.0
"""No horizon is shorter than this (a zero horizon would value nothing)."""


@dataclass
class HoldModel:
    """Ended node holds (seconds) in, expected remaining holds out."""

    prior_s: float = PRIOR_S
    min_samples: int = MIN_SAMPLES
    keep: int = KEEP
    _order: deque[float] = field(default_factory=deque)  # arrival order, to forget the oldest
    # The holds remembered, sorted, as an array — with what was observed and forgotten since, merged in when read: at
    # machine scale holds end in every pass and a decision reads them once, so a change costs an append, and a read
    # one vectorised merge, not a conversion of every hold.
    _sorted: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    _added: list[float] = field(default_factory=list, repr=False, compare=False)
    _dropped: list[float] = field(default_factory=list, repr=False, compare=False)

    def observe(self, seconds: float) -> None:
        """A node's hold ended on its own after ``seconds`` (taken back, walltime): not a release of ours."""
        if not (seconds >= 0 and np.isfinite(seconds)):
            return
        self._order.append(float(seconds))
        self._added.append(float(seconds))
        if len(self._order) > self.keep:
            self._dropped.append(self._order.popleft())
        if len(self._added) > MERGE_EVERY:  # never read (a controller deciding nothing): bounded all the same
            self._merge()

    @property
    def samples(self) -> int:
        return len(self._order)

    @property
    def unmerged(self) -> int:
        """Holds observed since the sorted array was last made (bounded by :data:`MERGE_EVERY` even if never read)."""
        return len(self._added)

    def holds(self) -> np.ndarray:
        """The holds remembered, sorted (read-only)."""
        if self._added or self._dropped:
            self._merge()
        return self._sorted

    def _merge(self) -> None:
        """What was observed and forgotten since the last read, into the sorted array (multiset: equal holds count)."""
        merged = self._sorted
        if self._added:
            added = np.sort(np.asarray(self._added, dtype=float))
            merged = np.insert(merged, np.searchsorted(merged, added), added)
        if self._dropped:
            dropped = np.sort(np.asarray(self._dropped, dtype=float))
            nth = np.arange(dropped.size) - np.searchsorted(dropped, dropped, side="left")  # the k-th of equal holds
            merged = np.delete(merged, np.searchsorted(merged, dropped, side="left") + nth)
        merged.flags.writeable = False
        self._sorted, self._added, self._dropped = merged, [], []

    def expected(self, ages: Iterable[float], bounds: Iterable[float] | None = None) -> np.ndarray:
        """Expected remaining hold of nodes that have stayed ``ages`` seconds, each within its ``bounds``."""
        a = ages if isinstance(ages, np.ndarray) else np.asarray(list(ages), dtype=float)
        if a.size == 0:
            return a
        d = self.holds()
        first = np.searchsorted(d, a, side="right")  # holds longer than each age: d[first:]
        longer = d.size - first
        middle = np.minimum(first + np.maximum(longer - 1, 0) // 2, max(d.size - 1, 0))
        learned = (d[middle] if d.size else np.zeros_like(a)) - a  # the median remaining hold
        lindy = np.maximum(a, self.prior_s)
        out = np.where(longer >= self.min_samples, learned, lindy)
        if bounds is not None:
            out = np.minimum(out, bounds if isinstance(bounds, np.ndarray) else np.asarray(list(bounds), dtype=float))
        return np.maximum(out, FLOOR_S)

    def horizon(self, ages: Iterable[float], bounds: Iterable[float] | None = None) -> float:
        """The horizon of one decision: the median expected hold over the pool (``prior_s`` for an empty pool)."""
        exp = self.expected(ages, bounds)
        return float(np.median(exp)) if exp.size else max(self.prior_s, FLOOR_S)

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
  (measured on the shared Summit week, whole machine: the mean's horizon of
  ~10 min lost a tenth of the samples to rescales that did not pay);
* where too few ended holds are longer than ``a`` (a new machine, or a node
  older than anything seen), Lindy's rule: a node that has stayed ``a`` is
  expected to stay about as long again, and at least ``prior_s``.

The decision's horizon is the median over the pool of each node's expectation
(bounded by its hard end). Pure: durations and ages in, seconds out; the controller says when.
"""

from __future__ import annotations

import bisect
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
FLOOR_S = 1.0
"""No horizon is shorter than this (a zero horizon would value nothing)."""


@dataclass
class HoldModel:
    """Ended node holds (seconds) in, expected remaining holds out."""

    prior_s: float = PRIOR_S
    min_samples: int = MIN_SAMPLES
    keep: int = KEEP
    _order: deque[float] = field(default_factory=deque)  # arrival order, to forget the oldest
    _sorted: list[float] = field(default_factory=list)
    _array: np.ndarray | None = field(default=None, repr=False, compare=False)  # _sorted as an array, made again after a change
    
    def observe(self, seconds: float) -> None:
        """A node's hold ended on its own after ``seconds`` (taken back, walltime): not a release of ours."""
        if not (seconds >= 0 and np.isfinite(seconds)):
            return
        self._order.append(seconds)
        self._array = None
        bisect.insort(self._sorted, seconds)
        if len(self._order) > self.keep:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    @property
    def samples(self) -> int:
        return len(self._sorted)

    def expected(self, ages: Iterable[float], bounds: Iterable[float] | None = None) -> np.ndarray:
        """Expected remaining hold of nodes that have stayed ``ages`` seconds, each within its ``bounds``."""
        a = ages if isinstance(ages, np.ndarray) else np.asarray(list(ages), dtype=float)
        if a.size == 0:
            return a
        if self._array is None:  # asked once or twice per decision, of up to KEEP holds: not converted each time
            self._array = np.asarray(self._sorted, dtype=float)
        d = self._array
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

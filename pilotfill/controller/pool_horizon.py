"""The horizon: how long an allocation made now is expected to last, from how long this machine's nodes stay.

A change is valued over the horizon (a job grows by k nodes when what k more nodes give over it exceeds the
scale-up cost), so the horizon must be what this machine does: for each ready node the expected rest of its hold at
its age (:class:`~pilotfill.allocator.HoldModel`, learned from the holds that ended: taken back by the main workload
or a walltime, never our own releases), within its pilot's walltime left; the median over the pool; and no longer
than jobs' allocations have lasted between changes (at machine scale some job changes at every event).
``controller.t_fwd`` fixes it instead (BFTrainer's comparison: 10 s).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..allocator import HoldModel
from ..journal import Journal
from .world import World

HORIZON_EXACT_NODES = 1000
"""Below this many ready nodes the horizon reads every node's age and walltime whenever the ready nodes change."""
HORIZON_REFRESH_S = 5.0
"""Above :data:`HORIZON_EXACT_NODES`, the longest the horizon goes on a read of the pool made before a few nodes
joined or left (see :meth:`PoolHorizon._pool_changed`): reading thousands costs a decision milliseconds."""


class PoolHorizon:
    """The horizon of one controller: the holds and allocation lifetimes it learned, and the pool's ages read when
    they changed enough to move the median."""

    def __init__(self, world: World, journal: Journal, t_fwd: float = 0.0):
        self.world = world
        self.journal = journal
        self.t_fwd = t_fwd
        self.holds = HoldModel()  # how long nodes stay on this machine
        self.lifetimes = HoldModel()  # how long a job's allocation stays as it is before the next change to it
        # (version, ready nodes' since, walltime ends, when read)
        self._pool_arrays: tuple[int, np.ndarray, np.ndarray, float] | None = None
        self._pool_holds: tuple[tuple, Any] | None = None  # (when, pool, samples) -> expected hold of each ready node
        self.seed()

    def seed(self) -> None:
        """Learn from the holds an earlier controller on this run directory saw end (the journal keeps them)."""
        for kind in ("node.leaving", "node.gone"):
            for event in self.journal.events(kind):
                held = event["data"].get("held_s")
                if isinstance(held, (int, float)):
                    self.holds.observe(float(held))

    def at(self, now: float, extra: int = 0) -> float:
        """Seconds an allocation made now is expected to last: ``controller.t_fwd`` where set (BFTrainer's
        fixed look-ahead, for comparisons), else the pool's expected hold — each node's learned expectation
        for its age, within its pilot's walltime left (``extra`` nodes: fresh, within a new pilot's)."""
        fixed = self.t_fwd
        if fixed > 0:
            return fixed
        world = self.world
        key = (now, world.ready_version, self.holds.samples)
        # once per decision, not again for the pilots' question
        if self._pool_holds is None or self._pool_holds[0] != key:
            if self._pool_arrays is None or (self._pool_arrays[0] != world.ready_version and self._pool_changed(now)):
                # Thousands of nodes at machine scale, read one by one only when the ready nodes changed.
                nodes = [world.nodes[name] for name in world.ready]
                # per pilot, not per node
                ends = {pilot_id: pilot.walltime_end or math.inf for pilot_id, pilot in world.pilots.items()}
                since = np.fromiter([n.since for n in nodes], dtype=float, count=len(nodes))
                ending = np.fromiter([ends.get(n.pilot, math.inf) for n in nodes], dtype=float, count=len(nodes))
                self._pool_arrays = (world.ready_version, since, ending, now)
            _, since, ending, _ = self._pool_arrays
            self._pool_holds = (key, self.holds.expected(now - since, ending - now))
        held = self._pool_holds[1]
        fresh = self.holds.expected([0.0]) if extra else held[:0]
        expected = np.concatenate([held, np.repeat(fresh, extra)]) if extra else held
        horizon = float(np.median(expected)) if expected.size else self.holds.horizon([])
        if self.lifetimes.samples >= self.lifetimes.min_samples:
            # Nodes may stay for hours while a job's share changes every few seconds (at machine scale every event
            # moves some job): what a change gains lasts until the next change to that job, not as long as the nodes.
            horizon = min(horizon, float(self.lifetimes.expected([0.0])[0]))
        return horizon

    def _pool_changed(self, now: float) -> bool:
        """Whether the ready nodes changed enough since the pool's ages and walltimes were read to read them again:
        always below :data:`HORIZON_EXACT_NODES`; above, once a hundredth of them joined or left, or after
        :data:`HORIZON_REFRESH_S` (the horizon is a median over thousands of nodes, which a few do not move)."""
        _, since, _, read_at = self._pool_arrays
        ready = len(self.world.ready)
        return (ready < HORIZON_EXACT_NODES or abs(ready - since.size) * 100 >= since.size
                or now - read_at >= HORIZON_REFRESH_S)


__all__ = ["HORIZON_EXACT_NODES", "HORIZON_REFRESH_S", "PoolHorizon"]

"""Walltime is a known end: ranks leave a pilot before the batch system ends it, and no job grows onto one about to.

A pilot's walltime end (``walltime_end``, told by the batch system with its
start) is when the batch system ends it: SIGTERM, then SIGKILL a grace later
(Slurm's KillWait, PBS's kill_delay). The controller acts before that, on its
own clock (Parsl drains blocks before their walltime for the same reason,
Parsl/parsl#3059):

* **Drain.** From ``end - lead`` the pilot's nodes are ``leaving``, exactly
  as after a preemption notice: their jobs shrink or stop and resume from
  their last commit. ``lead`` (:func:`lead_s`) is the pilot's grace plus a
  margin, so ranks — SIGTERM, then SIGKILL at most a grace later — are gone
  before the batch system acts. A job that commits in the *window* before that
  (its commit interval as measured, at most :data:`WINDOW_MAX_S`) leaves the
  pilot's nodes at that commit instead, so it loses nothing it did; a job that
  has not yet committed twice has no window and leaves at ``end - lead``.
* **Growth.** A free node whose drain comes sooner than a rescale pays off —
  within the scale-up plus scale-down cost of the costliest job the allocator
  considers — is not offered to the allocator (:func:`short_lived`): growing
  onto it would cost a scale-up now and a scale-down when it goes, for less
  than that in training. Nodes a job holds stay offered (it keeps them until
  the drain). The allocator's horizon (``Controller.horizon``) already bounds
  each node's value by its walltime; this bounds *which* nodes a job can get,
  which a pool-wide horizon cannot.

:class:`Walltimes` keeps pilots by end in a heap, so a tick costs the pilots
near their end, not the machine.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator

WINDOW_MAX_S = 1800.0
"""A job waits for its next commit to leave an ending pilot at most this long before the drain."""
MARGIN_S = 2.0
"""Beyond the grace: for the command to reach the pilot's agent and the ranks to get SIGTERM."""


def lead_s(grace_s: float, tick_s: float) -> float:
    """Seconds before a pilot's walltime end by which its nodes are ``leaving``: its ranks' grace and a margin."""
    return grace_s + max(MARGIN_S, 5 * tick_s)


def short_lived(free: Iterable[tuple[str, float | None]], now: float, lead: float, within: float) -> set[str]:
    """Of the free nodes given as (name, their pilot's walltime end or None), those drained within ``within`` seconds."""
    if within <= 0:
        return set()
    return {name for name, end in free if end is not None and end - lead - now < within}


class Walltimes:
    """Pilots by walltime end: which are near it (within the lead and the longest window), cheaply."""

    def __init__(self, lead: float):
        self.lead = lead
        self._heap: list[tuple[float, str]] = []
        self._near: dict[str, float] = {}

    def track(self, pilot: str, end: float | None) -> None:
        """``pilot`` ends at ``end`` (None or infinite: no walltime)."""
        if end is not None and math.isfinite(end):
            heapq.heappush(self._heap, (end, pilot))

    def near(self, now: float) -> Iterator[tuple[str, float]]:
        """(pilot, end) of every tracked pilot whose drain window may have opened; the caller forgets those done."""
        while self._heap and self._heap[0][0] - self.lead - WINDOW_MAX_S <= now:
            end, pilot = heapq.heappop(self._heap)
            self._near[pilot] = end
        yield from list(self._near.items())

    def end_of(self, pilot: str | None) -> float | None:
        """The end of a pilot near it, else None."""
        return self._near.get(pilot) if pilot is not None else None

    def forget(self, pilot: str) -> None:
        self._near.pop(pilot, None)

    def in_window(self, pilot: str | None, now: float, window: float) -> float | None:
        """The pilot's end if it is near and ``now`` is within ``window`` (capped) of its drain, else None."""
        end = self.end_of(pilot)
        if end is None or now < end - self.lead - min(window, WINDOW_MAX_S):
            return None
        return end

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
  considers — is not offered to the allocator (``Planner.ending_soon``): growing
  onto it would cost a scale-up now and a scale-down when it goes, for less
  than that in training. Nodes a job holds stay offered (it keeps them until
  the drain). The allocator's horizon (``Controller.horizon``) already bounds
  each node's value by its walltime; this bounds *which* nodes a job can get,
  which a pool-wide horizon cannot.

:class:`Walltimes` keeps pilots by end in a heap, so a tick costs the pilots
near their end, not the machine.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator

# beyond the grace: for the command to reach the agent, the ranks to get SIGTERM
from ..config import DRAIN_MARGIN_S as MARGIN_S

WINDOW_MAX_S = 1800.0
"""A job waits for its next commit to leave an ending pilot at most this long before the drain."""


def lead_s(grace_s: float, tick_s: float) -> float:
    """Seconds before a pilot's walltime end by which its nodes are ``leaving``: its ranks' grace and a margin."""
    return grace_s + max(MARGIN_S, 5 * tick_s)


class Walltimes:
    """Pilots by walltime end, so that a tick or a decision costs the pilots near their drain, not the machine.

    Far from it a pilot waits in a heap; within :data:`WINDOW_MAX_S` of its drain it moves to a list kept in
    end order, which the questions below read from the front and stop early.
    """

    def __init__(self, lead: float):
        self.lead = lead
        self._heap: list[tuple[float, str]] = []
        self._due: list[tuple[float, str]] = []  # sorted by end
        self._end: dict[str, float] = {}  # tracked pilot -> its end, until drained

    def track(self, pilot: str, end: float | None) -> None:
        """``pilot`` ends at ``end`` (None or infinite: no walltime)."""
        if end is not None and math.isfinite(end):
            self._end[pilot] = end
            heapq.heappush(self._heap, (end, pilot))

    def drained(self, now: float) -> list[tuple[str, float]]:
        """(pilot, end) of the pilots whose drain (``end - lead``) has come, each once."""
        self._advance(now)
        out, i = [], 0
        while i < len(self._due) and self._due[i][0] - self.lead <= now:
            end, pilot = self._due[i]
            if self._end.get(pilot) == end:
                del self._end[pilot]
                out.append((pilot, end))
            i += 1
        del self._due[:i]
        return out

    def ending_within(self, now: float, seconds: float) -> Iterator[tuple[str, float]]:
        """(pilot, end) of the pilots whose drain comes within ``seconds`` (at most :data:`WINDOW_MAX_S`)."""
        self._advance(now)
        for end, pilot in self._due:
            if end - self.lead - now >= min(seconds, WINDOW_MAX_S):
                return
            if self._end.get(pilot) == end:
                yield pilot, end

    def in_window(self, pilot: str | None, now: float, window: float) -> float | None:
        """The pilot's end if ``now`` is within ``window`` (at most :data:`WINDOW_MAX_S`) of its drain, else None."""
        end = self._end.get(pilot) if pilot is not None else None
        if end is None or now < end - self.lead - min(window, WINDOW_MAX_S):
            return None
        return end

    def _advance(self, now: float) -> None:
        while self._heap and self._heap[0][0] - self.lead - WINDOW_MAX_S <= now:
            bisect.insort(self._due, heapq.heappop(self._heap))

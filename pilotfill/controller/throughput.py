"""A job's measured throughput: what its ranks' reports say it processes per second at one size.

What JPA learns from must be steady training: a rank's first report after a start, a resize or a restart covers
imports, rendezvous and restoring, not training, and a report that spans a change of size describes neither size.
The :class:`Meter` of a job at one size opens its window at each rank's first report and drops what spans a change.
"""

from __future__ import annotations

METER_WINDOW_S = 2.0
"""A job's throughput is measured over at least this much time at one size before the profiler sees it."""
RANK_SILENT_S = 30.0
"""A rank that has not reported for this long is not waited for when measuring its job (see Meter)."""


class Meter:
    """Samples a job processed at one size, summed over its ranks: its measured throughput at that size.

    Each rank reports what it did since its own previous report, so the ranks' intervals are not aligned: one
    window over all of them would always cut some rank's report in two (and, restarted whenever a report began
    before it, never closed at all once two ranks reported out of step). So each rank (its host and process) is
    measured over its own intervals, and the job's rate is the sum of its ranks' rates over a window they all
    reported in. A rank silent for :data:`RANK_SILENT_S` (its process was replaced) is no longer waited for.
    """

    def __init__(self, nodes: int, since: float):
        self.nodes, self.since, self.began = nodes, since, since
        # (host, pid) -> [samples, seconds] since the window began, last report
        self._ranks: dict[tuple, list[float]] = {}

    def add(self, samples: float, seconds: float, now: float, first: bool = False,
            rank: tuple = ()) -> tuple[float, float] | None:
        """Add one rank's report of ``samples`` over the last ``seconds``; every window, return (samples/s, seconds).

        A rank's first report covers it starting (imports, rendezvous, restoring), not training: it opens a new
        window, with the rank in it. A report that began before this size did spans a change and is not counted.
        """
        if first:
            self.began = max(self.began, now - seconds)
            self._ranks = {r: [0.0, 0.0, last] for r, (_, _, last) in self._ranks.items()}
            self._ranks[rank] = [0.0, 0.0, now]
            return None
        if now - seconds < self.since:
            return None
        mine = self._ranks.setdefault(rank, [0.0, 0.0, now])  # a rank that kept running through the change (no restart)
        mine[0] += samples
        mine[1] += seconds
        mine[2] = now
        elapsed = now - self.began
        if elapsed < METER_WINDOW_S:
            return None
        self._ranks = {r: v for r, v in self._ranks.items() if now - v[2] < RANK_SILENT_S}
        if any(t <= 0 for _, t, _ in self._ranks.values()):
            return None
        rate = sum(n / t for n, t, _ in self._ranks.values())
        if rate <= 0:
            return None
        self.began = now
        self._ranks = {r: [0.0, 0.0, last] for r, (_, _, last) in self._ranks.items()}
        return rate, elapsed


__all__ = ["METER_WINDOW_S", "RANK_SILENT_S", "Meter"]

"""Which pilots are alive: when each was last heard from, and which have been silent past the deadline.

A pilot's agent sends a heartbeat every ``heartbeat_s``; one silent longer
than ``heartbeat_deadline_s`` is lost (its nodes go, its jobs hear of it). The
pilots are kept in the order they were last heard, oldest first, so a pass
looks at the silent ones only — O(pilots lost), not O(pilots), with thousands
of them. A controller that was itself stalled (stopped, a slow disk) does not
count its own stall as the agents' silence.
"""

from __future__ import annotations

from collections import OrderedDict


class Heard:
    """Live pilot -> when it was last heard from, oldest first."""

    def __init__(self, deadline_s: float, stall_s: float):
        """``deadline_s``: the silence that loses a pilot; ``stall_s``: a gap between two passes of the controller
        longer than this was the controller's own stall, and silence is counted from its end."""
        self.deadline_s, self.stall_s = deadline_s, stall_s
        self._last: OrderedDict[str, float] = OrderedDict()
        self._floor = 0.0  # after our own stall, silence is counted from here

    def __contains__(self, pilot_id: str) -> bool:
        return pilot_id in self._last

    def __len__(self) -> int:
        return len(self._last)

    def hear(self, pilot_id: str, now: float) -> None:
        """``pilot_id`` said something at ``now``: it moves to the end of the line."""
        self._last.pop(pilot_id, None)
        self._last[pilot_id] = now

    def forget(self, pilot_id: str) -> None:
        """A pilot that ended, or went back to the queue: it is not waited for any more."""
        self._last.pop(pilot_id, None)

    def silent(self, now: float, last_pass: float | None) -> list[tuple[str, float]]:
        """The pilots silent past the deadline at ``now``, oldest first, each with how long (``last_pass``: when the
        controller's previous pass ran); they are forgotten here."""
        if last_pass is not None and now - last_pass > self.stall_s:
            self._floor = now  # we were stalled: the agents were not silent
        gone: list[tuple[str, float]] = []
        while self._last:
            pilot_id, last = next(iter(self._last.items()))
            silent = now - max(last, self._floor)
            if silent <= self.deadline_s:
                break
            del self._last[pilot_id]
            gone.append((pilot_id, silent))
        return gone

"""The batch system as the controller calls it: a command that fails or hangs is logged, never fatal, and backed off.

Every call the controller and the pilot manager make into the batch system (poll, idle nodes, capacity, release,
cancel, adopt, close) goes through :meth:`SchedulerGateway.call`. After a failure, that kind of call is skipped for a
while (doubling from 1 s up to five minutes), so a batch system that hangs costs one timeout per back-off period,
not one per tick; the journal says what failed and when it is tried again, and so does the progress line (a notice,
until a call of that kind succeeds): an unreachable batch system is not a campaign quietly training nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..schedulers.base import BatchScheduler
from ..schedulers.commands import reason_of
from .notices import Notices
from .world import World

log = logging.getLogger("pilotfill.controller")

BACKOFF_MAX_S = 300.0


class SchedulerGateway:
    def __init__(self, scheduler: BatchScheduler, world: World, clock: Callable[[], float], notices: Notices):
        self.scheduler = scheduler
        self.world = world
        self.clock = clock
        self.notices = notices
        self._backoff: dict[str, tuple[float, float]] = {}  # kind of call -> (not before, last delay)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when it failed (logged and journaled) or its kind ``what`` is backed off."""
        now = time.monotonic()
        if now < self._backoff.get(what, (0.0, 0.0))[0]:
            return None
        try:
            result = fn(*args)
        except Exception as exc:
            _, delay = self._backoff.get(what, (0.0, 0.0))
            delay = min(BACKOFF_MAX_S, max(1.0, delay * 2))
            self._backoff[what] = (time.monotonic() + delay, delay)
            log.error("scheduler %s failed (next try in %.0f s): %s", what, delay, exc)
            now = self.clock()
            self.world.log("scheduler.error", now, during=what, error=str(exc)[-1000:], retry_in_s=delay)
            if what != "close":
                self.notices.say(f"scheduler.{what}",
                                 f"{self.scheduler.title} did not answer ({what}): {reason_of(exc)}",
                                 now, retry_at=now + delay)
            return None
        if self._backoff.pop(what, None) is not None:
            self.notices.clear(f"scheduler.{what}")
        return result


__all__ = ["BACKOFF_MAX_S", "SchedulerGateway"]

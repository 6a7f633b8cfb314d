"""The fill strategy: pilots sized to demand, and nodes nobody needs given back at once.

Demand is asked of the allocator itself: "if every node the main workload
leaves idle were ours, how many would you use?" — so pilotfill never submits a
pilot it would release a moment later, and never holds a node the main
workload could be using. After every allocation, held nodes that no job got
are released (the whole pilot when it has no node left).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable

from ..allocator import Problem, allocate
from ..config import PilotConfig
from ..schedulers.base import BatchScheduler
from ..state import State

log = logging.getLogger("pilotfill.pilots")

SETTLE_S = 2.0
"""How long a growth waits for the other pilots of the same request to arrive."""


class PilotManager:
    def __init__(self, scheduler: BatchScheduler, state: State, config: PilotConfig):
        self.scheduler = scheduler
        self.state = state
        self.config = config
        self._requested: dict[str, int] = {}  # queued pilot -> nodes asked for
        self._asked_at: dict[str, float] = {}  # queued pilot -> when
        self._release: dict[str, set[str]] = {}  # pilot -> nodes to drop, told at its next heartbeat

    def fill(self, problem_for: Callable[[int], Problem], now: float) -> int:
        """Submit pilots for the nodes the allocator would use but we do not hold; return nodes asked for."""
        queued = {p["id"] for p in self.state.pilots(("queued",))}
        self._requested = {p: n for p, n in self._requested.items() if p in queued}
        self._asked_at = {p: t for p, t in self._asked_at.items() if p in queued}
        idle = self.scheduler.idle_nodes()
        if idle == 0 or not self.state.jobs(("pending", "running")):
            return 0
        pending = sum(self._requested.values())
        problem = problem_for(idle + pending)
        if not problem.jobs:
            return 0
        wanted = sum(allocate(problem).counts.values())
        ready = len(problem.pool.nodes) - idle - pending
        missing = min(wanted - ready - pending, idle)
        asked = 0
        for _ in range(math.ceil(max(0, missing) / self.config.nodes_per_pilot)):
            size = min(self.config.nodes_per_pilot, missing - asked)
            pilot = f"p{secrets.token_hex(4)}"
            try:
                scheduler_id = self.scheduler.submit_pilot(pilot, size)
            except Exception as exc:  # the batch system said no: log it, try again next tick
                log.warning("pilot submission failed: %s", exc)
                self.state.log("pilot.submit_failed", error=str(exc))
                break
            self.state.upsert_pilot(pilot, scheduler_id=scheduler_id, state="queued", submitted=now, controller=0)
            self.state.log("pilot.submitted", pilot=pilot, scheduler_id=scheduler_id, nodes=size)
            self._requested[pilot] = size
            self._asked_at[pilot] = now
            asked += size
        return asked

    def settling(self, now: float, window_s: float = SETTLE_S) -> bool:
        """True while pilots asked for moments ago have not all arrived: growing now would mean
        growing again a moment later, paying the rescale cost twice."""
        queued = {p["id"] for p in self.state.pilots(("queued",))}
        return any(now - t < window_s for p, t in self._asked_at.items() if p in queued)

    def give_back_unused(self, now: float) -> list[str]:
        """Release every ready node that the last allocation left without a job."""
        unused: dict[str, list[str]] = {}
        for node in self.state.nodes():
            if node["state"] == "ready" and node["job"] is None and node["pilot"]:
                unused.setdefault(node["pilot"], []).append(node["name"])
        released = []
        for pilot, nodes in unused.items():
            try:
                given = self.scheduler.release(pilot, nodes)
            except Exception as exc:  # logged with the command; the nodes stay held and are retried
                log.warning("releasing %s from %s failed: %s", nodes, pilot, exc)
                self.state.log("pilot.release_failed", pilot=pilot, nodes=nodes, error=str(exc))
                continue
            for n in given:
                self.state.set_node(n, state="gone", since=now)
                self.state.log("node.released", pilot=pilot, node=n)
            self._release.setdefault(pilot, set()).update(given)
            released += given
        return released

    def released(self, pilot: str) -> list[str]:
        """Nodes the pilot's agent should stop holding (drained once told)."""
        return sorted(self._release.pop(pilot, set()))

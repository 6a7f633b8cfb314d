"""A batch system driven by a recorded node-availability trace, on a simulated clock.

``pilotfill replay`` runs the real controller against this instead of PBS or
Slurm (DESIGN, "One controller, two clocks"). It behaves as a batch system
does to pilots, at the level that matters to what a site sees:

* the trace says which nodes the main workload leaves idle; ``idle_nodes``
  counts them, less the nodes our queued pilots asked for (as the PBS and
  Slurm adapters do);
* a pilot is queued on submission and starts ``queue_delay_s`` later on up to
  the nodes it asked for that are idle then (a node range, as Slurm's
  ``-N 1-n``), or waits until one is;
* when the trace takes back a node a pilot holds, the pilot is preempted: its
  agent gets SIGTERM (here: a ``pilot.leaving`` message in :attr:`outbox`) and
  the pilot ends ``grace_s`` later; a pilot reaching its walltime does the
  same;
* released nodes go back to the main workload at once; a pilot with no node
  left ends;
* on a typed machine (the trace's node-type map, ``typed=True``) idle nodes
  are counted per type and a pilot asks for one type and starts on idle nodes
  of that type only, as a Slurm ``--constraint`` or a PBS select resource
  would have it. With ``typed=False`` the same machine is offered type-blind:
  a pilot takes any idle nodes.

What the simulated agents would send (``pilot.register``, ``pilot.leaving``)
collects in :attr:`outbox` for the replay driver to deliver as messages, so
the controller learns of nodes exactly as it does from real agents. It also
counts what an administrator would see: submissions, cancellations, releases,
and nodes started on again within a minute of being released.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..lifecycle import PilotState
from ..protocol import PilotLeaving, PilotRegister
from ..traces import Trace
from .base import BatchScheduler, EndReason, EventKind, PilotEvent

log = logging.getLogger("pilotfill.schedulers.replay")

REREQUEST_WINDOW_S = 60.0


@dataclass
class _Pilot:
    id: str
    job_id: str
    requested: int
    start_at: float
    node_type: str | None = None
    nodes: list[str] = field(default_factory=list)
    state: PilotState = PilotState.QUEUED  # queued | running | leaving
    end_at: float = math.inf  # when a leaving pilot is gone
    walltime_end: float = math.inf


@dataclass
class ReplayCounts:
    submitted: int = 0
    started: int = 0
    cancelled: int = 0
    preempted: int = 0
    walltime_ends: int = 0
    released: int = 0
    rerequested_within_60s: int = 0
    idle_transitions: int = 0  # times the trace made a node idle (the initial idle nodes included)


class ReplayScheduler(BatchScheduler):
    name = "replay"

    def __init__(
        self,
        trace: Trace,
        queue_delay_s: float = 0.0,
        grace_s: float = 5.0,
        walltime_s: float = 6 * 3600.0,
        typed: bool = False,
    ):
        self.trace = trace
        self.queue_delay_s, self.grace_s, self.walltime_s = queue_delay_s, grace_s, walltime_s
        self.typed = typed and bool(trace.types)
        self.now = trace.start
        # idle, held by no pilot
        self.free: dict[str, None] = dict.fromkeys(n for n in trace.nodes if n in trace.initial_idle)
        self._free_types: dict[str, dict[str, None]] = {}  # typed: the free nodes of each type, in the same order
        if self.typed:
            for t in trace.type_counts():
                self._free_types[t] = {}
            for n in self.free:
                self._free_types[trace.types[n]][n] = None
        self.main_busy: set[str] = {n for n in trace.nodes if n not in trace.initial_idle}
        self.holder: dict[str, str] = {}  # node -> pilot holding it
        self.pilots: dict[str, _Pilot] = {}
        self.queued: dict[str, _Pilot] = {}
        self.outbox: list[dict[str, Any]] = []
        self.counts = ReplayCounts(idle_transitions=len(self.free))
        self._events: list[PilotEvent] = []
        self._timers: list[tuple[float, int, str, str]] = []  # (time, tiebreak, pilot, what): start / end / walltime
        self._tick = 0
        self._released_at: dict[str, float] = {}
        self._step = 0

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        return max(0, len(self.free) - sum(p.requested for p in self.queued.values()))

    def idle_by_type(self) -> dict[str, int] | None:
        if not self.typed:
            return None
        out = {t: len(free) for t, free in self._free_types.items()}
        for p in self.queued.values():
            if p.node_type in out:
                out[p.node_type] = max(0, out[p.node_type] - p.requested)
        return out

    def capacity(self) -> int:
        return len(self.trace.nodes)

    def submit_pilot(self, pilot_id: str, nodes: int, node_type: str | None = None) -> str:
        if self.typed and node_type not in self._free_types:
            raise ValueError(
                f"no node type {node_type!r} on this machine (it has {', '.join(sorted(self._free_types))})"
            )
        self.counts.submitted += 1
        job_id = f"replay.{self.counts.submitted}"
        pilot = _Pilot(
            pilot_id, job_id, max(1, nodes), self.now + self.queue_delay_s, node_type if self.typed else None
        )
        self.pilots[pilot_id] = self.queued[pilot_id] = pilot
        self._timer(pilot.start_at, pilot_id, "start")
        return job_id

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        pilot = self.pilots.get(pilot_id)
        if pilot is None or pilot.state != PilotState.RUNNING:
            return list(nodes)
        given = [n for n in nodes if self.holder.get(n) == pilot_id]
        for n in given:
            del self.holder[n]
            pilot.nodes.remove(n)
            self._released_at[n] = self.now
            if n not in self.main_busy:
                self._free(n)
        self.counts.released += len(given)
        if not pilot.nodes:
            self._end(pilot, "released every node")
        return given

    def cancel(self, pilot_id: str) -> None:
        pilot = self.pilots.get(pilot_id)
        if pilot is None:
            return
        if pilot.state == PilotState.QUEUED:
            self.counts.cancelled += 1
            del self.queued[pilot_id]
            del self.pilots[pilot_id]
            self._events.append(
                PilotEvent(
                    EventKind.ENDED, pilot_id, pilot.job_id, detail="cancelled while queued", reason=EndReason.CANCELLED
                )
            )
        elif pilot.state == PilotState.RUNNING:
            self._terminate(pilot, "cancelled")

    def poll(self, now: float) -> list[PilotEvent]:
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        for pilot in list(self.pilots.values()):
            if pilot.state == PilotState.QUEUED:
                self.cancel(pilot.id)
            else:
                self._end(pilot, "closed")

    # ------------------------------------------------------------ the simulated clock

    def next_time(self) -> float:
        """When this batch system next changes on its own: a trace row, a pilot starting or ending."""
        t = self.trace.steps[self._step].time if self._step < len(self.trace.steps) else math.inf
        while self._timers and self._stale(self._timers[0]):
            heapq.heappop(self._timers)
        if self._timers:
            t = min(t, self._timers[0][0])
        return t

    def advance(self, t: float) -> None:
        """Move the clock to ``t``: trace rows up to it, then pilots that start, end or reach their walltime."""
        self.now = t
        while self._step < len(self.trace.steps) and self.trace.steps[self._step].time <= t:
            self._apply(self.trace.steps[self._step])
            self._step += 1
        while self._timers and self._timers[0][0] <= t:
            _, _, pilot_id, what = heapq.heappop(self._timers)
            pilot = self.pilots.get(pilot_id)
            if pilot is None:
                continue
            if what == "start" and pilot.state == PilotState.QUEUED:
                self._start(pilot)
            elif what == "end" and pilot.state == PilotState.LEAVING and pilot.end_at <= t:
                self._end(pilot, "after its grace period")
            elif what == "walltime" and pilot.state == PilotState.RUNNING and pilot.walltime_end - self.grace_s <= t:
                # SIGTERM a grace before
                self.counts.walltime_ends += 1
                self._terminate(pilot, "walltime")
        # Queued pilots whose start time passed while nothing was idle start as soon as a node is.
        if self.free and self.queued:
            for pilot in [p for p in self.queued.values() if p.start_at <= t]:
                if not self.free:
                    break
                if self.typed and not self._free_types.get(pilot.node_type):
                    continue
                self._start(pilot)

    def startable(self, t: float) -> bool:
        """Whether a queued pilot could start at ``t`` (its start time passed and a node it may take is idle)."""
        if not self.free:
            return False
        return any(
            p.start_at <= t and (not self.typed or self._free_types.get(p.node_type)) for p in self.queued.values()
        )

    # ------------------------------------------------------------ helpers

    def _apply(self, step) -> None:
        for n in step.to_busy:
            self.main_busy.add(n)
            self._unfree(n)
            pilot_id = self.holder.get(n)
            if pilot_id is not None and self.pilots[pilot_id].state == PilotState.RUNNING:
                self.counts.preempted += 1
                self._terminate(self.pilots[pilot_id], f"preempted for {n}")
        for n in step.to_idle:
            self.main_busy.discard(n)
            self.counts.idle_transitions += 1
            if n not in self.holder:
                self._free(n)

    def _start(self, pilot: _Pilot) -> None:
        source = self._free_types.get(pilot.node_type, {}) if self.typed else self.free
        take = list(islice(source, pilot.requested))
        if not take:
            return
        for n in take:
            self._unfree(n)
            self.holder[n] = pilot.id
            released = self._released_at.pop(n, None)
            if released is not None and self.now - released < REREQUEST_WINDOW_S:
                self.counts.rerequested_within_60s += 1
                log.info(
                    "node %s taken again by pilot %s %.1f s after its release (t=%.0f)",
                    n,
                    pilot.id,
                    self.now - released,
                    self.now,
                )
        del self.queued[pilot.id]
        pilot.nodes, pilot.state = take, PilotState.RUNNING
        pilot.walltime_end = self.now + self.walltime_s
        self._timer(max(self.now, pilot.walltime_end - self.grace_s), pilot.id, "walltime")
        self.counts.started += 1
        self._events.append(
            PilotEvent(EventKind.STARTED, pilot.id, pilot.job_id, tuple(take), deadline=pilot.walltime_end)
        )
        self.outbox.append(PilotRegister(pilot.id, list(take), pilot.job_id, 0).to_dict())

    def _terminate(self, pilot: _Pilot, why: str) -> None:
        """SIGTERM: the agent says it is leaving; the pilot is gone after the grace period."""
        pilot.state, pilot.end_at = PilotState.LEAVING, self.now + self.grace_s
        self._timer(pilot.end_at, pilot.id, "end")
        self._events.append(
            PilotEvent(
                EventKind.PREEMPTED, pilot.id, pilot.job_id, tuple(pilot.nodes), deadline=pilot.end_at, detail=why
            )
        )
        self.outbox.append(PilotLeaving(pilot.id, list(pilot.nodes), pilot.end_at).to_dict())

    def _end(self, pilot: _Pilot, why: str) -> None:
        for n in pilot.nodes:
            self.holder.pop(n, None)
            if n not in self.main_busy:
                self._free(n)
        self.pilots.pop(pilot.id, None)
        self.queued.pop(pilot.id, None)
        self._events.append(PilotEvent(EventKind.ENDED, pilot.id, pilot.job_id, tuple(pilot.nodes), detail=why))
        pilot.nodes = []

    def _free(self, n: str) -> None:
        self.free[n] = None
        if self.typed:
            self._free_types[self.trace.types[n]][n] = None

    def _unfree(self, n: str) -> None:
        self.free.pop(n, None)
        if self.typed:
            self._free_types[self.trace.types[n]].pop(n, None)

    def _timer(self, t: float, pilot_id: str, what: str) -> None:
        self._tick += 1
        heapq.heappush(self._timers, (t, self._tick, pilot_id, what))

    def _stale(self, timer: tuple[float, int, str, str]) -> bool:
        _, _, pilot_id, what = timer
        pilot = self.pilots.get(pilot_id)
        if pilot is None:
            return True
        return {
            "start": pilot.state != PilotState.QUEUED,
            "end": pilot.state != PilotState.LEAVING,
            "walltime": pilot.state != PilotState.RUNNING,
        }[what]

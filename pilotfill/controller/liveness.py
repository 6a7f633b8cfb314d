"""Which pilots and nodes are still ours: what the batch system says, who is heard from, whose walltime ends.

Three ways a pilot's nodes go without a message from its agent, each ending in
the controller's one ``remove_nodes`` (and ``end_pilot``: :class:`~pilotfill.pilots.manager.Ends`):

* the batch system says so when polled (:meth:`Liveness.on_pilot_event`: it
  started, is preempted, was requeued, ended);
* the agent went silent (:class:`LastHeard`): it sends a heartbeat every
  ``heartbeat_s``, and one silent longer than ``heartbeat_deadline_s`` is lost.
  The pilots are kept in the order they were last heard, oldest first, so a
  pass looks at the silent ones only — O(pilots lost), not O(pilots), with
  thousands of them. A controller that was itself stalled (stopped, a slow
  disk) does not count its own stall as the agents' silence;
* its walltime ends (:mod:`.walltime`): its nodes leave their jobs before the
  batch system acts, or at a job's commit just before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ..allocator import Profiler
from ..lifecycle import JobStatus, NodeState, PilotState, Removal
from ..pilots.manager import Ends
from ..reasons import NodeWhy
from ..schedulers.base import BatchScheduler, EndReason, EventKind, PilotEvent
from .gateway import SchedulerGateway
from .walltime import Walltimes
from .world import Job, World


class LastHeard:
    """Live pilot -> when it was last heard from, oldest first."""

    def __init__(self, deadline_s: float, stall_s: float):
        """``deadline_s``: the silence that loses a pilot; ``stall_s``: a gap between two passes of the controller
        longer than this was the controller's own stall, and silence is counted from its end."""
        self.deadline_s, self.stall_s = deadline_s, stall_s
        self._last: OrderedDict[str, float] = OrderedDict()
        self._floor = 0.0  # after our own stall, silence is counted from here

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


class Liveness:
    """What the batch system said of the pilots, which are silent, whose walltime ends: their nodes removed through
    ``ends`` (the controller's ``remove_nodes`` and ``end_pilot``)."""

    def __init__(self, world: World, heard: LastHeard, walltimes: Walltimes, gateway: SchedulerGateway,
                 scheduler: BatchScheduler, profiler: Profiler, ends: Ends, changed: Callable[[], None]):
        """``changed()``: the allocation must be decided again (a pilot ended)."""
        self.world, self.heard, self.walltimes = world, heard, walltimes
        (self.gateway, self.scheduler, self.profiler, self.ends,
         self.changed) = gateway, scheduler, profiler, ends, changed

    def on_pilot_event(self, event: PilotEvent, now: float, polled_before: float) -> None:
        """What the batch system said (``polled_before``: when it was asked the time before it said this)."""
        world = self.world
        pilot = world.pilot_of(event.pilot)
        if event.kind == EventKind.STARTED:
            world.log("pilot.started", now, pilot=event.pilot, scheduler_id=event.scheduler_id,
                      nodes=list(event.nodes), walltime_end=event.deadline)
            if pilot is not None:
                world.set_pilot(pilot, scheduler_id=event.scheduler_id, walltime_end=event.deadline)
                self.walltimes.track(pilot.id, event.deadline)
        elif event.kind == EventKind.PREEMPTED:
            world.log("pilot.preempted", now, pilot=event.pilot, nodes=list(event.nodes), deadline=event.deadline)
            if pilot is not None:  # the agent says so too (SIGTERM); whichever comes first moves the nodes
                self.ends.remove_nodes(event.nodes or list(pilot.nodes), now, NodeWhy.LEAVING, Removal.LEAVING,
                                       deadline=event.deadline, taken=True)
        elif event.kind == EventKind.ENDED and event.reason == EndReason.REQUEUED:
            # Preempted with preempt_order R: the same batch job waits to run again, with its nodes back;
            # its next agent registers as it. Unless that agent already did (it ran again between two polls).
            world.log("pilot.requeued", now, pilot=event.pilot, why=event.detail)
            if pilot is not None and not (pilot.state == PilotState.RUNNING and pilot.registered_at > polled_before):
                self.ends.remove_nodes(list(pilot.nodes), now, NodeWhy.PILOT_REQUEUED, Removal.GONE, taken=True,
                                       detail=event.detail)
                world.set_pilot(pilot, state=PilotState.QUEUED, nodes=[])
                self.heard.forget(pilot.id)
        elif event.kind == EventKind.ENDED:
            world.log("pilot.ended", now, pilot=event.pilot, why=event.detail)
            if pilot is not None:
                self.ends.remove_nodes(list(pilot.nodes), now, NodeWhy.PILOT_ENDED, Removal.GONE,
                                       taken=event.reason != EndReason.CANCELLED, detail=event.detail or None)
                self.ends.end_pilot(pilot, "ended", now)
                self.changed()

    def check_heartbeats(self, now: float, last_pass: float | None) -> None:
        """Pilots silent past the deadline are lost (:class:`LastHeard`: oldest first, O(pilots lost), not
        O(pilots))."""
        for pilot_id, silent in self.heard.silent(now, last_pass):
            pilot = self.world.pilot_of(pilot_id)
            if pilot is None or pilot.state == PilotState.QUEUED:
                continue
            self.world.log("pilot.lost", now, pilot=pilot_id, silent_s=round(silent, 1))
            self.ends.remove_nodes(list(pilot.nodes), now, NodeWhy.PILOT_SILENT, Removal.GONE, event="node.lost")
            self.ends.end_pilot(pilot, "lost", now)
            self.gateway.call("cancel", self.scheduler.cancel, pilot_id)

    def drain_walltimes(self, now: float) -> None:
        """Pilots at ``end - lead``: their nodes leave their jobs, as on a preemption notice, before the batch system
        acts."""
        world = self.world
        for pilot_id, end in self.walltimes.drained(now):
            pilot = world.pilots.get(pilot_id)
            nodes = ([n for n in pilot.nodes if world.nodes[n].state == NodeState.READY]
                     if pilot is not None and pilot.walltime_end == end else [])
            if nodes:
                world.log("pilot.walltime", now, pilot=pilot_id, end=end, nodes=nodes)
                self.ends.remove_nodes(nodes, now, NodeWhy.WALLTIME, Removal.LEAVING, deadline=end, taken=True)

    def leave_at_commit(self, job: Job, now: float) -> None:
        """A job that just committed leaves the nodes of pilots whose drain is due within its commit interval: it
        loses nothing."""
        if job.status != JobStatus.RUNNING:
            return
        window = self.profiler.cost(job.id, "commit", 0.0)
        by_end: dict[float, list[str]] = {}
        for node in self.world.nodes_of(job.nodes):
            end = self.walltimes.in_window(node.pilot, now, window)
            if end is not None:
                by_end.setdefault(end, []).append(node.name)
        for end, nodes in by_end.items():
            self.ends.remove_nodes(nodes, now, NodeWhy.WALLTIME_AT_COMMIT, Removal.LEAVING, deadline=end,
                                   taken=True)

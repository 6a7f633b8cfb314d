"""What the pilots' agents ask the controller — register, heartbeat, leaving — and when a waiting heartbeat is
answered.

An agent registers the nodes its pilot holds (a node another pilot had is taken from it first: that pilot ended without
telling), then long-polls with heartbeats: each reports the processes that ended on its nodes and waits, up to the
heartbeat interval, for commands (launch or end a process, give nodes back, stop). A heartbeat with nothing to say is
parked (:class:`~pilotfill.transport.Park`) and woken once something for its pilot is committed (:class:`Wakes`). A
pilot that got SIGTERM says it is leaving: its nodes go through the controller's one ``remove_nodes``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..lifecycle import NodeState, PilotState, Removal
from ..pilots.launcher import AgentLauncher
from ..pilots.manager import Ends, PilotManager
from ..protocol import (
    PilotHeartbeat,
    PilotHeartbeatReply,
    PilotLeaving,
    PilotLeavingReply,
    PilotRegister,
    PilotRegisterReply,
)
from ..reasons import NodeWhy
from ..transport import Park
from .liveness import LastHeard
from .recovery import Adoption
from .world import World


class Wakes:
    """Pilots with news whose parked heartbeat is answered once what caused the news is committed (:meth:`flush`).

    ``wake``: answers a pilot's parked heartbeat now; set by the process that serves messages (None: nothing parks)."""

    def __init__(self) -> None:
        self.wake: Callable[[str], object] | None = None
        self._due: set[str] = set()

    def later(self, pilot_id: str) -> None:
        """A pilot has news: answer its parked heartbeat after the commit."""
        self._due.add(pilot_id)

    def flush(self) -> None:
        """What was committed is out: wake each pilot with news."""
        if self._due and self.wake is not None:
            for pilot_id in self._due:
                self.wake(pilot_id)
        self._due.clear()


class PilotHandlers:
    """The handlers of the pilots' messages. ``ends``: the controller's ``remove_nodes``; ``changed()``: the pool
    changed, the next pass decides again."""

    def __init__(self, world: World, heard: LastHeard, launcher: AgentLauncher, pilots: PilotManager, wakes: Wakes,
                 ends: Ends, incarnation: int, heartbeat_s: float, changed: Callable[[], None],
                 adoption: Adoption | None = None):
        """``adoption``: the jobs' processes this controller adopted from its predecessor, per pilot
        (controller/recovery.py)."""
        (self.world, self.heard, self.launcher, self.pilots, self.wakes,
         self.ends) = world, heard, launcher, pilots, wakes, ends
        self.incarnation, self.heartbeat_s, self._changed = incarnation, heartbeat_s, changed
        self.adoption = adoption or Adoption()

    def register(self, message: PilotRegister, now: float) -> PilotRegisterReply:
        """A pilot's agent started: its nodes join the pool (a pilot we already ended is told to stop)."""
        world = self.world
        pilot = world.pilot_of(message.pilot)
        if pilot is None:
            if message.pilot in world.ended_pilots:
                return PilotRegisterReply(stop=True)
            pilot = world.add_pilot(message.pilot, message.scheduler_id, len(message.nodes), now, self.incarnation)
        taken = [n for n in message.nodes
                 if n in world.nodes and world.nodes[n].state != NodeState.GONE and world.nodes[n].pilot != pilot.id]
        # a pilot that ended without telling us
        self.ends.remove_nodes(taken, now, NodeWhy.TAKEN_OVER, Removal.GONE)
        world.set_pilot(pilot, state=PilotState.RUNNING, scheduler_id=message.scheduler_id or pilot.scheduler_id,
                        pid=message.pid, nodes=[n for n in pilot.nodes if n in message.nodes])
        for name in message.nodes:
            if name not in pilot.nodes or world.nodes[name].state != NodeState.READY:
                world.node_joins(name, pilot, now)
                world.log("node.joined", now, pilot=pilot.id, node=name)
        pilot.registered_at = now
        self.heard.hear(pilot.id, now)
        self.pilots.arrived(pilot, now)
        self._changed()
        return PilotRegisterReply()

    def heartbeat(self, message: PilotHeartbeat, now: float) -> PilotHeartbeatReply | Park:
        """A pilot is alive; it reports the processes that ended on its nodes and waits for commands (a long poll)."""
        pilot = self.world.pilot_of(message.pilot)
        if pilot is None:
            ended = message.pilot in self.world.ended_pilots
            return PilotHeartbeatReply(register=not ended, stop=ended, incarnation=self.incarnation)
        if pilot.state == PilotState.QUEUED:
            return PilotHeartbeatReply(register=True, stop=False, incarnation=self.incarnation)
        self.heard.hear(pilot.id, now)
        if message.exits is not None:
            self.launcher.reported(message.exits)
        answer = (self.adoption.answered(pilot.id, message.running, message.exits)
                  if message.running is not None else None)
        if answer is not None:
            kept, lost = answer
            self.world.log("ranks.adopted", now, pilot=pilot.id, kept=[list(p) for p in kept],
                           lost=[list(p) for p in lost])
            for host, job_id in lost:
                node = self.world.nodes.get(host)
                # kept for its job, but nothing of it runs there: a node it lost
                if node is not None and node.job == job_id:
                    self.ends.remove_nodes([host], now, NodeWhy.RANK_NOT_ADOPTED, Removal.FROM_JOB, detail=job_id)
        wait = message.wait_s
        if self.wakes.wake is not None and isinstance(wait, (int, float)) and wait > 0 and not self._has_news(pilot.id):
            # answered later with the same typed reply, made then (the transport sends its to_dict())
            return Park(pilot.id, min(float(wait), self.heartbeat_s), lambda: self.reply(pilot.id))
        return self.reply(pilot.id)

    def reply(self, pilot_id: str) -> PilotHeartbeatReply:
        """What a pilot's agent is told: nodes to give back, commands for its nodes, whether to stop."""
        live = pilot_id in self.world.pilots
        # ``keep``: until the agent says which still run (its next heartbeat's ``running``)
        return PilotHeartbeatReply(release=self.pilots.released(pilot_id),
                                   commands=self.launcher.commands_for(pilot_id), stop=not live, register=False,
                                   incarnation=self.incarnation, keep=self.adoption.ask(pilot_id) if live else None)

    def leaving(self, message: PilotLeaving, now: float) -> PilotLeavingReply:
        """The batch system told a pilot to go (SIGTERM): its nodes leave their jobs now, gone within the grace. A pilot
        the batch system already requeued (its poll came first: both orders are normal) stays queued — this run's
        nodes are gone already."""
        pilot = self.world.pilot_of(message.pilot)
        if pilot is not None and pilot.state not in (PilotState.LEAVING, PilotState.QUEUED):
            self.world.set_pilot(pilot, state=PilotState.LEAVING)
        self.ends.remove_nodes(message.nodes, now, NodeWhy.LEAVING, Removal.LEAVING, deadline=message.deadline,
                               taken=True)
        return PilotLeavingReply()

    def _has_news(self, pilot_id: str) -> bool:
        return (self.launcher.pending(pilot_id) or self.pilots.has_release(pilot_id)
                or pilot_id not in self.world.pilots or self.adoption.pending(pilot_id))

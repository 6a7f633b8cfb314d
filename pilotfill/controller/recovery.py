"""Taking over from a controller that died: what still runs is adopted, what cannot go on is requeued, the rest killed.

A controller's supervisor (``pilotfill run``) restarts it on the same run directory, and the journal says what its
predecessor knew. Training that runs on healthy nodes must not notice (issue 54: controller deaths a minute apart
relaunched every running training from its last commit). :class:`TakeOver` is the whole story, in this order:

1. **Pilots.** Those the batch system still runs are adopted: their agents reconnect and carry on (the local cluster
   re-attaches to its agents as PBS's adapter does to its jobs: :meth:`LocalScheduler.adopt`). The others are lost
   and their nodes go, as any node goes; a job on them shrinks.
2. **Jobs.** A running job is adopted when its ranks can go on: some of its nodes are on adopted pilots, and its runtime
   rebuilds what it knew of the job from what it left for a successor (``Runtime.adopt``: torch adopts the store, which
   outlived the controller, and the job's rendezvous round; the processes runtime needs only the hosts). The job stays
   running on its nodes: no restart, no rollback to its commit, no new rendezvous round unless its hosts must change.
   Every other running job goes back to the queue and resumes from its last commit: its runtime cannot adopt it
   (Horovod: ``horovodrun`` is the controller's child and dies with it), no node of it is on an adopted pilot, or a
   new campaign starts on the run directory (its jobs wait to be claimed by its calls).
3. **Processes.** What the predecessor ran on this machine and nobody adopted is killed (each adapter and runtime
   records what it adopts as this controller's, under its incarnation).
4. **Agents.** Each adopted pilot's agent is told with its next heartbeats which jobs' processes to keep
   (:class:`Adoption`); it ends the others and answers with the kept ones still running. A kept rank that is gone
   (it ended while nobody listened, or its start never reached the agent) is a node its job lost.

What a restart still costs a running job: the seconds its ranks wait for the new controller to answer their reports,
and its measured throughput (JPA measures it again from the next reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import procs
from ..elastic.base import Runtime
from ..lifecycle import JobStatus, NodeState, Removal
from ..pilots.manager import Ends
from ..reasons import NodeWhy
from ..schedulers.base import BatchScheduler
from ..journal import Journal
from .gateway import SchedulerGateway
from .liveness import LastHeard
from .world import Job, World


class Adoption:
    """The jobs' processes a new controller adopted, per pilot, until the pilot's agent says which still run.

    Each reply to the agent's heartbeat carries them (``keep``) until a later heartbeat answers (``running``): the agent
    ends every other job process on its nodes when it sees the new controller, and a kept process it no longer runs is
    a rank its job lost. Only an answer to this controller's own question counts: an agent still answering the
    previous controller's (it died meanwhile) has not yet been told what this one keeps."""

    def __init__(self) -> None:
        self._kept: dict[str, set[tuple[str, str]]] = {}  # pilot -> (node, job) adopted there, not yet confirmed
        self._asked: set[str] = set()  # pilots told what to keep in a reply

    def claim(self, pilot: str, host: str, job: str) -> None:
        """``job``'s rank on ``host`` (a node of ``pilot``) was adopted."""
        self._kept.setdefault(pilot, set()).add((host, job))

    def expect(self, pilot: str) -> None:
        """``pilot`` was adopted: its agent is told what to keep, even nothing."""
        self._kept.setdefault(pilot, set())

    def pending(self, pilot: str) -> bool:
        """Whether ``pilot``'s agent has yet to be told, or to answer (its heartbeat is answered at once)."""
        return pilot in self._kept

    def ask(self, pilot: str) -> list[list[str]] | None:
        """What ``pilot``'s agent is told to keep in a reply ([node, job] pairs), or None once it has answered."""
        kept = self._kept.get(pilot)
        if kept is None:
            return None
        self._asked.add(pilot)
        return [list(pair) for pair in sorted(kept)]

    def answered(self, pilot: str, running: list[Any],
                 exits: list[Any] | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]] | None:
        """The agent says which job processes run on its nodes: the kept ones that do, and those that do not — nor
        ended in this very heartbeat, which is a rank's exit like any other — whose job lost the node. None: it was
        not asked yet (its answer was to a predecessor)."""
        if pilot not in self._asked or pilot not in self._kept:
            return None
        kept = self._kept.pop(pilot)
        self._asked.discard(pilot)
        runs = {(r[0], r[1]) for r in running if isinstance(r, list) and len(r) == 2}
        ended = {(e.get("host"), e.get("job")) for e in exits or () if isinstance(e, dict)}
        return sorted(kept & runs), sorted(kept - runs - ended)

    def forget(self, pilot: str) -> None:
        """The pilot is over: nothing of it to confirm."""
        self._kept.pop(pilot, None)
        self._asked.discard(pilot)


@dataclass
class TakeOver:
    """A new controller carrying on from its predecessor's journal (the module says how). ``spec_of(job, nodes)``: the
    spec the runtime runs a job with on those nodes; ``measure(job, nodes, now)``: an adopted job's rate is measured
    again from its next reports."""

    world: World
    journal: Journal
    gateway: SchedulerGateway
    scheduler: BatchScheduler
    runtime: Runtime
    heard: LastHeard
    ends: Ends
    adoption: Adoption
    spec_of: Callable[[Job, list[str]], dict[str, Any]]
    measure: Callable[[Job, int, float], None]
    incarnation: int
    now: float
    new_campaign: bool
    keep_ended_pilots: int
    adopted_jobs: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)

    def run(self) -> None:
        """Pilots, then jobs, then processes (the module's steps 1-3); step 4 happens as the agents call in."""
        world, journal = self.world, self.journal
        # the predecessors', on this machine
        leftovers = [p for p in journal.processes() if p["controller"] != self.incarnation]
        with journal.transaction():
            # before lost nodes go
            ran_on = {job.id: list(job.nodes) for job in world.open.values() if job.status == JobStatus.RUNNING}
            pilots = self._adopt_pilots()
            for job in list(world.open.values()):
                if job.status == JobStatus.RUNNING:
                    (self.adopted_jobs if self._adopt_job(job, ran_on[job.id]) else self.requeued).append(job.id)
            for job in [world.jobs[j] for j in self.requeued]:
                self._requeue(job)
            adopted = set(self.adopted_jobs)
            for node in world.nodes.values():
                if node.job is not None and node.job not in adopted:
                    world.assign(node, None)  # no rank of a job that is not running survives
            if self.new_campaign:
                for job in list(world.open.values()):
                    world.hold(job)
            killed = self._kill_unadopted(leftovers)
            if leftovers or self.requeued or self.adopted_jobs or self.incarnation > 1:
                world.log("controller.recovered", self.now, incarnation=self.incarnation, killed=killed,
                          requeued=self.requeued, adopted=sorted(pilots), adopted_jobs=self.adopted_jobs)
            world.log("controller.started", self.now, incarnation=self.incarnation)
            journal.prune_ended_pilots(self.keep_ended_pilots)

    # ------------------------------------------------------------ 1. pilots

    def _adopt_pilots(self) -> set[str]:
        """Pilots the batch system still runs are adopted (heard from now); the others are lost, their nodes gone."""
        world = self.world
        live = [(p.id, p.scheduler_id) for p in world.pilots.values() if p.scheduler_id]
        # asked even with none: the local cluster's clock
        adopted = set(self.gateway.call("adopt", self.scheduler.adopt, live) or [])
        for pilot in list(world.pilots.values()):
            if pilot.id in adopted:
                self.heard.hear(pilot.id, self.now)
                self.adoption.expect(pilot.id)
                continue
            self.ends.remove_nodes(list(pilot.nodes), self.now, NodeWhy.LOST_WITH_PREDECESSOR, Removal.GONE,
                                   event="node.lost")
            self.ends.end_pilot(pilot, "lost", self.now)
        for node in list(world.nodes.values()):
            if node.state != NodeState.GONE and node.pilot not in world.pilots:
                world.set_node_state(node, "gone", self.now)
        return adopted

    # ------------------------------------------------------------ 2. jobs

    def _adopt_job(self, job: Job, ran_on: list[str]) -> bool:
        """Whether ``job`` goes on as it runs: its nodes (those left after step 1) are held for it by adopted pilots and
        its runtime takes it over on ``ran_on`` (the nodes its ranks run on). A node it lost in step 1 is a shrink the
        next decision makes, as on any loss."""
        world = self.world
        nodes = world.nodes_of(job.nodes)
        if self.new_campaign or not job.nodes or len(nodes) != len(job.nodes):
            return False
        if any(node.state != NodeState.READY or node.job != job.id or node.pilot not in world.pilots for node in nodes):
            return False
        if not self.runtime.adopt(job.id, self.spec_of(job, list(job.nodes)), ran_on):
            return False
        for node in nodes:
            self.adoption.claim(node.pilot, node.name, job.id)
        self.measure(job, len(job.nodes), self.now)
        return True

    def _requeue(self, job: Job) -> None:
        """Back to the queue: it resumes from its last commit (its ranks are gone, or are ended by their agents)."""
        self.world.requeue(job)

    # ------------------------------------------------------------ 3. processes

    def _kill_unadopted(self, leftovers: list[dict[str, Any]]) -> int:
        """Kill what a predecessor ran here that nobody adopted (re-recorded under this incarnation); returns how
        many."""
        mine = {(p["pid"], p["start_ticks"]) for p in self.journal.processes() if p["controller"] == self.incarnation}
        mine_pids = {pid for pid, _ in mine}
        killed = 0
        for p in leftovers:
            if (p["pid"], p["start_ticks"]) in mine:
                continue
            procs.kill_group(p["pid"], p["start_ticks"])
            killed += 1
            if p["pid"] not in mine_pids:
                self.journal.drop_process(p["pid"])
        return killed

"""What the controller knows now: jobs, pilots and nodes in memory, indexed, journaled on every change.

The controller must be cheap per event at whole-machine scale, so nothing on
its hot path reads a table back: every question it asks (the ready nodes, a
pilot's nodes, the jobs waiting, a node's holder) is a dictionary lookup here.
Every change goes to the journal (:class:`pilotfill.journal.Journal`) first and to
memory second, so that memory never holds what the journal lost (a full disk
raises before anything changes). Ended pilots leave memory at once; the
journal keeps a bounded number of them for ``top``.

Why the mutators write the journal themselves, rather than the controller's shell after each step: a change and its
row are one act, so no caller can make one without the other, and the write goes into the transaction the shell
opened for the pass (``Journal.transaction``: one commit per pass, before any reply). The shell decides *when* it is
durable; the world says *what* changed, once. A change log drained by the shell would hold every change twice, in
memory and in the log, on the hot path of a whole-machine pass.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..lifecycle import (
    JOB_MOVES,
    LIVE_PILOT_STATES,
    NODE_MOVES,
    PILOT_MOVES,
    TERMINAL,
    IllegalMove,
    JobStatus,
    NodeState,
    PilotState,
    checked,
)
from ..protocol import JobSpec
from ..journal import Journal
from .waiting import admit

RECENTLY_ENDED = 10_000
"""Ended pilots remembered in memory, so that a late heartbeat from one is told to stop."""


@dataclass
class Node:
    name: str
    pilot: str | None
    state: NodeState
    since: float
    job: str | None = None
    deadline: float | None = None
    node_type: str | None = None  # on a machine with several kinds of node (its pilot asked for this type)


@dataclass
class Pilot:
    id: str
    scheduler_id: str | None
    state: PilotState  # queued, running or leaving: ended and lost pilots leave memory
    submitted: float
    requested: int = 0
    nodes: dict[str, None] = field(default_factory=dict)  # held now, in registration order
    pid: int | None = None
    walltime_end: float | None = None
    controller: int = 0
    registered_at: float = 0.0  # when its agent last registered (not journaled)
    node_type: str | None = None  # the kind of node it asked for (a machine with several kinds)


@dataclass
class Job:
    id: str
    seq: int
    name: str
    spec: JobSpec  # as submitted, checked (protocol.check_spec)
    status: JobStatus
    submitted: float
    progress: float = 0.0
    nodes: list[str] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    started: float | None = None
    ended: float | None = None
    rescales: int = 0
    launches: int = 0
    crashes: int = 0
    key: str | None = None
    held: bool = False  # recovered from an earlier campaign: waits until a submission of the same call claims it
    committed: float = 0.0  # progress at its last commit: what it resumes from after a stop
    redone: float = 0.0  # samples counted, then lost to stops: work the job does twice
    overran: bool = False  # counted progress passed its declared total_samples (logged once)
    lost: set[str] = field(default_factory=set)  # nodes taken from it since the runtime last heard (not journaled)
    crash_commit: float | None = None  # its committed progress at its last counted rank crash (not journaled)
    # an adaptive batch's gradient noise scale, as its rank 0 last reported (not journaled)
    noise_scale: float | None = None

    def record(self) -> dict[str, Any]:
        """The job as clients see it (``job.get``)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("lost", "crash_commit", "noise_scale")}

    def summary(self) -> dict[str, Any]:
        """The job as views see it: without the code it ships (a shipped call can be megabytes)."""
        out = self.record()
        out["spec"] = {k: v for k, v in self.spec.items() if k != "payload"}
        return out


class World:
    """The controller's working state; one writer, the controller."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.nodes: dict[str, Node] = {}
        self.ready: dict[str, None] = {}  # ready nodes, an ordered set
        self.ready_version = 0  # moves whenever the ready nodes, or a walltime they are held within, change
        self.jobs_version = 0  # moves whenever a job is added, changes status or nodes, or is held or claimed
        # jobs added or changed since the controller last took them (:meth:`take_changed`)
        self._changed: set[str] = set()
        self.pilots: dict[str, Pilot] = {}  # live pilots only
        self.queued: dict[str, Pilot] = {}  # the live pilots not yet registered
        self.ended_pilots: OrderedDict[str, str] = OrderedDict()  # recently ended pilot -> its last state
        self.ended_order: deque[str] = deque()  # pilots ended by this controller, oldest first (journal pruning)
        self.jobs: dict[str, Job] = {}
        self.open: dict[str, Job] = {}  # pending and running jobs, in submission order (held ones aside)
        self.running: dict[str, Job] = {}  # the open jobs with ranks now
        self.held: dict[str, Job] = {}  # pending jobs of an earlier campaign, not yet claimed
        self.by_key: dict[str, str] = {}  # app-call key -> newest job for it
        self._requeueing = False  # inside requeue(): the one writer of running -> pending
        self._holding: dict[str, frozenset[str]] = {}  # job -> its nodes as a set, until they change (:meth:`holding`)
        self.counters: Counter[str] = Counter(journal.counters())
        self._seq = journal.max_job_seq()

    # ---------------------------------------------------------------- loading (recovery)

    def load(self) -> None:
        """Rebuild memory from the journal: what a new controller on the same run directory starts from."""
        for row in self.journal.jobs():
            job = Job(**{k: v for k, v in row.__dict__.items()})
            job.status = JobStatus(job.status)
            self.jobs[job.id] = job
            if job.status not in TERMINAL:
                (self.held if job.held else self.open)[job.id] = job
            if job.status == JobStatus.RUNNING:
                self.running[job.id] = job
            if job.key:
                self.by_key[job.key] = job.id
        self.jobs_version += 1
        self._changed.update(self.jobs)
        for row in self.journal.pilots(LIVE_PILOT_STATES):
            pilot = Pilot(row["id"], row["scheduler_id"], PilotState(row["state"]), row["submitted"], row["requested"],
                          dict.fromkeys(row["nodes"]), row["pid"], row["walltime_end"], row["controller"],
                          node_type=row.get("node_type"))
            self.pilots[pilot.id] = pilot
            if pilot.state == PilotState.QUEUED:
                self.queued[pilot.id] = pilot
        for row in self.journal.nodes():
            node = Node(row["name"], row["pilot"], NodeState(row["state"]), row["since"], row["job"], row["deadline"],
                        row.get("node_type"))
            self.nodes[node.name] = node
            if node.state == NodeState.READY:
                self.ready[node.name] = None
        # A pilot's nodes are its nodes' rows: its own row lists the nodes it held when it last registered, not those
        # that joined or went since (one write per node, not two), so a pilot adopted after a restart holds exactly
        # the nodes that say they are its, and every one of them goes when it does.
        for pilot in self.pilots.values():
            pilot.nodes = {n: None for n in pilot.nodes if n in self.nodes and self.nodes[n].pilot == pilot.id
                           and self.nodes[n].state != NodeState.GONE}
        for node in self.nodes.values():
            if node.state != NodeState.GONE and node.pilot in self.pilots:
                self.pilots[node.pilot].nodes.setdefault(node.name, None)
        self.ready_version += 1

    # ---------------------------------------------------------------- counters and events

    def count(self, name: str, by: int = 1) -> None:
        self.journal.set_counter(name, self.counters[name] + by)
        self.counters[name] += by

    def log(self, kind: str, now: float, **fields: Any) -> None:
        self.journal.log(kind, now=now, **fields)

    # ---------------------------------------------------------------- jobs

    def add_job(self, job_id: str, name: str, spec: JobSpec, now: float, key: str | None = None) -> Job:
        seq = self._seq + 1
        self.journal.add_job(job_id, seq, name, spec, now, key)
        self._seq = seq
        job = Job(job_id, seq, name, spec, JobStatus.PENDING, now, key=key)
        self.jobs[job_id] = job
        self.open[job_id] = job
        self.jobs_version += 1
        self._changed.add(job_id)
        if key:
            self.by_key[key] = job_id
        return job

    def take_changed(self) -> set[str]:
        """The jobs added, or changed in anything but a running job's progress, since this was last asked (the
        controller describes its waiting jobs again from these alone)."""
        changed, self._changed = self._changed, set()
        return changed

    def next_job_id(self) -> str:
        return f"j{self._seq + 1}"

    def update_job(self, job: Job, **fields: Any) -> None:
        """Change a job's journaled fields (and its place among open jobs when its status changes; a status its life
        cycle does not reach from the job's raises :class:`~pilotfill.lifecycle.IllegalMove` before anything changes).
        A running job goes back to pending only through :meth:`requeue`."""
        if "status" in fields:
            fields["status"] = checked(JOB_MOVES, "job", job.id, job.status, fields["status"])
            if job.status == JobStatus.RUNNING and fields["status"] == JobStatus.PENDING and not self._requeueing:
                raise IllegalMove(f"job {job.id}: running -> pending goes through World.requeue (its nodes freed, its "
                                  f"progress back to its commit)")
        self.journal.set_job(job.id, **fields)
        for k, v in fields.items():
            setattr(job, k, v)
        if "nodes" in fields:
            self._holding.pop(job.id, None)
        self.jobs_version += 1
        self._changed.add(job.id)
        if job.status == JobStatus.RUNNING:
            self.running[job.id] = job
        else:
            self.running.pop(job.id, None)
        if job.status in TERMINAL:
            self.open.pop(job.id, None)
            self.held.pop(job.id, None)
            self._holding.pop(job.id, None)

    def holding(self, job: Job) -> frozenset[str]:
        """The nodes ``job`` holds, as a set: made when they change, not in every decision (a decision at machine scale
        maps a thousand running jobs to their nodes). A job's nodes change only through :meth:`update_job`."""
        out = self._holding.get(job.id)
        if out is None:
            out = self._holding[job.id] = frozenset(job.nodes)
        return out

    def set_spec(self, job: Job, spec: JobSpec) -> None:
        """Replace a job's spec (a model descriptor learned from its ranks)."""
        self.journal.set_job(job.id, spec=spec)
        job.spec = spec
        self._changed.add(job.id)

    def hold(self, job: Job) -> None:
        """Set an open job aside until a submission of the same call claims it."""
        self.journal.set_job(job.id, held=1)
        job.held = True
        self.open.pop(job.id, None)
        self.held[job.id] = job
        self.jobs_version += 1
        self._changed.add(job.id)

    def claim(self, job: Job) -> None:
        """A held job is wanted again: it rejoins the open jobs (in submission order)."""
        self.journal.set_job(job.id, held=0)
        job.held = False
        self.held.pop(job.id, None)
        self.open[job.id] = job
        self.open = dict(sorted(self.open.items(), key=lambda kv: kv[1].seq))
        self.jobs_version += 1
        self._changed.add(job.id)

    def add_progress(self, job: Job, samples: float) -> float:
        """Count ``samples`` the job's ranks report: progress since its last commit is provisional."""
        samples = max(0.0, samples)
        if samples:
            self.journal.set_job(job.id, progress=job.progress + samples)
            job.progress += samples
            if job.status != JobStatus.RUNNING:
                self._changed.add(job.id)
        return job.progress

    def at_position(self, job: Job, position: float, samples: float) -> float:
        """The job's loader is at ``position`` (global samples) after ``samples`` more: its progress is that position.
        A batch that began before what was counted is work done again (its ranks resumed from a commit): redone; one
        that began past it is work a stop counted redone that its ranks kept (they trained on and committed before
        they were restarted): not redone after all. So progress and redone are what the ranks did, whatever the order
        of a stop and their reports."""
        start = position - samples
        again = max(0.0, job.progress - start)
        kept = min(job.redone, max(0.0, start - job.progress))
        if position != job.progress or again != kept:
            self.journal.set_job(job.id, progress=position, redone=job.redone + again - kept)
            job.progress, job.redone = position, job.redone + again - kept
            if job.status != JobStatus.RUNNING:
                self._changed.add(job.id)
        if round(again - kept):
            self.count("samples_redone", int(round(again - kept)))
        return job.progress

    def commit(self, job: Job) -> float:
        """The job's ranks committed: everything counted so far survives a stop."""
        if job.committed != job.progress:
            self.journal.set_job(job.id, committed=job.progress)
            job.committed = job.progress
        return job.committed

    def requeue(self, job: Job, free_nodes: bool = True, **fields: Any) -> float:
        """running -> pending, the one way: the nodes it holds freed (not when an answer being applied has just given
        them to it again: ``free_nodes``), its progress back to its last commit (what it lost counted as redone),
        nothing lost remembered. Its ranks are its runtime's to stop. Returns the samples lost."""
        for node in self.nodes_of(job.nodes) if free_nodes else ():
            if node.job == job.id:
                self.assign(node, None)
        self._requeueing = True
        try:
            self.update_job(job, status=JobStatus.PENDING, nodes=[], **fields)
        finally:
            self._requeueing = False
        job.lost = set()
        return self.roll_back(job)

    def roll_back(self, job: Job) -> float:
        """The job stopped (or restarted its ranks): it resumes from its last commit, so its progress
        falls back there and what it loses is counted as redone. Returns the samples lost."""
        lost = max(0.0, job.progress - job.committed)
        if job.progress != job.committed:
            self.journal.set_job(job.id, progress=job.committed, redone=job.redone + lost)
            job.progress, job.redone = job.committed, job.redone + lost
            self._changed.add(job.id)
        if lost:
            self.count("samples_redone", int(round(lost)))
        return lost

    def mark_overran(self, job: Job) -> None:
        self.journal.set_job(job.id, overran=1)
        job.overran = True
        self.count("jobs_overran")

    def active_jobs(self, limit: int = 0, room: int | None = None) -> list[Job]:
        """The jobs the allocator considers: every running one, then the waiting ones :func:`.waiting.admit` admits
        (the machine bounds them, or ``limit``), in submission order."""
        waiting = [job for job in self.open.values() if job.status != JobStatus.RUNNING]
        lo = np.fromiter((job.spec["min_nodes"] for job in waiting), dtype=np.int64, count=len(waiting))
        out = list(self.running.values())  # always: the allocator must know every node that is held
        out += [waiting[i] for i in admit(lo, room, limit, len(out)).tolist()]
        out.sort(key=lambda j: j.seq)
        return out

    # ---------------------------------------------------------------- pilots

    def add_pilot(self, pilot_id: str, scheduler_id: str | None, requested: int, now: float, controller: int,
                  node_type: str | None = None) -> Pilot:
        typed = {"node_type": node_type} if node_type is not None else {}
        self.journal.upsert_pilot(pilot_id, scheduler_id=scheduler_id, state=PilotState.QUEUED, submitted=now,
                                  requested=requested, controller=controller, **typed)
        pilot = Pilot(pilot_id, scheduler_id, PilotState.QUEUED, now, requested, controller=controller,
                      node_type=node_type)
        self.pilots[pilot_id] = self.queued[pilot_id] = pilot
        return pilot

    def set_pilot(self, pilot: Pilot, **fields: Any) -> None:
        """Change a live pilot's fields (``state`` among queued, running, leaving:
        :data:`~pilotfill.lifecycle.PILOT_MOVES`)."""
        if "state" in fields:
            fields["state"] = checked(PILOT_MOVES, "pilot", pilot.id, pilot.state, fields["state"])
            if fields["state"] not in LIVE_PILOT_STATES:
                raise ValueError(f"pilot {pilot.id}: set_pilot keeps pilots live; end_pilot ends them")
        journaled = {k: (list(v) if k == "nodes" else v) for k, v in fields.items()}
        self.journal.upsert_pilot(pilot.id, **journaled)
        for k, v in fields.items():
            setattr(pilot, k, dict.fromkeys(v) if k == "nodes" else v)
        if "walltime_end" in fields:
            self.ready_version += 1
        if pilot.state == PilotState.QUEUED:
            self.queued[pilot.id] = pilot
        else:
            self.queued.pop(pilot.id, None)

    def end_pilot(self, pilot: Pilot, state: str, now: float) -> None:
        """The pilot is over (``ended`` or ``lost``): it leaves memory; its nodes must be removed first."""
        state = checked(PILOT_MOVES, "pilot", pilot.id, pilot.state, state)
        if state in LIVE_PILOT_STATES:
            raise ValueError(f"pilot {pilot.id}: end_pilot ends it (ended or lost), not {state}")
        self.journal.upsert_pilot(pilot.id, state=state, ended=now, nodes=[])
        pilot.state = state  # whoever still holds the object sees it ended: no move is left to it
        self.pilots.pop(pilot.id, None)
        self.queued.pop(pilot.id, None)
        self.ended_pilots[pilot.id] = state
        self.ended_order.append(pilot.id)
        while len(self.ended_pilots) > RECENTLY_ENDED:
            self.ended_pilots.popitem(last=False)

    def prune(self, keep_events: int, keep_ended_pilots: int) -> None:
        """Keep the journal bounded: the newest events and ended pilots only."""
        self.journal.prune_events(keep_events)
        old = [self.ended_order.popleft() for _ in range(max(0, len(self.ended_order) - keep_ended_pilots))]
        if old:
            self.journal.delete_pilots(old)

    def pilot_of(self, pilot_id: str) -> Pilot | None:
        return self.pilots.get(pilot_id)

    def pending_nodes(self, node_type: str | None = None) -> int:
        """Nodes asked for by pilots still waiting in the batch queue (of ``node_type``, when given)."""
        if node_type is None:
            return sum(p.requested for p in self.queued.values())
        return sum(p.requested for p in self.queued.values() if p.node_type == node_type)

    # ---------------------------------------------------------------- nodes

    def node_joins(self, name: str, pilot: Pilot, now: float) -> None:
        typed = {"node_type": pilot.node_type} if pilot.node_type is not None else {}
        self.journal.set_node(name, pilot=pilot.id, state=NodeState.READY, job=None, since=now, deadline=None, **typed)
        self.nodes[name] = Node(name, pilot.id, NodeState.READY, now, node_type=pilot.node_type)
        self.ready[name] = None
        self.ready_version += 1
        pilot.nodes[name] = None

    def set_node_state(self, node: Node, state: str, now: float, deadline: float | None = None) -> None:
        """``leaving`` (its pilot got SIGTERM) or ``gone``; a gone node leaves its pilot too."""
        state = checked(NODE_MOVES, "node", node.name, node.state, state)
        self.journal.set_node(node.name, state=state, job=None, since=now, deadline=deadline)
        node.state, node.job, node.since, node.deadline = state, None, now, deadline
        if self.ready.pop(node.name, 0) is None:
            self.ready_version += 1
        if state == NodeState.GONE and node.pilot in self.pilots:
            self.pilots[node.pilot].nodes.pop(node.name, None)

    def assign(self, node: Node, job: str | None) -> None:
        if node.job != job:
            self.journal.set_node(node.name, job=job)
            node.job = job

    def ready_nodes(self) -> Iterator[Node]:
        return (self.nodes[n] for n in self.ready)

    def nodes_of(self, names: Iterable[str]) -> list[Node]:
        return [self.nodes[n] for n in names if n in self.nodes]

    # ---------------------------------------------------------------- consistency

    def validate(self) -> None:
        """Check that the derived indexes agree with the states (dask's ``validate_state``): the tests call it after
        every step of the controller (``PILOTFILL_VALIDATE=1``); an :class:`AssertionError` names what disagrees."""
        bad: list[str] = []

        def expect(ok: bool, what: str) -> None:
            if not ok:
                bad.append(what)

        for job in self.jobs.values():
            expect(isinstance(job.status, JobStatus), f"job {job.id}: status {job.status!r} is not a JobStatus")
            is_open = job.status not in TERMINAL
            expect((job.id in self.open) == (is_open and not job.held),
                   f"job {job.id} ({job.status}, held {job.held}): open index says {job.id in self.open}")
            expect((job.id in self.held) == (is_open and job.held),
                   f"job {job.id} ({job.status}, held {job.held}): held index says {job.id in self.held}")
            expect((job.id in self.running) == (job.status == JobStatus.RUNNING),
                   f"job {job.id} ({job.status}): running index says {job.id in self.running}")
            if job.status != JobStatus.RUNNING:
                expect(not job.nodes, f"job {job.id} ({job.status}) holds nodes {job.nodes[:3]}")
            for n in job.nodes:
                node = self.nodes.get(n)
                expect(node is not None and node.state != NodeState.GONE,
                       f"job {job.id} holds node {n}, which is {node.state if node else 'unknown'}")
            cached = self._holding.get(job.id)
            expect(cached is None or cached == frozenset(job.nodes),
                   f"job {job.id}: its cached node set differs from its nodes")
        seqs = [j.seq for j in self.open.values()]
        expect(seqs == sorted(seqs), "open jobs are not in submission order")
        for key, job_id in self.by_key.items():
            expect(job_id in self.jobs and self.jobs[job_id].key == key,
                   f"key {key[:12]} names job {job_id}, which has another key or none")
        for pilot in self.pilots.values():
            expect(pilot.state in LIVE_PILOT_STATES, f"pilot {pilot.id} in memory as {pilot.state!r}")
            expect((pilot.id in self.queued) == (pilot.state == PilotState.QUEUED),
                   f"pilot {pilot.id} ({pilot.state}): queued index says {pilot.id in self.queued}")
            for n in pilot.nodes:
                node = self.nodes.get(n)
                expect(node is not None and node.pilot == pilot.id and node.state != NodeState.GONE,
                       f"pilot {pilot.id} holds node {n}: "
                       f"{'unknown' if node is None else f'{node.state} of {node.pilot}'}")
        expect(set(self.queued) <= set(self.pilots), "a queued pilot is not among the live pilots")
        ready = {n.name for n in self.nodes.values() if n.state == NodeState.READY}
        expect(ready == set(self.ready),
               f"ready index {sorted(set(self.ready) ^ ready)[:5]} disagrees with the nodes' states")
        for node in self.nodes.values():
            expect(isinstance(node.state, NodeState), f"node {node.name}: state {node.state!r} is not a NodeState")
            if node.state == NodeState.READY:
                expect(node.pilot in self.pilots and node.name in self.pilots[node.pilot].nodes,
                       f"ready node {node.name}: its pilot {node.pilot} does not hold it")
            if node.job is not None:
                job = self.jobs.get(node.job)
                expect(node.state == NodeState.READY and job is not None and job.status == JobStatus.RUNNING
                       and node.name in job.nodes,
                       f"node {node.name} ({node.state}) assigned to {node.job}, which does not hold it")
        if bad:
            raise AssertionError("the world disagrees with itself: " + "; ".join(bad[:10])
                                 + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""))

    # ---------------------------------------------------------------- what clients read

    def snapshot(self) -> dict[str, Any]:
        return {
            "jobs": [j.summary() for j in self.jobs.values()],
            "pilots": [
                {"id": p.id, "scheduler_id": p.scheduler_id, "state": p.state, "nodes": list(p.nodes),
                 "requested": p.requested, "submitted": p.submitted, "walltime_end": p.walltime_end, "pid": p.pid,
                 "node_type": p.node_type}
                for p in self.pilots.values()
            ],
            "nodes": [n.__dict__ for n in self.nodes.values() if n.state != NodeState.GONE],
            "counters": dict(self.counters),
        }

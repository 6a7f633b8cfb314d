"""Making an allocation so: from the allocator's answer to one runtime call per job that changed.

Nodes leave their jobs first, then join, so a node moving from one job to another is never seen unused in between;
then each job that changed is started, resized or stopped. What a change may not be is decided here too: a job that
lost every node it had restarts from its last commit (nothing survives to grow from), a job moved to another kind of
node is stopped and started there, and a job whose ranks are still forming their group (Horovod's ``hvd.init``) is
started on the nodes it keeps rather than shrunk. A job the runtime cannot act on fails; the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..allocator import Allocation, HoldModel
from ..elastic.base import Runtime
from ..lifecycle import JobStatus, NodeState
from ..reasons import StopCause
from .job_progress import OUTLIVED_LIMIT, JobProgress
from .node_types import NodeTypes
from .world import Job, World

log = logging.getLogger("pilotfill.controller")

Fail = Callable[[Job, float, str, str], None]
"""``fail(job, now, error, why)``: the job is over, failed (the controller's end of a job)."""


class Applier:
    """Applies answers (:meth:`apply`); remembers when each running job's nodes last changed (how long an allocation
    lasts is learned from it: ``lifetimes``)."""

    def __init__(self, world: World, runtime: Runtime, types: NodeTypes, progress: JobProgress, lifetimes: HoldModel,
                 fail: Fail):
        self.world, self.runtime, self.types, self.progress, self.lifetimes = world, runtime, types, progress, lifetimes
        self._fail = fail
        self._sized_at: dict[str, float] = {}  # running job -> when its nodes last changed

    def forget(self, job_id: str) -> None:
        """The job is over."""
        self._sized_at.pop(job_id, None)

    def apply(self, active: list[Job], answer: Allocation, now: float) -> dict[str, int]:
        """Make ``answer`` so for the ``active`` jobs it weighed; returns each changed job's new node count."""
        world = self.world
        # A running job that keeps its count (on its type) and lost nothing keeps its very nodes (nodes are named
        # without migration: allocator/moves.py): nothing to do. At machine scale that is most of a thousand jobs.
        changed = [job for job in active if not self._keeps_its_nodes(job, answer)]
        new_of = {job.id: list(answer.assignment.get(job.id, ())) for job in changed}
        for job in changed:
            keep = set(new_of[job.id])
            for node in world.nodes_of(job.nodes):
                if node.name not in keep and node.job == job.id:
                    world.assign(node, None)
        moved: dict[str, int] = {}
        for job in changed:
            new, old, lost = new_of[job.id], job.nodes, job.lost
            job.lost = set()
            if job.status == JobStatus.RUNNING and not old and lost and self._outlived(job, lost, now):
                continue  # failed: it cannot train between commits as long as a pilot lasts
            for node in world.nodes_of(new):
                world.assign(node, job.id)
            running = job.status == JobStatus.RUNNING
            cause = self._why_lost(lost).say(", ".join(sorted(lost))) if lost else None
            if running and new and not old:
                # Every node it had is gone: nothing survives to grow from, so it restarts (from its last commit).
                self.stop(job, now, sorted(lost), cause)
                running = False
            if (running and new and old and self.types.typed
                    and self.types.of_nodes(world, new) != self.types.of_nodes(world, old)):
                # Another kind of node: a stop (it resumes from its last commit) and a start there.
                running = self.stop_for_a_start(job, old, lost, now, StopCause.OTHER_TYPE)
            if (running and new and old and (lost or not set(old) <= set(new)) and self.progress.forming(job)
                    and not self.runtime.shrinks_while_forming(job.id)):
                # Its ranks are still forming the group (hvd.init): a start on the nodes it keeps, not a shrink.
                running = self.stop_for_a_start(job, old, lost, now, StopCause.WHILE_FORMING.say(cause or "shrunk"))
            try:
                if running and new:
                    if set(new) == set(old) and not lost:
                        continue
                    self._resize(job, new, old, lost, cause, now)
                elif running:
                    if not old and lost:
                        self.stop(job, now, sorted(set(old) | lost), cause)
                    else:
                        self.stop(job, now, sorted(set(old) | lost), StopCause.ALLOCATION,
                                  objective=round(answer.objective, 3))
                elif new:
                    self._start(job, new, now)
                else:
                    continue
            except Exception as exc:  # the runtime could not act: this job fails, the others go on
                log.exception("runtime could not apply the allocation to %s", job.id)
                self._fail(job, now, f"the runtime could not run the job: {exc!r}", repr(exc)[:200])
                continue
            self.progress.measure_from(job, len(new), now)
            moved[job.id] = len(new)
            if job.id in self._sized_at:
                self.lifetimes.observe(now - self._sized_at[job.id])
            if new:
                self._sized_at[job.id] = now
            else:
                self._sized_at.pop(job.id, None)
        return moved

    def stop(self, job: Job, now: float, nodes_before: list[str], cause: str | None, free_nodes: bool = True,
             **why: object) -> None:
        """A running job stops: its ranks end, it goes back to the queue from its last commit (``World.requeue``), and
        the journal says why (``cause``: a :class:`~pilotfill.reasons.StopCause`'s text)."""
        self.runtime.stop(job.id)
        redone = self.world.requeue(job, free_nodes=free_nodes)
        self.world.log("job.stopped", now, job=job.id, nodes_before=nodes_before, cause=cause, **why, redone=redone)

    def stop_for_a_start(self, job: Job, old: list[str], lost: set[str], now: float, cause: str) -> bool:
        """Stop a running job so that :meth:`apply` starts it on its new nodes (from its last commit); False: the job
        is no longer running."""
        self.stop(job, now, sorted(set(old) | lost), cause, free_nodes=False)
        return False

    def reform(self, job: Job, now: float) -> None:
        """A running job whose ranks went silent (:meth:`.JobProgress.stalled`): stopped, to start again from its last
        commit at the next decision (said once on the progress line: the notice stays until it ends)."""
        silent_s = self.progress.silent_s
        log.warning("job %s (%s): its ranks neither reported nor printed for %.0f s: formed again from its last commit",
                    job.id, job.name, silent_s)
        if self.progress.notices is not None:
            self.progress.notices.say(f"job.{job.id}.silent",
                                      f"{job.name}: its ranks were silent for {silent_s:.0f} s: started again from its "
                                      "last commit", now, level="waiting")
        self.stop(job, now, sorted(job.nodes), StopCause.SILENT.say(f"{silent_s:.0f}"))

    def _resize(self, job: Job, new: list[str], old: list[str], lost: set[str], cause: str | None, now: float) -> None:
        world = self.world
        self.runtime.resize(job.id, new, lost=sorted(lost))
        world.update_job(job, nodes=new, rescales=job.rescales + 1)
        self.progress.resized(job, len(new) > len(old), now)
        if not self.runtime.resize_keeps_progress(grow_only=not lost and set(old) <= set(new), job_id=job.id):
            world.roll_back(job)
        world.log("job.resized", now, job=job.id, before=len(old) + len(lost), after=len(new), nodes=new,
                  **({"cause": cause} if cause else {}))

    def _start(self, job: Job, new: list[str], now: float) -> None:
        world = self.world
        self.runtime.start(job.id, self.types.start_spec(world, job, new), new)
        self.progress.started(job, now)
        world.update_job(job, status=JobStatus.RUNNING, nodes=new, started=job.started or now,
                         launches=job.launches + 1)
        world.log("job.started", now, job=job.id, nodes=new, progress=job.progress,
                  **self.types.placed(world, job, new, now))

    def _keeps_its_nodes(self, job: Job, answer: Allocation) -> bool:
        """Whether ``answer`` leaves a running job exactly as it is: the same count on the same type, nothing lost."""
        if (job.status != JobStatus.RUNNING or job.lost or not job.nodes
                or answer.counts.get(job.id, 0) != len(job.nodes)):
            return False
        return not self.types.typed or answer.node_type.get(job.id) == self.types.of_nodes(self.world, job.nodes)

    def _outlived(self, job: Job, lost: set[str], now: float) -> bool:
        """A job stopped because its pilots' walltime drained every node it had, after training most of their time
        without a commit, has lost that work; the :data:`~.job_progress.OUTLIVED_LIMIT`-th such run in a row fails it
        (True) rather than restart it for ever."""
        world = self.world
        nodes = [world.nodes[n] for n in lost if n in world.nodes]
        pilots = [world.pilots.get(node.pilot) if node.pilot else None for node in nodes]
        if not nodes or any(p is None or p.walltime_end is None or node.deadline != p.walltime_end
                            or node.state != NodeState.LEAVING for node, p in zip(nodes, pilots)):
            return False  # not (only) a walltime: a preemption, a lost node
        # a pilot's time from its start to its drain
        usable = max(node.since - p.registered_at for node, p in zip(nodes, pilots))
        if self.progress.uncommitted_s(job, now) < 0.5 * usable:
            return False  # it started late in its pilots' lives: no sign that it cannot fit in one
        count = self.progress.outlived(job, now)
        world.log("job.outlived", now, job=job.id, runs=count,
                  uncommitted_s=round(self.progress.uncommitted_s(job, now), 3), pilot_s=round(usable, 3))
        if count < OUTLIVED_LIMIT:
            return False
        self._fail(job, now, f"the job lost its work to its pilots' walltime {count} times in a row with nothing "
                   f"committed in between: it trains longer between commits than a pilot lasts (about {usable:.0f} s "
                   f"from a pilot's start to its drain): commit more often (ElasticState.commit()), or let pilots run "
                   f"longer (the site config's pilot walltime)",
                   f"lost to its pilots' walltime {count} times")
        return True

    def _why_lost(self, lost: set[str]) -> StopCause:
        states = {self.world.nodes[n].state for n in lost if n in self.world.nodes}
        if states == {NodeState.LEAVING}:
            return StopCause.NODES_LEAVING
        return StopCause.NODES_GONE if NodeState.READY not in states else StopCause.NODES_LOST

"""Each job's training as its ranks' reports show it: progress counted, commits kept, what its last change cost, and
the rate it trains at — learned only from reports that describe steady training at the size it holds.

A report is not always the job's throughput: the first after a start or a resize covers imports, rendezvous and
restoring (it measures what the change cost, :meth:`JobProgress.report`); a torch job's old ranks report at the old size
until the new rendezvous round's ranks do (``Runtime.resize_restarts_ranks``); and work reported is not work kept,
only what a commit covered survives a stop. The controller hands each report here and is told whether the estimate
changed; the :class:`~pilotfill.controller.throughput.Meter` of each job measures one size at a time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from ..allocator import Profiler
from ..elastic.base import Runtime
from ..lifecycle import JobStatus
from ..protocol import JobReport
from .throughput import Meter
from .notices import Notices
from .node_types import NodeTypes
from .world import Job, World

log = logging.getLogger("pilotfill.controller")

SILENT_S = 300.0
"""The default of ``[runtime] silent_s``: a job that reported before and whose ranks have neither reported nor printed
for this long, on a runtime that can stall out of sight of its collectives' timeouts, is stuck: it is formed again from
its last commit (said once)."""
OUTLIVED_LIMIT = 3
"""Runs in a row a job may lose to its pilots' walltime with nothing committed in between before it fails: it needs
longer between commits than a pilot lasts, and would be restarted for ever."""


class JobProgress:
    """Per running job: its meter (:class:`Meter`), its last start or resize not yet seen training, its last commit.

    ``runtime``: asked whether a resize restarts every rank; ``at_commit(job, now)``: a commit happened (ranks told to
    leave at their next commit go now: :meth:`.Liveness.leave_at_commit`); ``changed()``: the estimate of a job's
    curve changed, so the allocation rests on something new."""

    def __init__(self, world: World, profiler: Profiler, types: NodeTypes, runtime: Runtime,
                 at_commit: Callable[[Job, float], None], changed: Callable[[], None], notices: Notices | None = None,
                 silent_s: float = SILENT_S):
        self.world, self.profiler, self.types, self.runtime = world, profiler, types, runtime
        self.silent_s = silent_s
        self._at_commit, self._estimate_changed = at_commit, changed
        self.notices = notices
        # job -> (runs lost to walltimes in a row, its committed progress then)
        self._outlived: dict[str, tuple[int, float]] = {}
        self._heard: dict[str, float] = {}  # running job that has reported -> its last report
        self._stall_check = 0.0  # when stalled() looks next
        self._meters: dict[str, Meter] = {}
        # job -> (when, kind) of a start or resize not yet seen training
        self._changed: dict[str, tuple[float, str]] = {}
        self._committed_at: dict[str, float] = {}  # job -> its last commit (the commit interval is learned from these)

    # ------------------------------------------------------------ what the controller did to a job

    def started(self, job: Job, now: float) -> None:
        """A job's ranks were launched: what its start costs is measured at its first report; a stop before its
        first commit loses what it does from here."""
        self._changed[job.id] = (now, "start")
        self._committed_at[job.id] = now
        self._heard.pop(job.id, None)

    def stalled(self, now: float, silent_s: Callable[[str, float], float | None]) -> list[Job]:
        """Running jobs that reported before and have since been silent for ``silent_s``: no report, and no output
        their runtime sees (``silent_s(job, now)``; None: the runtime's own timeouts end its stalls). Looked at every
        tenth of that, not in every pass."""
        if now < self._stall_check:
            return []
        self._stall_check = now + self.silent_s / 10
        out = []
        for job_id, heard in list(self._heard.items()):
            job = self.world.jobs.get(job_id)
            if job is None or job.status != JobStatus.RUNNING:
                self._heard.pop(job_id, None)
                continue
            if now - heard >= self.silent_s and (quiet := silent_s(job_id, now)) is not None and quiet >= self.silent_s:
                self._heard.pop(job_id, None)
                out.append(job)
        return out

    def resized(self, job: Job, grew: bool, now: float) -> None:
        """A running job's ranks were told of new nodes: what the resize costs is measured at the first report after.
        A job still forming its group stays forming: its start, nodes added on the way, ends at its first report."""
        if not self.forming(job):
            self._changed[job.id] = (now, "up" if grew else "down")

    def measure_from(self, job: Job, nodes: int, now: float) -> None:
        """A job's size changed (started, resized or stopped): its rate is measured anew at ``nodes``."""
        self._meters[job.id] = Meter(nodes, now)

    def forming(self, job: Job) -> bool:
        """Whether a job's ranks have neither reported training nor committed since it started: still starting up and
        forming their group (a survivor of a shrink is not: its process reports on, never "first" again)."""
        changed = self._changed.get(job.id)
        return changed is not None and changed[1] == "start" and self._committed_at.get(job.id, math.inf) <= changed[0]

    def forget(self, job_id: str) -> None:
        """The job is over."""
        self._meters.pop(job_id, None)
        self._changed.pop(job_id, None)
        self._committed_at.pop(job_id, None)
        self._heard.pop(job_id, None)
        if self.notices is not None:
            self.notices.clear(f"job.{job_id}.silent")
        if self._outlived.pop(job_id, None) is not None and self.notices is not None:
            self.notices.clear(f"job.{job_id}.walltime")

    def uncommitted_s(self, job: Job, now: float) -> float:
        """Seconds since the job last committed or started: what a stop now loses."""
        return now - self._committed_at.get(job.id, now)

    def outlived(self, job: Job, now: float) -> int:
        """The job lost a run to its pilots' walltime with nothing committed: how many such runs in a row (the
        count starts again once it commits). Said on the progress line until it commits or ends."""
        count, committed = self._outlived.get(job.id, (0, job.committed))
        count = count + 1 if committed == job.committed else 1
        self._outlived[job.id] = (count, job.committed)
        if self.notices is not None:
            self.notices.say(f"job.{job.id}.walltime",
                             f"{job.name} lost its work to its pilots' walltime {count} time{'s' if count > 1 else ''} "
                             f"with nothing committed (at {OUTLIVED_LIMIT} it fails: it needs to commit more often, "
                             f"or longer pilots)", now)
        return count

    # ------------------------------------------------------------ what its ranks said

    def report(self, job: Job, message: JobReport, now: float) -> float:
        """A rank's report of work done (the job is not over): its progress counted, a commit it made kept, the cost
        of the change before it measured, its rate measured when it describes steady training at the job's size.
        Returns the job's progress."""
        world = self.world
        if job.status == JobStatus.RUNNING:
            if job.id not in self._heard and self.notices is not None:
                self.notices.clear(f"job.{job.id}.silent")  # training again after it was formed anew
            self._heard[job.id] = now
        if message.noise_scale is not None and job.spec.get("adaptive"):
            # its view is made anew when it moves far enough (AllocatorViews.inputs)
            job.noise_scale = message.noise_scale
        if message.position is not None:  # rank 0 of an elastic loader: the job is where its loader is
            progress = world.at_position(job, message.position, message.samples)
        else:
            progress = world.add_progress(job, message.samples)
        if message.commit:  # the reporting rank committed right after this work
            self.commit(job, now)
        changed = self._changed.get(job.id)
        if changed is not None and message.first and job.status == JobStatus.RUNNING:
            # Ranks training again after a start or a resize: what the change cost, measured (JPA learns it).
            when, kind = self._changed.pop(job.id)
            cost = max(0.0, now - float(message.seconds) - when)
            self.profiler.observe_cost(job.id, kind, cost)
            world.log("job.cost", now, job=job.id, change=kind, seconds=round(cost, 3))
        total = job.spec.get("total_samples")
        if total and progress > total and not job.overran:
            world.mark_overran(job)
            world.log("job.overran", now, job=job.id, progress=progress, total_samples=total)
            log.info("job %s (%s) has reported %.4g samples, past the %.4g it declared: it keeps its nodes until "
                     "it returns", job.id, job.name, progress, total)
        meter = self._meters.get(job.id)
        if job.status == JobStatus.RUNNING and job.id in self._changed and self.runtime.resize_restarts_ranks(job.id):
            # its old ranks, still at the old size until the new round's first report: not this size's rate
            meter = None
        if (job.status == JobStatus.RUNNING and message.host in job.nodes and meter is not None
                and meter.nodes == len(job.nodes)):
            measured = meter.add(message.samples, message.seconds, now, first=message.first,
                                 rank=(message.host, message.pid))
            if measured is not None and not (job.spec.get("curve") or job.spec.get("curves")):
                self._learn(job, meter.nodes, *measured, now)
        return progress

    def commit(self, job: Job, now: float) -> float:
        """Rank 0 saved the job's state durably: what was counted so far survives any stop. Returns what it kept."""
        last = self._committed_at.get(job.id)
        if last is not None and job.status == JobStatus.RUNNING:
            self.profiler.observe_cost(job.id, "commit", now - last)
        self._committed_at[job.id] = now
        committed = self.world.commit(job)
        if self._outlived.pop(job.id, None) is not None and self.notices is not None:
            self.notices.clear(f"job.{job.id}.walltime")
        self._at_commit(job, now)
        return committed

    def _learn(self, job: Job, nodes: int, rate: float, seconds: float, now: float) -> None:
        """A steady rate at ``nodes`` (on the type it holds) joins what JPA knows of the job's curve."""
        node_type = self.types.of_nodes(self.world, job.nodes)
        new_scale = nodes not in self.profiler.scales(job.id, node_type)
        self.profiler.observe(job.id, nodes, rate, weight=seconds, node_type=node_type)
        if new_scale:
            self.world.log("job.estimate", now, job=job.id, nodes=nodes, samples_per_s=round(rate, 3),
                           **({"node_type": node_type} if node_type else {}))
            self._estimate_changed()  # a scale never seen before: the estimate changed

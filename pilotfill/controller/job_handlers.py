"""What clients and a job's ranks ask the controller about jobs: submit, cancel, look up; report, commit, describe the
model, return a result or a failure.

A submission is checked (``protocol.check_spec``) and sized against the machine: a job that needs more nodes than the
batch system could ever give is refused with the reason, one that asks for more than there is gets what there is. The
same call again — a retry of a request an earlier incarnation applied, or a re-run of the campaign (the same key) —
is the job it already is. Reports and commits go to :class:`~pilotfill.controller.job_progress.JobProgress`; every end
of a job goes to the controller's one ``end_job``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..config import Config
from ..lifecycle import TERMINAL, JobStatus
from ..protocol import (
    JobCancel,
    JobCancelReply,
    JobCommit,
    JobCommitReply,
    JobDescribe,
    JobDescribeReply,
    JobFailed,
    JobFailedReply,
    JobGet,
    JobGetReply,
    JobReport,
    JobReportReply,
    JobResult,
    JobResultReply,
    JobSpec,
    JobStatusQuery,
    JobStatusReply,
    JobSubmit,
    JobSubmitReply,
    ProtocolError,
    check_spec,
)
from ..journal import Journal
from .job_progress import JobProgress
from .node_types import NodeTypes
from .world import Job, World


def nodes_fed(spec: JobSpec, config: Config) -> int | None:
    """The most nodes a job's global batch feeds, ``min_per_rank`` samples to each of a node's ranks (the most ranks
    any node here runs), or None when it declares none."""
    if not spec.get("global_batch"):
        return None
    per_node = max([config.runtime.ranks_per_node, *(t.ranks_per_node for t in config.node_types)])
    return spec["global_batch"] // (spec.get("min_per_rank") or 1) // max(1, per_node)


class JobEnds(Protocol):
    """How a job ends: the controller's one way, so that its ranks stop and its nodes are freed whatever ended it."""

    def end_job(self, job: Job, now: float, status: str, result: Any = None, error: str | None = None,
                why: str | None = None) -> None: ...


class JobHandlers:
    """The handlers of the jobs' messages. ``capacity()``: the most nodes a job could ever get; ``changed()``: the
    jobs changed, the next pass decides again."""

    def __init__(self, world: World, journal: Journal, progress: JobProgress, types: NodeTypes, ends: JobEnds,
                 capacity: Callable[[], int], checkpoint_dir: Path, changed: Callable[[], None]):
        self.world, self.journal, self.progress, self.types, self.ends = world, journal, progress, types, ends
        self.capacity, self.checkpoint_dir, self._changed = capacity, checkpoint_dir, changed

    def known(self, job_id: str) -> Job:
        """The job ``job_id``; a protocol error naming it when there is none."""
        job = self.world.jobs.get(job_id)
        if job is None:
            raise ProtocolError(f"no job {job_id!r}")
        return job

    # ------------------------------------------------------------ clients

    def submit(self, message: JobSubmit, now: float) -> JobSubmitReply:
        spec = check_spec(message.spec)
        world = self.world
        request = message.rid
        if request is not None and (done := self.journal.job_by_request(request)) is not None:
            return JobSubmitReply(job_id=done, reused=True)  # a retry of a submission an earlier incarnation applied
        key = spec.get("key")
        earlier = world.jobs.get(world.by_key.get(key, "")) if key else None
        if (earlier is not None and earlier.status not in (JobStatus.FAILED, JobStatus.CANCELLED)
                and not (spec.get("fresh") and earlier.status == JobStatus.FINISHED)):
            # The same call again (a re-run of the campaign): the job it already is — finished, or resuming. A fresh
            # call (cache=False) is never answered by a finished one.
            if earlier.held:
                world.claim(earlier)
                world.log("job.claimed", now, job=earlier.id, name=earlier.name, progress=earlier.progress)
                self._changed()
            return JobSubmitReply(job_id=earlier.id, reused=True)
        capacity = self.capacity()
        if spec["min_nodes"] > capacity:
            raise ProtocolError(f"job spec: min_nodes {spec['min_nodes']} is more than this machine could ever give "
                                f"({capacity} nodes)")
        if spec["max_nodes"] > capacity:
            spec["max_nodes"] = capacity  # no job can hold more than there is; asking for more is not an error
        fed = nodes_fed(spec, self.types.config)
        if fed is not None and fed < spec["min_nodes"]:
            raise ProtocolError(f"job spec: global_batch {spec['global_batch']} feeds {fed} node(s) of this machine's "
                                f"ranks, fewer than min_nodes {spec['min_nodes']}")
        if fed is not None and spec["max_nodes"] > fed:
            spec["max_nodes"] = fed  # more ranks than its global batch feeds would idle
        job = world.add_job(world.next_job_id(), spec["name"], spec, now, key=key)
        if request is not None:
            self.journal.set_job(job.id, request=request)  # durable, in this reply's transaction
        world.log("job.arrived", now, job=job.id, name=job.name, min_nodes=spec["min_nodes"],
                  max_nodes=spec["max_nodes"])
        self._changed()
        return JobSubmitReply(job_id=job.id)

    def cancel(self, message: JobCancel, now: float) -> JobCancelReply:
        self.ends.end_job(self.known(message.job_id), now, "cancelled")
        return JobCancelReply()

    def get(self, message: JobGet, now: float) -> JobGetReply:
        job = self.known(message.job_id)
        return JobGetReply(job=job.record(), checkpoint=str(self.commit_path(job)))

    def commit_path(self, job: Job) -> Path:
        """Where the job's ranks commit: by its call, so that a re-run of the same call resumes it."""
        return self.checkpoint_dir / f"{job.key or job.id}.pt"

    def finished(self, job: Job, now: float) -> None:
        """A fresh call (cache=False) that finished leaves no commit: the next call of it trains anew, from the
        start."""
        if job.spec.get("fresh"):
            try:
                self.commit_path(job).unlink(missing_ok=True)
            except OSError as exc:  # its result stands; only a later call of it could resume from this commit
                self.world.log("job.commit_kept", now, job=job.id, error=str(exc))

    def status(self, message: JobStatusQuery, now: float) -> JobStatusReply:
        jobs = {}
        for job_id in message.job_ids:
            job = self.world.jobs.get(job_id) if isinstance(job_id, str) else None
            if job is not None:
                jobs[job_id] = {"id": job.id, "status": job.status, "progress": job.progress,
                                "committed": job.committed, "result": job.result, "error": job.error,
                                **self.types.placement_of(job.id)}
        return JobStatusReply(jobs=jobs)

    # ------------------------------------------------------------ a job's ranks

    def report(self, message: JobReport, now: float) -> JobReportReply:
        job = self.known(message.job_id)
        if job.status in TERMINAL:
            return JobReportReply(progress=job.progress)
        return JobReportReply(progress=self.progress.report(job, message, now))

    def commit(self, message: JobCommit, now: float) -> JobCommitReply:
        """Rank 0 saved the job's state durably: what was counted so far survives any stop."""
        job = self.known(message.job_id)
        if job.status in TERMINAL:
            return JobCommitReply(committed=job.committed)
        return JobCommitReply(committed=self.progress.commit(job, now))

    def describe(self, message: JobDescribe, now: float) -> JobDescribeReply:
        """A rank computed the job's model descriptor (parameters, FLOPs per sample, layer mix, batch size): the
        similarity policy predicts its curve on the types it has not run on from it. The first one stands."""
        job = self.known(message.job_id)
        if job.status in TERMINAL or job.spec.get("model"):
            return JobDescribeReply(kept=False)
        model = self.types.check_descriptor(message.model)
        self.world.set_spec(job, {**job.spec, "model": model})
        self.world.log("job.described", now, job=job.id, model=model)
        self._changed()
        return JobDescribeReply(kept=True)

    def result(self, message: JobResult, now: float) -> JobResultReply:
        self.ends.end_job(self.known(message.job_id), now, "finished", result=message.value)
        return JobResultReply()

    def failed(self, message: JobFailed, now: float) -> JobFailedReply:
        job = self.known(message.job_id)
        error = message.error
        self.ends.end_job(job, now, "failed", error=error, result=message.value,
                          why=(error.strip().splitlines() or [""])[-1][:200])
        return JobFailedReply()

"""A runtime that trains nothing: progress from each job's measured curve, on a simulated clock.

``pilotfill replay`` puts this behind the :class:`~pilotfill.elastic.base.Runtime`
interface so that the real controller can be run for a week of a real machine
in minutes. Each job advances at S_j(n) samples/s on n nodes (0 outside its
bounds) and reports what it processed, as ranks do (``job.report``; a
``job.result`` when its work is done), through :attr:`outbox`. What the
controller's decisions cost is charged as BFTrainer's replayer charges it:

* a grow or a shrink: ``scale_up_cost_s`` / ``scale_down_cost_s`` seconds of
  progress at the job's rate before the change;
* nodes lost to the main workload: ``scale_down_cost_s`` once, at the rate
  before the loss; whatever the same decision then does costs its own rescale;
* ``accounting="bftrainer"``: starting a job is free and stopping one costs a
  shrink, as in BFTrainer (so the figures compare); ``"realistic"``: a start
  also costs ``start_cost_s`` of progress, and a stop loses the work since the
  job's last commit (every ``commit_interval_s`` of training) — unless
  ``rescale="in_place"``: the torch runtime's ranks leave at a step boundary
  and, the whole job going, commit there first, so a stop within the pilot's
  grace loses nothing but its cost (the job file's costs are then the in-place
  runtime's, given by whoever replays).

A report says when the job committed right after its work (``commit``), as
real ranks do through ``ElasticState.commit``, so the controller's count of a
job's progress falls back to the same commit on a stop. As real ranks do, a
job reports nothing while it pays a cost (they are restarting, meeting and
restoring), and the first report after a start or a resize is marked
``first`` and covers only the training after the pause (``seconds``): the
controller neither takes it for the job's rate nor mistakes the pause for it,
and measures the pause as what the change cost.

On a machine with several kinds of node (``node_types``) a job advances at
its curve for the type of its nodes (``samples_per_s@TYPE`` of the job file);
on nodes of several types at once — what a type-blind allocator may hand
out — data-parallel ranks run at the slowest one's pace: the lowest of those
types' curves at its size; on a type its file gives no curve for, not at all.

Costs are a debt paid from the next progress, so reported samples are never
negative; totals equal BFTrainer's "samples minus what rescaling lost".
With ``noise`` > 0 the reported samples carry relative Gaussian noise (the
job's own accounts stay exact): the controller's profiler then learns each job
from noisy throughput, as from real ranks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..protocol import JobCommit, JobReport, JobResult
from ..traces import JobSpec
from .base import RankExit, Runtime

FINISH_TOLERANCE = 1e-9
"""Relative slack on total_samples when deciding that a job has finished (float round-off)."""


@dataclass
class SimJob:
    """One job's accounts."""

    job_id: str
    spec: JobSpec
    hosts: list[str] = field(default_factory=list)
    done: float = 0.0  # work done, net of losses (samples)
    gross: float = 0.0  # what the same node counts would have given with no loss
    charged: float = 0.0  # samples lost to rescaling, preemption, starts and stops
    debt: float = 0.0  # charged but not yet paid from progress
    committed: float = 0.0
    since_commit_s: float = 0.0
    rescales: int = 0
    preemptions: int = 0
    starts: int = 0
    stops: int = 0
    first_start: float | None = None
    stopped_at: float | None = None  # stopped before its work was done, not started again since
    longest_rewait_s: float = 0.0  # the longest it waited to run again after a stop
    fresh: bool = False  # started or resized since its last report: the next one is its ranks' first
    finished: float | None = None
    types: Mapping[str, str] = field(default_factory=dict)  # node -> type (a machine with several kinds of node)

    def rate(self, hosts: Sequence[str] | None = None) -> float:
        """Samples/s on ``hosts`` (default: its own): its curve for their type; the slowest type's on mixed hosts."""
        hosts = self.hosts if hosts is None else hosts
        n = len(hosts)
        if not self.spec.min_nodes <= n <= self.spec.max_nodes:
            return 0.0
        if not self.types or not self.spec.curves:
            return self.spec.throughput.at(n)
        rates = []
        for kind in {self.types.get(h) for h in hosts}:
            curve = self.spec.curve_on(kind)
            if curve is None:
                return 0.0  # the job does not run on that type
            rates.append(curve.at(n))
        return min(rates)

    @property
    def remaining(self) -> float:
        return self.spec.total_samples - self.done


class SimulatedRuntime(Runtime):
    def __init__(
        self,
        specs: Mapping[str, JobSpec],
        accounting: str = "bftrainer",
        noise: float = 0.0,
        seed: int = 0,
        start_cost_s: float = 30.0,
        commit_interval_s: float = 60.0,
        now: float = 0.0,
        node_types: Mapping[str, str] | None = None,
        rescale: str = "restart",
    ):
        if accounting not in ("bftrainer", "realistic"):
            raise ValueError(f"accounting must be 'bftrainer' or 'realistic', got {accounting!r}")
        if rescale not in ("restart", "in_place"):
            raise ValueError(f"rescale must be 'restart' or 'in_place', got {rescale!r}")
        self.rescale = rescale
        self.specs = specs
        self.accounting = accounting
        self.noise = noise
        self.start_cost_s = start_cost_s
        self.commit_interval_s = commit_interval_s
        self.now = now
        self.jobs: dict[str, SimJob] = {}
        self.running: dict[str, SimJob] = {}
        self.outbox: list[dict[str, Any]] = []
        self.used_node_s = 0.0
        self.node_types = dict(node_types or {})
        self.type_node_s: dict[str, float] = {}  # node-seconds used per type (typed machines)
        self._rng = random.Random(seed)

    # ------------------------------------------------------------ Runtime

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = SimJob(job_id, self.specs[spec["name"]], types=self.node_types)
        job.hosts = list(hosts)
        job.first_start = self.now if job.first_start is None else job.first_start
        if job.stopped_at is not None:
            job.longest_rewait_s = max(job.longest_rewait_s, self.now - job.stopped_at)
            job.stopped_at = None
        job.starts += 1
        job.rescales += 1
        job.fresh = True
        if self.accounting == "realistic":
            self._charge(job, self.start_cost_s * job.rate())
        self.running[job_id] = job

    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        job = self.jobs[job_id]
        gone = set(lost) & set(job.hosts)
        survivors = [h for h in job.hosts if h not in gone]
        if gone:
            self._charge(job, job.spec.scale_down_cost_s * job.rate())
            job.preemptions += 1
        before = job.rate(survivors)
        if len(hosts) > len(survivors):
            self._charge(job, job.spec.scale_up_cost_s * before)
        elif len(hosts) < len(survivors):
            self._charge(job, job.spec.scale_down_cost_s * before)
        if set(hosts) != set(survivors):
            job.rescales += 1
        if set(hosts) != set(job.hosts):
            job.fresh = True
        job.hosts = list(hosts)

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        return True  # rescales are charged as BFTrainer charges them (a cost, not a roll-back)

    def stop(self, job_id: str) -> None:
        job = self.running.pop(job_id, None)
        if job is None:
            return
        if job.finished is None:
            self._charge(job, job.spec.scale_down_cost_s * job.rate())
            if self.accounting == "realistic" and self.rescale == "restart":
                lost_work = max(0.0, job.done - job.committed)
                job.done -= lost_work
                job.charged += lost_work
                job.since_commit_s = 0.0
            job.stops += 1
            job.rescales += 1
            job.stopped_at = self.now
        job.hosts = []

    def hosts(self, job_id: str) -> list[str]:
        job = self.jobs.get(job_id)
        return list(job.hosts) if job else []

    def poll(self) -> list[RankExit]:
        return []

    def close(self) -> None:
        for job_id in list(self.running):
            self.running[job_id].hosts = []
        self.running.clear()

    # ------------------------------------------------------------ the simulated clock

    def next_time(self) -> float:
        """When the next running job finishes at its current size."""
        best = math.inf
        for job in self.running.values():
            rate = job.rate()
            if rate > 0:
                best = min(best, self.now + (max(job.remaining, 0.0) + job.debt) / rate)
        return best

    def advance(self, t: float) -> None:
        """Let time pass at the current sizes: progress, reports, and results of jobs whose work is done."""
        dt = t - self.now
        if dt <= 0:
            return
        for job in list(self.running.values()):
            n = len(job.hosts)
            rate = job.rate()
            self.used_node_s += n * dt
            if self.node_types:
                for h in job.hosts:
                    kind = self.node_types.get(h, "")
                    self.type_node_s[kind] = self.type_node_s.get(kind, 0.0) + dt
            if rate <= 0:
                continue
            produced = rate * dt
            paid = min(job.debt, produced)
            job.debt -= paid
            net = min(produced - paid, max(job.remaining, 0.0))
            job.gross += paid + net
            job.done += net
            commit = self._commit(job, dt)
            if net > 0:
                reported = net * max(1e-3, 1.0 + self._rng.gauss(0.0, self.noise)) if self.noise else net
                seconds = dt * net / produced  # the training after the pause
                if job.fresh:  # its ranks' first report: ready (trained 0 samples) `seconds` ago
                    self.outbox.append(JobReport(job.job_id, job.hosts[0], 0.0, seconds, first=True).to_dict())
                    job.fresh = False
                self.outbox.append(JobReport(job.job_id, job.hosts[0], reported, seconds, commit=commit).to_dict())
            elif commit:
                self.outbox.append(JobCommit(job.job_id).to_dict())
            if job.remaining <= FINISH_TOLERANCE * job.spec.total_samples:
                job.done = job.spec.total_samples
                job.finished = t
                self.outbox.append(JobResult(job.job_id, {"samples": job.done}).to_dict())
        self.now = t

    # ------------------------------------------------------------ helpers

    def _charge(self, job: SimJob, samples: float) -> None:
        if samples > 0:
            job.debt += samples
            job.charged += samples

    def _commit(self, job: SimJob, dt: float) -> bool:
        """Commit every ``commit_interval_s`` of training (realistic); BFTrainer's stops lose nothing,
        as if every step committed."""
        job.since_commit_s += dt
        if self.accounting == "bftrainer" or job.since_commit_s >= self.commit_interval_s:
            job.committed, job.since_commit_s = job.done, 0.0
            return True
        return False

"""Replay a recorded node-availability trace on a simulated clock, with the real allocator.

This is what a site administrator runs before granting pilotfill a queue, and
how the allocator is judged. Semantics follow BFTrainer's replayer so that the
figures compare (DESIGN, "The allocator"):

* an event is one distinct time of the trace: all its transitions, then one
  allocation; a job finishing between trace rows, and a job arriving while a
  slot is free, are events of their own (the finisher frees its nodes then);
* progress accrues at S_j(n_j) (0 below min_nodes); a job that loses nodes to
  the main scheduler pays ``scale_down_cost_s`` once at its rate before the
  event; the reallocation then charges ``scale_up_cost_s`` / ``scale_down_cost_s``
  at the job's rate before the reallocation (so starting a job is free, as in
  BFTrainer);
* at most ``max_jobs`` run at once, the rest wait in submission order;
* ``efficiency`` is samples ÷ the samples the same jobs would have processed
  at the same node counts with no loss: it measures overhead only.

With ``profiles="learned"`` the allocator never sees a curve: it sees the
profiler's estimate, fed with each job's own reported throughput plus
Gaussian noise.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..allocator import Allocation, Formulation, Job, NodePool, Problem, Profiler, allocate
from ..traces import JobSpec, Trace

FINISH_TOLERANCE = 1e-9
"""Relative slack on total_samples when deciding that a job has finished (float round-off)."""


@dataclass
class _Run:
    """A job admitted to the machine, with its accounts."""

    spec: JobSpec
    admitted: float
    nodes: frozenset[str] = frozenset()
    progress: float = 0.0  # samples done, net of losses
    gross: float = 0.0  # samples the same node counts would have given with no loss
    lost: float = 0.0
    rescales: int = 0
    preemptions: int = 0

    @property
    def count(self) -> int:
        return len(self.nodes)

    @property
    def rate(self) -> float:
        n = self.count
        return self.spec.throughput.at(n) if self.spec.min_nodes <= n <= self.spec.max_nodes else 0.0

    @property
    def remaining(self) -> float:
        return self.spec.total_samples - self.progress


@dataclass(frozen=True)
class JobOutcome:
    name: str
    model: str
    submitted: float
    admitted: float
    finished: float | None
    samples: float
    lost: float
    rescales: int
    preemptions: int


@dataclass(frozen=True)
class Snapshot:
    """What the machine looked like after one event (for plots and live views)."""

    time: float
    idle: int
    used: int
    running: int
    samples: float
    solve_ms: float
    method: str


@dataclass
class ReplayResult:
    """Totals of one replay. ``as_dict`` gives the documented JSON keys."""

    trace: str
    nodes: int
    start: float
    end: float
    events: int = 0
    transitions: int = 0
    idle_node_hours: float = 0.0
    used_node_hours: float = 0.0
    samples: float = 0.0
    ideal_samples: float = 0.0
    lost_samples: float = 0.0
    jobs_completed: int = 0
    jobs_started: int = 0
    solve_ms: list[float] = field(default_factory=list)
    methods: dict[str, int] = field(default_factory=dict)
    jobs: list[JobOutcome] = field(default_factory=list)
    timeline: list[Snapshot] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def efficiency(self) -> float:
        return self.samples / self.ideal_samples if self.ideal_samples > 0 else 1.0

    def as_dict(self) -> dict:
        ms = np.array(self.solve_ms) if self.solve_ms else np.zeros(1)
        return {
            "trace": self.trace,
            "nodes": self.nodes,
            "start": self.start,
            "end": self.end,
            "events": self.events,
            "transitions": self.transitions,
            "idle_node_hours": self.idle_node_hours,
            "used_node_hours": self.used_node_hours,
            "samples": self.samples,
            "ideal_samples": self.ideal_samples,
            "lost_samples": self.lost_samples,
            "efficiency": self.efficiency,
            "jobs_completed": self.jobs_completed,
            "jobs_started": self.jobs_started,
            "solve_ms_p50": float(np.percentile(ms, 50)),
            "solve_ms_p99": float(np.percentile(ms, 99)),
            "solve_ms_max": float(ms.max()),
            "methods": dict(self.methods),
            "wall_s": self.wall_s,
        }


EventHook = Callable[[float, ReplayResult], None]


@dataclass
class Replay:
    """The simulated machine. ``run()`` drives it from the trace's start to its end."""

    trace: Trace
    jobs: list[JobSpec]
    max_jobs: int = 10
    t_fwd: float = 10.0
    formulation: Formulation = Formulation.AGGREGATED
    profiles: str = "known"
    noise: float = 0.03
    seed: int = 0
    time_limit_s: float = 1.0
    keep_timeline: bool = True

    def __post_init__(self) -> None:
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {self.max_jobs}")
        if self.profiles not in ("known", "learned"):
            raise ValueError(f"profiles must be 'known' or 'learned', got {self.profiles!r}")
        self.formulation = Formulation(self.formulation)
        self._rng = random.Random(self.seed)
        self._profiler = Profiler()
        # Insertion-ordered (a dict, not a set) so that runs are reproducible across processes.
        self._idle: dict[str, None] = dict.fromkeys(n for n in self.trace.nodes if n in self.trace.initial_idle)
        self._pending = deque(j for j in self.jobs if j.submit_time <= self.trace.end)
        self._running: dict[str, _Run] = {}
        self._holder: dict[str, str] = {}
        self._t = self.trace.start
        self.result = ReplayResult(trace=self.trace.path, nodes=len(self.trace.nodes), start=self.trace.start, end=self.trace.end)

    # ------------------------------------------------------------ the loop

    def run(self, on_event: EventHook | None = None) -> ReplayResult:
        began = time.perf_counter()
        self.result.transitions = self.trace.transitions
        self._drop_late_jobs()
        self._admit()
        self._reallocate()
        if on_event:
            on_event(self._t, self.result)
        steps = self.trace.steps
        i = 0
        while self._t < self.trace.end:
            next_step = steps[i].time if i < len(steps) else math.inf
            t_next = min(next_step, self._next_finish(), self._next_arrival(), self.trace.end)
            self._advance(t_next)
            if t_next >= self.trace.end:
                break
            if t_next == next_step:
                self._apply(steps[i])
                i += 1
            self._finish_done()
            self._admit()
            self._reallocate()
            if on_event:
                on_event(self._t, self.result)
        self._close()
        self.result.wall_s = time.perf_counter() - began
        return self.result

    def _next_finish(self) -> float:
        best = math.inf
        for run in self._running.values():
            rate = run.rate
            if rate > 0:
                best = min(best, self._t + max(run.remaining, 0.0) / rate)
        return best

    def _next_arrival(self) -> float:
        if len(self._running) < self.max_jobs and self._pending:
            return max(self._pending[0].submit_time, self._t)
        return math.inf

    def _advance(self, t_next: float) -> None:
        """Let time pass: progress at the current rates, node-hours, and reports to the profiler."""
        dt = t_next - self._t
        if dt <= 0:
            return
        used = 0
        for run in self._running.values():
            rate = run.rate
            run.progress += rate * dt
            run.gross += rate * dt
            used += run.count
            if rate > 0 and self.profiles == "learned":
                reported = rate * max(0.0, 1.0 + self._rng.gauss(0.0, self.noise))
                self._profiler.observe(run.spec.name, run.count, reported)
        self.result.idle_node_hours += len(self._idle) * dt / 3600
        self.result.used_node_hours += used * dt / 3600
        self._t = t_next

    def _apply(self, step) -> None:
        """Trace transitions: nodes taken back cost their job one shrink, once per event."""
        hit: dict[str, set[str]] = {}
        for n in step.to_busy:
            self._idle.pop(n, None)
            job = self._holder.pop(n, None)
            if job is not None:
                hit.setdefault(job, set()).add(n)
        for job, gone in hit.items():
            run = self._running[job]
            self._charge(run, run.spec.scale_down_cost_s * run.rate)
            run.preemptions += 1
            run.nodes = run.nodes - gone
        self._idle.update(dict.fromkeys(step.to_idle))

    def _finish_done(self) -> None:
        for name in [n for n, r in self._running.items() if r.remaining <= FINISH_TOLERANCE * r.spec.total_samples]:
            run = self._running.pop(name)
            # Round-off: count exactly the job's work, in both accounts.
            excess = run.progress - run.spec.total_samples
            run.progress -= excess
            run.gross -= excess
            for n in run.nodes:
                self._holder.pop(n, None)
            self._record(run, finished=self._t)
            self.result.jobs_completed += 1
            self._profiler.forget(name)

    def _admit(self) -> None:
        while len(self._running) < self.max_jobs and self._pending and self._pending[0].submit_time <= self._t:
            spec = self._pending.popleft()
            self._running[spec.name] = _Run(spec, admitted=self._t)
            self.result.jobs_started += 1

    def _drop_late_jobs(self) -> None:
        self._pending = deque(j for j in self._pending if j.submit_time <= self.trace.end)

    # ------------------------------------------------------------ allocation

    def _reallocate(self) -> None:
        if not self._running:
            self._snapshot(0.0, "none")
            return
        problem = self._problem()
        began = time.perf_counter()
        answer = allocate(problem, self.formulation, self.time_limit_s)
        solve_ms = (time.perf_counter() - began) * 1000
        self.result.events += 1
        self.result.solve_ms.append(solve_ms)
        self.result.methods[answer.method] = self.result.methods.get(answer.method, 0) + 1
        self._apply_allocation(answer)
        self._snapshot(solve_ms, answer.method)

    def _problem(self) -> Problem:
        jobs = []
        current = {}
        for name, run in self._running.items():
            spec = run.spec
            thr = spec.throughput
            if self.profiles == "learned":
                thr = self._profiler.curve(name, spec.min_nodes, spec.max_nodes)
            jobs.append(
                Job(
                    id=name,
                    min_nodes=spec.min_nodes,
                    max_nodes=spec.max_nodes,
                    throughput=thr,
                    scale_up_cost_s=spec.scale_up_cost_s,
                    scale_down_cost_s=spec.scale_down_cost_s,
                    remaining_samples=max(run.remaining, 0.0),
                    objective=spec.objective,
                    weight=spec.weight,
                )
            )
            if run.nodes:
                current[name] = run.nodes
        return Problem(tuple(jobs), NodePool(tuple(self._idle)), current, self.t_fwd)

    def _apply_allocation(self, answer: Allocation) -> None:
        for name, run in self._running.items():
            new = frozenset(answer.assignment.get(name, ()))
            if new == run.nodes:
                continue
            before = run.rate
            if len(new) > run.count:
                self._charge(run, run.spec.scale_up_cost_s * before)
            elif len(new) < run.count:
                self._charge(run, run.spec.scale_down_cost_s * before)
            run.rescales += 1
            for n in run.nodes - new:
                if self._holder.get(n) == name:  # it may already belong to a job that grew
                    del self._holder[n]
            for n in new - run.nodes:
                self._holder[n] = name
            run.nodes = new

    def _charge(self, run: _Run, samples: float) -> None:
        run.progress -= samples
        run.lost += samples

    # ------------------------------------------------------------ accounts

    def _snapshot(self, solve_ms: float, method: str) -> None:
        if not self.keep_timeline:
            return
        used = sum(r.count for r in self._running.values())
        samples = self.result.samples + sum(r.progress for r in self._running.values())
        self.result.timeline.append(Snapshot(self._t, len(self._idle), used, len(self._running), samples, solve_ms, method))

    def _record(self, run: _Run, finished: float | None) -> None:
        self.result.samples += run.progress
        self.result.ideal_samples += run.gross
        self.result.lost_samples += run.lost
        self.result.jobs.append(
            JobOutcome(run.spec.name, run.spec.model, run.spec.submit_time, run.admitted, finished, run.progress, run.lost, run.rescales, run.preemptions)
        )

    def _close(self) -> None:
        for run in self._running.values():
            self._record(run, finished=None)
        self._running.clear()


def replay(trace: Trace, jobs: list[JobSpec], on_event: EventHook | None = None, **options) -> ReplayResult:
    """Run a whole replay; ``options`` are :class:`Replay`'s fields."""
    return Replay(trace, jobs, **options).run(on_event)

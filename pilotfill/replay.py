"""``pilotfill replay``: the real controller, run through a recorded week on a simulated clock.

This is what a site administrator runs before granting pilotfill a queue, and
how pilotfill is judged. Nothing here decides: the decisions are the
:class:`~pilotfill.controller.Controller`'s — allocation, pilot sizing,
releases, JPA, bookkeeping and journal — driven through its own message
handlers. Around it:

* :class:`~pilotfill.schedulers.replay.ReplayScheduler`, a batch system that
  follows the trace (pilots queue, start, are preempted with a grace period,
  reach their walltime), its agents' messages delivered as real messages;
* :class:`~pilotfill.elastic.simulated.SimulatedRuntime`, which accounts
  progress from the jobs' curves and charges what rescales, starts and stops
  cost (BFTrainer's accounting by default, so the figures compare);
* jobs submitted as ``job.submit`` messages at their submission times.

Semantics follow BFTrainer's replayer where it has them (DESIGN, "The
allocator"): an event is one distinct time — all its transitions, then the
controller's decision; a job finishing between trace rows frees its nodes
then; waiting jobs are weighed by what starting each would add, or in
submission order with ``admission="arrival"`` (BFTrainer's; ``max_jobs``,
its cap of 10 at once, only when asked).

A typed machine (a trace with a node-type map) runs type-aware by default:
the controller is told each kind of node (as ``[node_types]`` would), pilots
ask for one type each and jobs are given their curve per type (``known``),
or learn it per type (``learned``, with the similarity policy when a
``library`` and model descriptors are given). ``node_types="blind"`` replays
the same machine with the controller told nothing of types: jobs still run
at their own rate on whatever type they land on (the slowest one's pace on
mixed nodes), but are placed without regard to it.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .allocator.similarity import Library
from .library_file import write_library
from .lifecycle import JobStatus
from .config import ADMISSIONS, Config, ControllerConfig, NodeTypeConfig, PilotConfig, SimilarityConfig
from .controller import Controller
from .controller.collection import collecting_rarely
from .controller.core import MAX_BATCH
from .elastic.simulated import SimulatedRuntime
from .protocol import JobSubmit
from .schedulers.replay import ReplayScheduler
from .traces import JobSpec, Trace

MAX_ROUNDS = 64
"""Message/step rounds at one simulated time (pilots that start at once, jobs that finish at once)."""
SOLVES_IN_A_ROW = 4
"""Passes without requests the replay gives the controller before a batch, while it says it solves next (a decision
put off, the pilots' sizing, more copies weighed): bounded so that a bug there cannot hold the messages forever."""
FEW_MESSAGES = 100
"""A pass with at most this many messages is an ordinary one (the report's maximum over those is a decision's cost)."""


@dataclass(frozen=True)
class JobOutcome:
    name: str
    model: str
    submitted: float
    admitted: float | None
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
    held_node_hours: float = 0.0
    used_node_hours: float = 0.0
    samples: float = 0.0
    ideal_samples: float = 0.0
    lost_samples: float = 0.0
    jobs_completed: int = 0
    jobs_overran: int = 0  # counted more work than they declared before they returned
    samples_redone: float = 0.0  # counted, then lost to stops: resumed from the last commit and done again
    jobs_running_at_end: int = 0
    jobs_waiting_at_end: int = 0
    jobs_stranded_at_end: int = 0  # had started, hold no nodes at the end although enough sat idle
    jobs_started: int = 0
    job_starts: int = 0
    job_stops: int = 0
    rescales: int = 0
    pilots_submitted: int = 0
    pilots_cancelled: int = 0
    nodes_released: int = 0
    nodes_rerequested_within_60s: int = 0
    idle_transitions: int = 0
    pilots_walltime_ended: int = 0  # pilots that reached their walltime: a node idle longer needs another pilot
    solve_ms: list[float] = field(default_factory=list)
    # per pass of the controller's loop (at most MAX_BATCH messages, then a step)
    controller_ms: list[float] = field(default_factory=list)
    # the same, in this process's CPU time (on a shared machine, what it costs)
    controller_cpu_ms: list[float] = field(default_factory=list)
    controller_messages: list[int] = field(default_factory=list)  # messages each pass handled
    # every pass of one instant of the trace, summed (a whole burst)
    instant_ms: list[float] = field(default_factory=list)
    instant_cpu_ms: list[float] = field(default_factory=list)
    # messages one instant brought (a preemption of 2,000 nodes: 2,000)
    instant_messages: list[int] = field(default_factory=list)
    methods: dict[str, int] = field(default_factory=dict)
    jobs: list[JobOutcome] = field(default_factory=list)
    timeline: list[Snapshot] = field(default_factory=list)
    wall_s: float = 0.0
    accounting: str = "bftrainer"
    node_types: str = "none"  # "aware", "blind" (a typed machine) or "none" (one kind of node)
    type_node_hours: dict[str, float] = field(default_factory=dict)  # node-hours jobs used, per node type
    # the longest any submitted job waited for its first start (one never started: until the end)
    longest_wait_s: float = 0.0
    longest_wait_started_s: float = 0.0  # the same, over the jobs that started
    longest_rewait_s: float = 0.0  # the longest a job stopped before its end waited to run again (or until the end)
    jobs_never_started: int = 0

    @property
    def efficiency(self) -> float:
        return self.samples / self.ideal_samples if self.ideal_samples > 0 else 1.0

    def as_dict(self) -> dict:
        def pct(values: list[float], q: float) -> float:
            return float(np.percentile(values, q)) if values else 0.0

        return {
            "trace": self.trace,
            "nodes": self.nodes,
            "start": self.start,
            "end": self.end,
            "accounting": self.accounting,
            "events": self.events,
            "transitions": self.transitions,
            "idle_node_hours": self.idle_node_hours,
            "held_node_hours": self.held_node_hours,
            "used_node_hours": self.used_node_hours,
            "samples": self.samples,
            "ideal_samples": self.ideal_samples,
            "lost_samples": self.lost_samples,
            "efficiency": self.efficiency,
            "jobs_completed": self.jobs_completed,
            "jobs_overran": self.jobs_overran,
            "samples_redone": self.samples_redone,
            "jobs_running_at_end": self.jobs_running_at_end,
            "jobs_waiting_at_end": self.jobs_waiting_at_end,
            "jobs_stranded_at_end": self.jobs_stranded_at_end,
            "jobs_started": self.jobs_started,
            "job_starts": self.job_starts,
            "job_stops": self.job_stops,
            "rescales": self.rescales,
            "pilots_submitted": self.pilots_submitted,
            "pilots_cancelled": self.pilots_cancelled,
            "nodes_released": self.nodes_released,
            "nodes_rerequested_within_60s": self.nodes_rerequested_within_60s,
            "idle_transitions": self.idle_transitions,
            "pilots_walltime_ended": self.pilots_walltime_ended,
            "solve_ms_p50": pct(self.solve_ms, 50),
            "solve_ms_p99": pct(self.solve_ms, 99),
            "solve_ms_max": max(self.solve_ms, default=0.0),
            "controller_ms_p50": pct(self.controller_ms, 50),
            "controller_ms_p99": pct(self.controller_ms, 99),
            "controller_ms_max": max(self.controller_ms, default=0.0),
            "controller_cpu_ms_p50": pct(self.controller_cpu_ms, 50),
            "controller_cpu_ms_p99": pct(self.controller_cpu_ms, 99),
            "controller_cpu_ms_max": max(self.controller_cpu_ms, default=0.0),
            # Passes with few messages are decisions; an instant that brings thousands of messages (a big preemption,
            # a thousand pilots starting) is handled in several passes: the most messages one instant brought, what the
            # busiest instant cost in all its passes, and the CPU maximum over the passes with few messages.
            "controller_messages_max": max(self.instant_messages, default=0),
            "controller_cpu_ms_max_few_messages": max(
                (c for c, m in zip(self.controller_cpu_ms, self.controller_messages) if m <= FEW_MESSAGES), default=0.0
            ),
            "instant_ms_max": max(self.instant_ms, default=0.0),
            "instant_cpu_ms_max": max(self.instant_cpu_ms, default=0.0),
            "methods": dict(self.methods),
            "wall_s": self.wall_s,
            "node_types": self.node_types,
            "type_node_hours": dict(self.type_node_hours),
            "longest_wait_s": self.longest_wait_s,
            "longest_wait_started_s": self.longest_wait_started_s,
            "longest_rewait_s": self.longest_rewait_s,
            "jobs_never_started": self.jobs_never_started,
        }


EventHook = Callable[[float, "Replay"], None]
SHARE_BY = ("group", "model", "family")


def group_of(spec: JobSpec, share_by: str) -> str:
    """A replayed job's group (see :attr:`Replay.share_by`): a model family is its model's name less ``-bsN`` (the
    heterogeneous data set's ``ResNet-18-bs64`` is of ``ResNet-18``)."""
    if share_by == "model":
        return spec.model
    if share_by == "family":
        return spec.model.rsplit("-bs", 1)[0]
    return spec.group


@dataclass
class Replay:
    """The simulated machine around a real controller. ``run()`` drives it from the trace's start to its end."""

    trace: Trace
    jobs: list[JobSpec]
    max_jobs: int = 0  # 0: no cap (the machine and the jobs' min_nodes bound what runs); BFTrainer's setup: 10
    t_fwd: float = 0.0  # 0: the controller's learned horizon; BFTrainer's comparison uses 10
    formulation: str = "aggregated"
    profiles: str = "known"
    noise: float = 0.03
    seed: int = 0
    time_limit_s: float = 1.0
    keep_timeline: bool = True
    accounting: str = "bftrainer"
    queue_delay_s: float = 0.0
    grace_s: float = 5.0
    pilot_walltime_s: float = 6 * 3600.0
    nodes_per_pilot: int = 1
    max_queued_pilots: int = 1_000_000
    max_submits_per_minute: int = 1_000_000
    run_dir: Path | None = None
    node_types: str = "aware"  # a typed machine: "aware" (the controller knows the types) or "blind"
    library: Library | None = None  # the similarity policy's measured models (learned profiles; jobs need descriptors)
    library_learns: bool = False  # jobs measured in this replay join the library (False: held-out models stay held out)
    objective: str = "samples"  # the controller's: "samples" or "share" (each group its share first)
    # objective "share": the most of a decision's samples optimum the shares may cost
    share_cost: float = ControllerConfig.share_cost
    # the controller's: waiting jobs weighed by what starting each would add, or "arrival" (BFTrainer's)
    admission: str = "worth"
    # admission by worth: how long a job waits before it is due (None: the controller's own)
    overdue_s: float | None = None
    # admission by worth: the most of the room due jobs take at once (None: the controller's own)
    due_share: float | None = None
    # what a job's group is: the job file's "group" column, its "model", or the model's "family" (its name less "-bsN")
    share_by: str = "group"
    # a model less similar than this to every measured one is measured once on every type (0: never)
    far: float = SimilarityConfig.far
    # "in_place": a stop loses no work since the last commit (the torch runtime's in-place resize)
    rescale: str = "restart"

    def __post_init__(self) -> None:
        if self.max_jobs < 0:
            raise ValueError(f"max_jobs must be 0 (no cap) or more, got {self.max_jobs}")
        if self.profiles not in ("known", "learned"):
            raise ValueError(f"profiles must be 'known' or 'learned', got {self.profiles!r}")
        if self.share_by not in SHARE_BY:
            raise ValueError(f"share_by must be one of {', '.join(SHARE_BY)}, got {self.share_by!r}")
        if not 0.0 <= self.far <= 1.0:
            raise ValueError(f"far must be a similarity from 0 to 1, got {self.far!r}")
        if not 0.0 <= self.share_cost <= 1.0:
            raise ValueError(f"share_cost must be between 0 and 1, got {self.share_cost!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}")
        if self.node_types not in ("aware", "blind"):
            raise ValueError(f"node_types must be 'aware' or 'blind', got {self.node_types!r}")
        self.typed = bool(self.trace.types) and self.node_types == "aware"
        self.result = ReplayResult(
            trace=self.trace.path,
            nodes=len(self.trace.nodes),
            start=self.trace.start,
            end=self.trace.end,
            accounting=self.accounting,
            node_types=self.node_types if self.trace.types else "none",
        )
        self.now = self.trace.start
        self.scheduler = ReplayScheduler(
            self.trace, self.queue_delay_s, self.grace_s, self.pilot_walltime_s, typed=self.typed
        )
        specs = {j.name: j for j in self.jobs}
        self.runtime = SimulatedRuntime(
            specs,
            self.accounting,
            self.noise if self.profiles == "learned" else 0.0,
            self.seed,
            now=self.trace.start,
            node_types=self.trace.types,
            rescale=self.rescale,
        )
        self.controller: Controller | None = None
        self._names: dict[str, str] = {}  # controller job id -> job name
        self._submitted_at: dict[str, float] = {}

    def config(self) -> Config:
        """The controller's config: the replay's options, and agents that never go silent."""
        span = max(1.0, self.trace.end - self.trace.start)
        pilots = PilotConfig(
            heartbeat_s=span,
            heartbeat_deadline_s=2 * span + 1,
            grace_s=self.grace_s,
            nodes_per_pilot=self.nodes_per_pilot,
            max_queued_pilots=self.max_queued_pilots,
            max_submits_per_minute=self.max_submits_per_minute,
        )
        controller = ControllerConfig(
            tick_s=1.0,
            t_fwd=self.t_fwd,
            max_jobs=self.max_jobs,
            solver_time_limit_s=self.time_limit_s,
            formulation=self.formulation,
            objective=self.objective,
            share_cost=self.share_cost,
            admission=self.admission,
        )
        if not self.typed:
            return Config(scheduler="replay", pilots=pilots, controller=controller, source="<replay>")
        types = tuple(NodeTypeConfig(t) for t in sorted(self.trace.type_counts()))
        similarity = SimilarityConfig(
            libraries=(str(self._library_file),) if self.library is not None else (),
            library=str(self._own_library),
            enabled=self.library is not None,
            far=self.far,
        )
        return Config(
            scheduler="replay",
            pilots=pilots,
            controller=controller,
            source="<replay>",
            node_types=types,
            similarity=similarity,
        )

    # ------------------------------------------------------------ the loop

    def run(self, on_event: EventHook | None = None) -> ReplayResult:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="pilotfill-replay-") as tmp:
            run_dir = Path(self.run_dir) if self.run_dir is not None else Path(tmp) / "run"
            # The similarity library this replay starts from, and where what it measures goes: never the user's.
            self._library_file, self._own_library = Path(tmp) / "library.json", Path(tmp) / "measured.json"
            if self.library is not None:
                write_library(self.library, self._library_file)
            self.controller = Controller(
                run_dir, self.config(), scheduler=self.scheduler, runtime=self.runtime, clock=lambda: self.now
            )
            if not self.library_learns:
                self.controller.types.freeze()
            if self.overdue_s is not None:  # measuring the rule's other settings (docs/sites.md)
                self.controller.planner.overdue_s = self.overdue_s
            if self.due_share is not None:
                self.controller.planner.due_share = self.due_share
            try:
                with collecting_rarely():  # as in a controller's process
                    self._loop(on_event)
            finally:
                self._close()
        self.result.wall_s = time.perf_counter() - began
        return self.result

    def _loop(self, on_event: EventHook | None) -> None:
        arrivals = deque(
            sorted((j for j in self.jobs if j.submit_time <= self.trace.end), key=lambda j: (j.submit_time, j.line))
        )
        self.result.transitions = self.trace.transitions
        t = self.trace.start
        while True:
            self._advance(t)
            spent, cpu = self._event(t, arrivals)
            self.result.instant_ms.append(spent)
            self.result.instant_cpu_ms.append(cpu)
            if on_event is not None:
                on_event(t, self)
            t_next = min(
                self.scheduler.next_time(),
                self.runtime.next_time(),
                arrivals[0].submit_time if arrivals else math.inf,
                self.trace.end,
            )
            if t_next >= self.trace.end:
                self._advance(self.trace.end)
                return
            t = max(t_next, t)

    def _event(self, t: float, arrivals: deque[JobSpec]) -> tuple[float, float]:
        """Everything that happens at time ``t``, through the controller; returns its wall and CPU time in ms.

        Messages go through the controller as the process's loop takes them: passes of at most
        :data:`~pilotfill.controller.core.MAX_BATCH` requests, committed together, each followed by a step (which
        holds the decision back while more of the burst waits). Each pass's time is recorded (what a reply or a
        decision waits for), and the instant's total is returned."""
        ctl = self.controller
        assert ctl is not None
        first = len(self.result.controller_ms)
        handled = 0
        for _ in range(MAX_ROUNDS):
            self.scheduler.advance(t)
            messages = self.runtime.outbox + self.scheduler.outbox
            self.runtime.outbox, self.scheduler.outbox = [], []
            while arrivals and arrivals[0].submit_time <= t:
                messages.append(self._submission(arrivals.popleft()))
            handled += len(messages)
            passes = [messages[i : i + MAX_BATCH] for i in range(0, len(messages), MAX_BATCH)] or [[]]
            for k, batch in enumerate(passes):
                # as the process's loop: a pass that solves the machine reads no request
                for _ in range(SOLVES_IN_A_ROW):
                    if not ctl.solves_next:
                        break
                    self._pass(t, [], False)
                self._pass(t, batch, k < len(passes) - 1)
            if not messages and not self.scheduler.outbox and not self._starting_now(t) and not ctl.busy:
                break
        self._snapshot(t)
        self.result.instant_messages.append(handled)
        return sum(self.result.controller_ms[first:]), sum(self.result.controller_cpu_ms[first:])

    def _pass(self, t: float, batch: list[dict], more: bool) -> None:
        """One pass of the controller's loop at ``t``: ``batch`` handled, then a step;
        its wall and CPU time recorded."""
        ctl = self.controller
        assert ctl is not None
        began, began_cpu = time.perf_counter(), time.process_time()
        for m, reply in zip(batch, ctl.handle_batch(batch)):
            if m["type"] == "job.submit" and reply.get("ok"):
                self._names[reply["job_id"]] = m["spec"]["name"]
        ctl.step(t, more=more)
        wall, used = (time.perf_counter() - began) * 1000, (time.process_time() - began_cpu) * 1000
        self.result.controller_ms.append(wall)
        self.result.controller_cpu_ms.append(used)
        self.result.controller_messages.append(len(batch))

    def jobs_done(self) -> int:
        """Jobs finished so far (for progress displays)."""
        return sum(1 for j in self.runtime.jobs.values() if j.finished is not None)

    def _starting_now(self, t: float) -> bool:
        return self.scheduler.startable(t)

    def _submission(self, spec: JobSpec) -> dict:
        job = {
            "name": spec.name,
            "entry": "pilotfill.replay:simulated",
            "min_nodes": spec.min_nodes,
            "max_nodes": spec.max_nodes,
            "total_samples": spec.total_samples,
            "scale_up_cost_s": spec.scale_up_cost_s,
            "scale_down_cost_s": spec.scale_down_cost_s,
            "restart_cost_s": 0.0
            if self.accounting == "bftrainer"
            else self.runtime.start_cost_s + (self.runtime.commit_interval_s / 2 if self.rescale == "restart" else 0.0),
            "weight": spec.weight,
            "group": group_of(spec, self.share_by),
        }
        if self.profiles == "known":  # BFTrainer's setting: curves and costs known, as the job file gives them
            job["curve"] = {"nodes": list(spec.throughput.nodes), "samples_per_s": list(spec.throughput.values)}
            if self.typed and spec.curves:  # and per node type; a type-blind controller knows the base curve only
                job["curves"] = {
                    t: {"nodes": list(c.nodes), "samples_per_s": list(c.values)} for t, c in spec.curves.items()
                }
                del job["curve"]
            job["costs_known"] = True
        else:  # learning: the controller knows what a user who wrote nothing gives it; JPA measures the rest
            for cost in ("scale_up_cost_s", "scale_down_cost_s", "restart_cost_s"):
                del job[cost]
            job["model_name"] = spec.model  # as the decorator says it (the job file's model column)
        if spec.objective is not None:
            # steers; progress stays samples
            job["objective"] = {"nodes": list(spec.objective.nodes), "values": list(spec.objective.values)}
        if self.typed and self.library is not None and spec.descriptor is not None and self.profiles == "learned":
            job["model"] = spec.descriptor.to_dict()  # as the decorator declares it, or its ranks measure it
        return JobSubmit(job).to_dict()

    def _advance(self, t: float) -> None:
        """Time passes to ``t`` at the current sizes: progress, and node-hours."""
        dt = t - self.now
        if dt > 0:
            idle = len(self.trace.nodes) - len(self.scheduler.main_busy)
            self.result.idle_node_hours += idle * dt / 3600
            self.result.held_node_hours += len(self.scheduler.holder) * dt / 3600
        self.runtime.advance(t)
        self.now = max(self.now, t)

    def _snapshot(self, t: float) -> None:
        ctl = self.controller
        assert ctl is not None
        self.result.events = len(ctl.stats["solve_ms"])
        if not self.keep_timeline:
            return
        used = sum(len(j.hosts) for j in self.runtime.running.values())
        samples = sum(j.done for j in self.runtime.jobs.values())
        solve = ctl.stats["solve_ms"][-1] if ctl.stats["solve_ms"] else 0.0
        method = ctl.last_method or "none"
        idle = len(self.trace.nodes) - len(self.scheduler.main_busy)
        self.result.timeline.append(Snapshot(t, idle, used, len(self.runtime.running), samples, solve, method))

    def _close(self) -> None:
        ctl = self.controller
        res = self.result
        waiting: list[str] = []  # admitted (among the jobs the allocator considers) but never given a node
        if ctl is not None:
            waiting = [j.id for j in ctl.world.active_jobs(self.max_jobs) if j.id not in self.runtime.jobs]
            res.solve_ms = list(ctl.stats["solve_ms"])
            res.events = len(res.solve_ms)
            res.methods = dict(ctl.methods)
            counters = ctl.world.counters
            res.pilots_submitted = counters["pilots_submitted"]
            res.pilots_cancelled = counters["pilots_cancelled"]
            res.nodes_released = counters["nodes_released"]
            res.jobs_overran = counters["jobs_overran"]
            res.samples_redone = float(counters["samples_redone"])
            world = ctl.world
            res.jobs_running_at_end = len(world.running)
            pending = [j for j in world.open.values() if j.status == JobStatus.PENDING]
            res.jobs_waiting_at_end = len(pending)
            free = sum(1 for n in world.ready_nodes() if n.job is None) + (self.scheduler.idle_nodes() or 0)
            res.jobs_stranded_at_end = sum(1 for j in pending if j.launches and j.spec["min_nodes"] <= free)
            ctl.shutdown()
        counts = self.scheduler.counts
        res.nodes_rerequested_within_60s = counts.rerequested_within_60s
        res.idle_transitions = counts.idle_transitions
        res.pilots_walltime_ended = counts.walltime_ends
        res.used_node_hours = self.runtime.used_node_s / 3600
        res.type_node_hours = {t: s / 3600 for t, s in sorted(self.runtime.type_node_s.items())}
        for job_id, job in self.runtime.jobs.items():
            if job.finished is not None:
                samples = job.spec.total_samples
                res.jobs_completed += 1
            else:
                samples = job.done - job.debt
            res.samples += samples
            res.ideal_samples += job.gross
            res.lost_samples += job.charged
            res.jobs_started += 1
            res.job_starts += job.starts
            res.job_stops += job.stops
            res.rescales += job.rescales
            res.jobs.append(
                JobOutcome(
                    job.spec.name,
                    job.spec.model,
                    job.spec.submit_time,
                    job.first_start,
                    job.finished,
                    samples,
                    job.charged,
                    job.rescales,
                    job.preemptions,
                )
            )
        self._waits(res)
        specs = {j.name: j for j in self.jobs}
        for job_id in waiting:
            spec = specs[self._names[job_id]]
            res.jobs_started += 1
            res.jobs.append(JobOutcome(spec.name, spec.model, spec.submit_time, None, None, 0.0, 0.0, 0, 0))


    def _waits(self, res: ReplayResult) -> None:
        """How long jobs waited: for their first start (a job never started, until the end) and, stopped before their
        end, to run again."""
        end = self.trace.end
        started = {job.spec.name: job for job in self.runtime.jobs.values()}
        first: list[float] = []
        for spec in self.jobs:
            if spec.submit_time > end:
                continue
            job = started.get(spec.name)
            submitted = max(spec.submit_time, self.trace.start)  # one submitted before the window: at its start
            if job is None or job.first_start is None:
                res.jobs_never_started += 1
                res.longest_wait_s = max(res.longest_wait_s, end - submitted)
            else:
                first.append(job.first_start - submitted)
        res.longest_wait_started_s = max(first, default=0.0)
        res.longest_wait_s = max(res.longest_wait_s, res.longest_wait_started_s)
        for job in started.values():
            pending = end - job.stopped_at if job.stopped_at is not None and job.finished is None else 0.0
            res.longest_rewait_s = max(res.longest_rewait_s, job.longest_rewait_s, pending)


def replay(trace: Trace, jobs: list[JobSpec], on_event: EventHook | None = None, **options) -> ReplayResult:
    """Run a whole replay; ``options`` are :class:`Replay`'s fields."""
    return Replay(trace, jobs, **options).run(on_event)


def simulated() -> None:  # pragma: no cover - the entry a replayed job names; it never runs
    raise RuntimeError("a replayed job runs only in the simulated runtime")


__all__ = ["JobOutcome", "Replay", "ReplayResult", "Snapshot", "replay"]

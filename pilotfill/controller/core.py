"""The controller: the only place that decides.

Every event — a node joins, a node is leaving or lost, a job arrives, ends or
fails, a rank dies, a new throughput estimate — is one pass: update the state
(memory and journal), mark the allocation dirty, and let :meth:`Controller.decide`
move nodes, once, for everything that changed. Messages dispatch through a
handler table (as dask distributed's scheduler does); every way a node can go
(its pilot got SIGTERM, ended or went silent, it was released, its rank
crashed) ends in :meth:`Controller.remove_nodes`, as every way a dask worker
goes ends in ``remove_worker``.

The loop is here — dispatch, ``remove_nodes``, the pass, the phases of a
decision, applying an answer, ending a job — and the rest is in collaborators
that own their caches: what a decision and the pilots' question weigh
(:mod:`.weighing`), the allocator's views of the jobs (:mod:`.views`), the
waiting queue (:mod:`.waiting`), the pilots' liveness — the batch system's
events, heartbeats, walltimes (:mod:`.liveness`) — taking over from a
predecessor (:mod:`.recovery`), the batch system behind back-off
(:mod:`.gateway`), the pilots themselves (:mod:`pilotfill.pilots.manager`).

The controller runs on a clock it is given: the process in
:mod:`pilotfill.controller.process` gives it the wall clock and a ZeroMQ
server; ``pilotfill replay`` gives it a simulated clock, a trace-driven batch
system and a simulated runtime — the same code, measured.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple


from .. import procs
from ..allocator import Allocation, Problem, ProblemError, Profiler, compiled
from ..config import Config
from ..elastic.base import RankExit, Runtime
from ..elastic.ending import exit_words
from ..elastic.registry import NAMES as RUNTIME_NAMES
from ..elastic.registry import runtime_class
from ..elastic.runtimes import JobRuntimes
from ..lifecycle import TERMINAL, IllegalMove
from ..pilots.launcher import AgentLauncher
from ..pilots.manager import PilotManager
from ..protocol import (
    JobCancel,
    JobCommit,
    JobDescribe,
    JobFailed,
    JobGet,
    JobReport,
    JobResult,
    JobStatusQuery,
    JobSubmit,
    Message,
    PilotHeartbeat,
    PilotLeaving,
    PilotRegister,
    ProtocolError,
    StateSnapshot,
    check_spec,
    parse,
)
from ..schedulers.base import BatchScheduler, PilotEvent, SchedulerConfigError
from ..security import create_secret, private_dir
from ..state import JournalError, State
from ..transport import Park
from .gateway import SchedulerGateway
from .horizon import PoolHorizon
from .liveness import Heard, Liveness
from .recovery import take_over
from .meter import Meter
from .phases import Burst, Decision, Phase
from .types import NodeTypes
from .views import AllocatorViews
from .waiting import WaitingJobs
from .walltime import Walltimes, lead_s
from .weighing import Solved, Weighing
from .world import Job, Pilot, World

log = logging.getLogger("pilotfill.controller")

JOB_RETRIES = 3
"""A job whose launcher dies without a result or a reported failure is retried this often, then failed."""
SETTLE_S = 2.0
"""Growth waits this long for the other pilots of one request to arrive, so a job grows once, not once per pilot."""
SETTLE_MAX_S = 10.0
"""…but never longer than this in a row."""
STOP_MARGIN_S = 10.0
"""Stopping waits for ranks this long past the pilots' grace: for an agent's heartbeat to say they are gone."""
MAX_BATCH = 256
"""Requests one pass of the loop handles (one group commit) before the controller steps: a flood of messages never
starves heartbeat checks or the allocation, and no reply waits behind more than this many others."""
FLOOD_DEFER_S = 1.0
"""While requests keep arriving in full passes (a burst: a preemption of thousands of nodes), the decision waits for
the rest of the burst — one decision for all of it, not one per pass — but never longer than this."""
SIZE_APART_JOBS = 128
"""With at least this many open jobs, a decision sizes the pilots in the loop's next pass, not in its own: the two
are the controller's two solves of the whole machine, and replies to the requests that arrived meanwhile go out
between them, not after both."""
DECIDE_APART_MESSAGES = 16
"""With at least :data:`SIZE_APART_JOBS` open jobs, a decision due in a pass that handled this many requests is taken in
the loop's next pass instead (at once: the loop does not wait in between), a pass that reads no request
(:attr:`Controller.solves_next`): a thousand reports and a whole-machine decision are two passes, not one, and neither
the replies nor the decision waits for both."""
PRUNE_EVERY_S = 60.0
KEEP_EVENTS = 50_000
KEEP_ENDED_PILOTS = 2_000
VALIDATE = os.environ.get("PILOTFILL_VALIDATE") == "1"
"""Check the world's indexes after every step (the tests set it; it costs a pass over every job, pilot and node)."""


class Decided(NamedTuple):
    """A large decision taken in one pass, to be applied in the next (:meth:`Controller.decide` ``late``)."""

    solved: Solved
    solve_ms: float
    idle: int  # the idle nodes it was taken with: the pilots are sized on them
    apart: bool  # taken with SIZE_APART_JOBS open jobs or more: offers and the pilots' sizing in the passes after


class Controller:
    """The decision loop over a batch system (pilots), a runtime (ranks) and the journal."""

    def __init__(
        self,
        run_dir: Path,
        config: Config,
        scheduler: BatchScheduler | None = None,
        runtime: Runtime | None = None,
        clock: Callable[[], float] = time.time,
        new_campaign: bool = False,
        checkpoint_dir: Path | None = None,
    ):
        self.run_dir = private_dir(Path(run_dir))
        self.config = config
        self.clock = clock
        self.key = create_secret(self.run_dir)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else self.run_dir / "checkpoints"
        self.journal = State(self.run_dir)
        with self.journal.transaction():
            self.incarnation = self.journal.next_incarnation()
        self.world = World(self.journal)
        self.world.load()
        self.started = clock()
        compiled.warm()  # the allocator's compiled DP is loaded before the loop, not in its first decision
        self.profiler = Profiler()
        self.pool_horizon = PoolHorizon(self.world, self.journal, config.controller.t_fwd)  # how long an allocation made now lasts
        self.holds, self.lifetimes = self.pool_horizon.holds, self.pool_horizon.lifetimes
        self._sized_at: dict[str, float] = {}  # running job -> when its nodes last changed
        self.dirty = True
        self.urgent = False
        self.stopping = False
        self.draining = False  # stopping: ranks are leaving at their commits; nothing is decided any more
        self._leaving_ranks: set[tuple[str, str]] = set()  # (job, host) told to leave while stopping, not yet gone
        self.heard = Heard(config.pilots.heartbeat_deadline_s, stall_s=max(config.pilots.heartbeat_s, 2 * config.controller.tick_s, 1.0))
        self._last_step: float | None = None
        self._polled_at = 0.0  # the last scheduler poll
        self._backlog: deque[tuple[PilotEvent, float]] = deque()  # what polls said, not yet handled (with when the poll before was)
        self._meters: dict[str, Meter] = {}
        self._changed: dict[str, tuple[float, str]] = {}  # job -> (when, kind) of a start or resize not yet seen training
        self._committed_at: dict[str, float] = {}  # job -> its last commit (the commit interval is learned from these)
        self._settle_since: float | None = None
        self.decision = Decision()  # what the next pass owes of a decision spread over passes (controller/phases.py)
        self.burst = Burst()  # requests read in a row: a decision waits for the rest of a burst
        self._last_idle: int | None = None
        self._pruned_at = self.started
        self._account_at = self.started
        self._held_s = self._used_s = 0.0
        self.stats: dict[str, list[float]] = {"solve_ms": [], "decide_ms": []}
        self.methods: Counter[str] = Counter()
        self._errors = 0
        self.last_method: str | None = None
        self.launcher = AgentLauncher(self.world, wake=self._wake_later)
        self.wake: Callable[[str], object] | None = None  # answers a pilot's parked heartbeat now (set by the serving process)
        self._to_wake: set[str] = set()
        self._batching = False  # inside handle_batch: wakes wait for the batch's commit
        self.scheduler = scheduler or self._make_scheduler()
        self.gateway = SchedulerGateway(self.scheduler, self.world, self.clock)  # every call into the batch system, backed off on failure
        self.runtime = runtime or self._make_runtime()
        self.types = NodeTypes(config, self.run_dir, self.profiler)  # a machine with several kinds of node (controller/types.py)
        self.views = AllocatorViews(self.world, self.profiler, self.types)  # the allocator's view of each job, made anew when it changed
        views = self.views
        self.waiting = WaitingJobs(views.waiting_kind, views.waiting_worth, views.waiting_version, views.waiting_traits)  # kept until a job changes
        self._idle_types: dict[str, int] | None = None
        self.walltimes = Walltimes(lead_s(config.pilots.grace_s, config.controller.tick_s))  # pilots' ends (controller/walltime.py)
        self.weighing = Weighing(self.world, config.controller, self.profiler, self.types, views, self.waiting, self.walltimes, self.pool_horizon.at,
                                 clock, fail=lambda job, error, why: self._end_job(job, self.clock(), "failed", error=error, why=why))  # fmt: skip
        self.liveness = Liveness(self.world, self.heard, self.walltimes, self.gateway, self.scheduler, self.profiler, ends=self,
                                 changed=self._decide_again)  # the batch system's events, silent pilots, walltimes (controller/liveness.py)
        self.pilots = PilotManager(self.world, config.pilots, self.gateway, question=self.weighing, ends=self, incarnation=self.incarnation,
                                   wake=self._wake_later)  # fmt: skip
        self.handlers: dict[str, Callable[[Message, float], dict[str, Any] | Park]] = {  # one per message type (protocol.BY_TYPE)
            PilotRegister.TYPE: self._on_pilot_register,
            PilotHeartbeat.TYPE: self._on_pilot_heartbeat,
            PilotLeaving.TYPE: self._on_pilot_leaving,
            JobSubmit.TYPE: self._on_job_submit,
            JobReport.TYPE: self._on_job_report,
            JobDescribe.TYPE: self._on_job_describe,
            JobCommit.TYPE: self._on_job_commit,
            JobResult.TYPE: self._on_job_result,
            JobFailed.TYPE: self._on_job_failed,
            JobCancel.TYPE: self._on_job_cancel,
            JobGet.TYPE: self._on_job_get,
            JobStatusQuery.TYPE: self._on_job_status,
            StateSnapshot.TYPE: self._on_state_snapshot,
        }
        for kind in RUNTIME_NAMES:  # a runtime's own messages go to it (the torch agents' rendezvous)
            for type_ in runtime_class(kind).handles:
                self.handlers[type_] = functools.partial(self._on_runtime_message, kind)
        # Take over from a predecessor (controller/recovery.py): what it ran is gone, its running jobs resume from their commits.
        take_over(self.world, self.journal, self.gateway, self.scheduler, self.heard, self, self.incarnation, self.clock(), new_campaign, KEEP_ENDED_PILOTS)
        self.urgent = False
        for pilot in self.world.pilots.values():
            self.walltimes.track(pilot.id, pilot.walltime_end)
        gc.freeze()  # see _step_in_transaction: what is alive now is never scanned by the collector again


    # ------------------------------------------------------------ construction

    def horizon(self, now: float, extra: int = 0) -> float:
        """Seconds an allocation made now is expected to last (:meth:`.PoolHorizon.at`)."""
        return self.pool_horizon.at(now, extra)

    def _make_runtime(self) -> Runtime:
        """Each job on the runtime its app names, else the configured one (:mod:`pilotfill.elastic.runtimes`); every
        process a runtime puts on a compute node goes through the node's pilot agent (``self.launcher``)."""
        def make(kind: str) -> Runtime:
            return runtime_class(kind).from_config(self.config, self.run_dir, self.launcher, on_spawn=self._record_process)

        return JobRuntimes(self.config.runtime.kind, make)

    def _make_scheduler(self) -> BatchScheduler:
        """The configured batch system's adapter (:mod:`pilotfill.schedulers.registry`)."""
        from ..schedulers.registry import adapter_class

        def record(p, what: str, host: str) -> None:
            self._record_process(p, what, None, host)

        return adapter_class(self.config.scheduler).from_config(self.config, self.run_dir, on_spawn=record)

    def _record_process(self, proc, kind: str, job: str | None, host: str | None) -> None:
        ticks = procs.start_ticks(proc.pid)
        if ticks is not None:
            with self.journal.transaction():
                self.journal.add_process(proc.pid, ticks, kind, self.incarnation, job, host)

    # ------------------------------------------------------------ messages

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """Apply one authenticated request; everything it changed is committed before the reply."""
        try:
            request = parse(message)
            now = self.clock()
            handler = self.handlers[request.TYPE]
            if request.READ_ONLY:
                return {"ok": True, **handler(request, now)}
            with self.journal.transaction():
                reply = handler(request, now)
            if not self._batching:
                self._flush_wakes()
            return reply if isinstance(reply, Park) else {"ok": True, **reply}
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        except JournalError:
            raise  # nothing more can be committed: the process stops the run cleanly
        except Exception as exc:  # a bug must not take the controller down; the journal holds what memory holds
            log.error("error handling %s: %s", message.get("type"), traceback.format_exc())
            return {"ok": False, "error": f"internal error: {exc!r}"}

    @contextmanager
    def together(self) -> Iterator[None]:
        """Requests handled inside commit together (a group commit): every reply still follows the commit of what
        it changed, and a burst — a thousand pilots told to leave at once — costs one commit, not a thousand. A
        journal that cannot be written raises before any reply is given. Parked heartbeats with news are woken after."""
        self._batching = True
        try:
            with self.journal.transaction():
                yield
        finally:
            self._batching = False
        self._flush_wakes()

    def handle_batch(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply requests that arrived together (:meth:`together`); their replies, in order."""
        self.burst.handled += len(messages)
        with self.together():
            return [self.handle(m) for m in messages]

    def _on_job_get(self, message: JobGet, now: float) -> dict[str, Any]:
        job = self._known_job(message.job_id)
        return {"job": job.record(), "checkpoint": str(self.checkpoint_dir / f"{job.key or job.id}.pt")}

    def _on_job_status(self, message: JobStatusQuery, now: float) -> dict[str, Any]:
        jobs = {}
        for job_id in message.job_ids:
            job = self.world.jobs.get(job_id) if isinstance(job_id, str) else None
            if job is not None:
                jobs[job_id] = {"id": job.id, "status": job.status, "progress": job.progress, "committed": job.committed, "result": job.result, "error": job.error,
                                **self.types.placement_of(job.id)}  # fmt: skip
        return {"jobs": jobs}

    def _on_state_snapshot(self, message: StateSnapshot, now: float) -> dict[str, Any]:
        self._account(now)
        return {**self.world.snapshot(), "events": self.journal.events(limit=50), "incarnation": self.incarnation, "placement": self.types.placement(), "submit_problem": self.pilots.problem,
                "node_seconds": {"held": self.world.counters["held_node_s"] + self._held_s, "used": self.world.counters["used_node_s"] + self._used_s}}  # fmt: skip

    def _account(self, now: float) -> None:
        """Integrate node-seconds held by pilots and used by jobs since the last call (kept in memory, journaled each minute)."""
        dt = now - self._account_at
        if dt > 0:
            self._held_s += len(self.world.ready) * dt
            self._used_s += sum(len(j.nodes) for j in self.world.running.values()) * dt
        self._account_at = now

    def _journal_accounts(self) -> None:
        for name, attr in (("held_node_s", "_held_s"), ("used_node_s", "_used_s")):
            whole = int(getattr(self, attr))
            if whole:
                self.world.count(name, whole)
                setattr(self, attr, getattr(self, attr) - whole)

    def _on_job_submit(self, message: JobSubmit, now: float) -> dict[str, Any]:
        spec = check_spec(message.spec)
        world = self.world
        request = message.rid
        if request is not None and (done := self.journal.job_by_request(request)) is not None:
            return {"job_id": done, "reused": True}  # a retry of a submission an earlier incarnation applied
        key = spec.get("key")
        earlier = world.jobs.get(world.by_key.get(key, "")) if key else None
        if earlier is not None and earlier.status not in ("failed", "cancelled"):
            # The same call again (a re-run of the campaign): the job it already is — finished, or resuming.
            if earlier.held:
                world.claim(earlier)
                world.log("job.claimed", now, job=earlier.id, name=earlier.name, progress=earlier.progress)
                self.dirty = True
            return {"job_id": earlier.id, "reused": True}
        capacity = self.capacity()
        if spec["min_nodes"] > capacity:
            raise ProtocolError(f"job spec: min_nodes {spec['min_nodes']} is more than this machine could ever give ({capacity} nodes)")
        if spec["max_nodes"] > capacity:
            spec["max_nodes"] = capacity  # no job can hold more than there is; asking for more is not an error
        job = world.add_job(world.next_job_id(), spec["name"], spec, now, key=key)
        if request is not None:
            self.journal.set_job(job.id, request=request)  # durable, in this reply's transaction
        world.log("job.arrived", now, job=job.id, name=job.name, min_nodes=spec["min_nodes"], max_nodes=spec["max_nodes"])
        self.dirty = True
        return {"job_id": job.id}

    def capacity(self) -> int:
        """The most nodes a job could ever get: the machine (if the batch system says) within the configured cap."""
        machine = self.gateway.call("capacity", self.scheduler.capacity)
        cap = self.config.controller.max_job_nodes
        return min(cap, machine) if isinstance(machine, int) and machine > 0 else cap

    def _on_job_cancel(self, message: JobCancel, now: float) -> dict[str, Any]:
        self._end_job(self._known_job(message.job_id), now, "cancelled")
        return {}

    def _on_job_report(self, message: JobReport, now: float) -> dict[str, Any]:
        job = self._known_job(message.job_id)
        if job.status in TERMINAL:
            return {"progress": job.progress}
        progress = self.world.add_progress(job, message.samples)
        if message.commit:  # the reporting rank committed right after this work
            self._commit(job, now)
        changed = self._changed.get(job.id)
        if changed is not None and message.first and job.status == "running":
            # Ranks training again after a start or a resize: what the change cost, measured (JPA learns it).
            when, kind = self._changed.pop(job.id)
            cost = max(0.0, now - float(message.seconds) - when)
            self.profiler.observe_cost(job.id, kind, cost)
            self.world.log("job.cost", now, job=job.id, change=kind, seconds=round(cost, 3))
        total = job.spec.get("total_samples")
        if total and progress > total and not job.overran:
            self.world.mark_overran(job)
            self.world.log("job.overran", now, job=job.id, progress=progress, total_samples=total)
            log.info("job %s (%s) has reported %.4g samples, past the %.4g it declared: it keeps its nodes until it returns",
                        job.id, job.name, progress, total)  # fmt: skip
        meter = self._meters.get(job.id)
        if job.status == "running" and job.id in self._changed and self.runtime.resize_restarts_ranks(job.id):
            meter = None  # its old ranks, still at the old size until the new round's first report: not this size's rate
        if job.status == "running" and message.host in job.nodes and meter is not None and meter.nodes == len(job.nodes):
            rank = (message.host, message.pid)
            measured = meter.add(message.samples, message.seconds, now, first=message.first, rank=rank)
            if measured is not None and not (job.spec.get("curve") or job.spec.get("curves")):
                rate, seconds = measured
                node_type = self.types.of_nodes(self.world, job.nodes)
                new_scale = meter.nodes not in self.profiler.scales(job.id, node_type)
                self.profiler.observe(job.id, meter.nodes, rate, weight=seconds, node_type=node_type)
                if new_scale:
                    self.world.log("job.estimate", now, job=job.id, nodes=meter.nodes, samples_per_s=round(rate, 3), **({"node_type": node_type} if node_type else {}))
                    self.dirty = True  # a scale never seen before: the estimate changed
        return {"progress": progress}

    def _on_job_commit(self, message: JobCommit, now: float) -> dict[str, Any]:
        """Rank 0 saved the job's state durably: what was counted so far survives any stop."""
        job = self._known_job(message.job_id)
        if job.status in TERMINAL:
            return {"committed": job.committed}
        return {"committed": self._commit(job, now)}

    def _on_job_describe(self, message: JobDescribe, now: float) -> dict[str, Any]:
        """A rank computed the job's model descriptor (parameters, FLOPs per sample, layer mix, batch size): the
        similarity policy predicts its curve on the types it has not run on from it. The first one stands."""
        job = self._known_job(message.job_id)
        if job.status in TERMINAL or job.spec.get("model"):
            return {"kept": False}
        model = self.types.check_descriptor(message.model)
        self.world.set_spec(job, {**job.spec, "model": model})
        self.world.log("job.described", now, job=job.id, model=model)
        self.dirty = True
        return {"kept": True}

    def _commit(self, job: Job, now: float) -> float:
        last = self._committed_at.get(job.id)
        if last is not None and job.status == "running":
            self.profiler.observe_cost(job.id, "commit", now - last)
        self._committed_at[job.id] = now
        committed = self.world.commit(job)
        self.liveness.leave_at_commit(job, now)
        return committed

    def _on_job_result(self, message: JobResult, now: float) -> dict[str, Any]:
        job = self._known_job(message.job_id)
        self._end_job(job, now, "finished", result=message.value)
        return {}

    def _on_job_failed(self, message: JobFailed, now: float) -> dict[str, Any]:
        job = self._known_job(message.job_id)
        error = message.error
        self._end_job(job, now, "failed", error=error, result=message.value, why=(error.strip().splitlines() or [""])[-1][:200])
        return {}

    def _on_pilot_register(self, message: PilotRegister, now: float) -> dict[str, Any]:
        world = self.world
        pilot = world.pilot_of(message.pilot)
        if pilot is None:
            if message.pilot in world.ended_pilots:
                return {"stop": True}
            pilot = world.add_pilot(message.pilot, message.scheduler_id, len(message.nodes), now, self.incarnation)
        taken = [n for n in message.nodes if n in world.nodes and world.nodes[n].state != "gone" and world.nodes[n].pilot != pilot.id]
        self.remove_nodes(taken, now, "taken over by another pilot", "gone")  # a pilot that ended without telling us
        world.set_pilot(pilot, state="running", scheduler_id=message.scheduler_id or pilot.scheduler_id, pid=message.pid,
                        nodes=[n for n in pilot.nodes if n in message.nodes])  # fmt: skip
        for name in message.nodes:
            if name not in pilot.nodes or world.nodes[name].state != "ready":
                world.node_joins(name, pilot, now)
                world.log("node.joined", now, pilot=pilot.id, node=name)
        pilot.registered_at = now
        self.heard.hear(pilot.id, now)
        self.pilots.arrived(pilot, now)
        self.dirty = True
        return {}

    def _on_pilot_heartbeat(self, message: PilotHeartbeat, now: float) -> dict[str, Any] | Park:
        """A pilot is alive; it reports the processes that ended on its nodes and waits for commands (a long poll)."""
        pilot = self.world.pilot_of(message.pilot)
        if pilot is None:
            ended = message.pilot in self.world.ended_pilots
            return {"register": not ended, "stop": ended, "incarnation": self.incarnation}
        if pilot.state == "queued":
            return {"register": True, "stop": False, "incarnation": self.incarnation}
        self.heard.hear(pilot.id, now)
        if message.exits is not None:
            self.launcher.reported(message.exits)
        wait = message.wait_s
        if self.wake is not None and isinstance(wait, (int, float)) and wait > 0 and not self._has_news(pilot.id):
            return Park(pilot.id, min(float(wait), self.config.pilots.heartbeat_s), lambda: self._heartbeat_reply(pilot.id))
        return self._heartbeat_reply(pilot.id)

    def _heartbeat_reply(self, pilot_id: str) -> dict[str, Any]:
        """What a pilot's agent is told: nodes to give back, commands for its nodes, whether to stop."""
        live = pilot_id in self.world.pilots
        return {"release": self.pilots.released(pilot_id), "commands": self.launcher.commands_for(pilot_id), "stop": not live,
                "register": False, "incarnation": self.incarnation}  # fmt: skip

    def _has_news(self, pilot_id: str) -> bool:
        return self.launcher.pending(pilot_id) or self.pilots.has_release(pilot_id) or pilot_id not in self.world.pilots

    def _wake_later(self, pilot_id: str) -> None:
        """A pilot has news: answer its parked heartbeat once what caused the news is committed."""
        self._to_wake.add(pilot_id)

    def _flush_wakes(self) -> None:
        if self._to_wake and self.wake is not None:
            for pilot_id in self._to_wake:
                self.wake(pilot_id)
        self._to_wake.clear()

    def _on_runtime_message(self, kind: str, message: Message, now: float) -> dict[str, Any]:
        """A message of a runtime's own (``Runtime.handles``: the torch agents' ``rdzv.*``), answered by that runtime."""
        runtime = self.runtime.answering(message.TYPE)
        if runtime is None:
            raise ProtocolError(f"{message.TYPE}: no {kind} job runs in this campaign")
        return runtime.handle(message, now)

    def _on_pilot_leaving(self, message: PilotLeaving, now: float) -> dict[str, Any]:
        pilot = self.world.pilot_of(message.pilot)
        if pilot is not None and pilot.state != "leaving":
            self.world.set_pilot(pilot, state="leaving")
        self.remove_nodes(message.nodes, now, "leaving", "leaving", deadline=message.deadline, taken=True)
        return {}

    # ------------------------------------------------------------ every way a node goes

    def remove_nodes(self, names: Iterable[str], now: float, why: str, to: str, deadline: float | None = None, event: str | None = None,
                     taken: bool = False) -> None:  # fmt: skip
        """Take nodes away from their jobs and, unless ``to`` is ``ready``, out of the pool.

        ``to``: ``leaving`` (SIGTERM: gone within the grace period), ``gone``
        (ended, lost, released, taken back) or ``ready`` (the node stays ours, its
        job lost it: a rank crashed). The jobs shrink at the next decision, which
        follows at once; nothing else is moved here. ``taken``: the batch system
        ended the hold (preemption, walltime), so how long the node stayed is
        what this machine gives, and the horizon learns from it (not from our
        own releases).
        """
        world = self.world
        shrunk: dict[str, list[str]] = {}
        for name in names:
            node = world.nodes.get(name)
            if node is None or node.state == "gone" or (to == "leaving" and node.state == "leaving"):
                continue
            if node.job is not None:
                shrunk.setdefault(node.job, []).append(name)
            held = None
            if taken and node.state == "ready":
                held = round(now - node.since, 3)
                self.holds.observe(held)
            if to == "ready":
                world.assign(node, None)
            else:
                world.set_node_state(node, to, now, deadline)
            world.log(event or f"node.{to if to != 'ready' else 'dropped'}", now, pilot=node.pilot, node=name, why=why,
                      **({"held_s": held} if held is not None else {}))  # fmt: skip
        for job_id, gone in shrunk.items():
            job = world.jobs.get(job_id)
            if job is None or job.status in TERMINAL:
                continue
            lost = set(gone) & set(job.nodes)
            if lost:
                world.update_job(job, nodes=[n for n in job.nodes if n not in lost])
                job.lost |= lost
                self.urgent = True
        self.dirty = True

    # ------------------------------------------------------------ polled events

    def step(self, now: float | None = None, more: bool = False) -> None:
        """One pass over what is polled rather than messaged, then a decision if anything changed.

        ``more``: requests are still waiting (the pass read a full batch): the
        decision waits for them, within :data:`FLOOD_DEFER_S`. A bug met here is
        logged and the loop goes on (the journal holds what memory holds); only
        a journal that cannot be written stops the controller.
        """
        now = self.clock() if now is None else now
        self.burst.more = more
        try:
            self._step(now)
        except (JournalError, SchedulerConfigError):
            raise
        except Exception as exc:
            if VALIDATE and isinstance(exc, (IllegalMove, AssertionError)):
                raise  # under test, a broken life cycle fails the test where it happened
            self._errors += 1
            if self._errors <= 10 or self._errors % 1000 == 0:
                log.error("error in the controller's step (%d so far): %s", self._errors, traceback.format_exc())
            self.dirty = False  # do not retry the same failing decision every tick; the next event will
        self._last_step = now
        self.burst.handled = 0
        if VALIDATE:
            self.world.validate()

    def _step(self, now: float) -> None:
        self._account(now)
        try:
            self._step_in_transaction(now)
        finally:
            self._flush_wakes()
        if self.pilots.fatal is not None:  # journaled above; the process stops with its one line
            raise self.pilots.fatal

    def _step_in_transaction(self, now: float) -> None:
        with self.journal.transaction():
            before, self._polled_at = self._polled_at, now
            self._backlog.extend((event, before) for event in self.gateway.call("poll", self.scheduler.poll, now) or [])
            put_off = self.decision.due_at_once  # a decision the last pass put off is taken in this one, whatever this one polls
            for _ in range(min(MAX_BATCH, len(self._backlog))):  # a wave of thousands (pilots at their walltime): in passes
                event, polled_before = self._backlog.popleft()
                self.liveness.on_pilot_event(event, now, polled_before)
                self.burst.handled += not put_off  # counted as requests are: a wave of events and a large decision, not in one pass
            for exit_ in self.runtime.poll():
                self._on_rank_exit(exit_, now)
            self.liveness.drain_walltimes(now)
            self.liveness.check_heartbeats(now, self._last_step)
            idle, moved = self._idle(), False
            if self.types.typed:
                moved = self._idle_types is not None and self._idle_types != self.types.last_idle
            decision = self.decision
            decision.due_at_once = False
            if self.draining:
                decision.drop()  # stopping: no job starts or grows, no pilot is asked for
                self.pilots.forget_owed()
            elif decision.phase == Phase.APPLY:
                self._apply_decided(now, idle)
            elif decision.phase == Phase.OFFER:
                offer = decision.offer
                decision.advance(Phase.SIZE, sizing=decision.sizing)
                if not self.dirty:  # else what changed is decided anew (the pass after the sizing's, if one is owed)
                    self._offer_free(offer, now)
            elif decision.phase == Phase.SIZE:
                # The last decision's answer still holds unless something changed since (then it is asked anew, and
                # the decision that change needs is owed to the pass after).
                answer = decision.sizing
                decision.advance(Phase.READY)
                decision.due_at_once = self.dirty
                self.pilots.adjust(now, idle if idle is not None else self._last_idle or 0, None if self.dirty else answer, idle_types=self._idle_types_now())
            elif self.dirty and (self.urgent or not self._settling(now)):
                self._decide_when_due(now, idle)
            elif decision.question_owed or (idle is not None and idle != self._last_idle) or moved or self.pilots.release_due(now) or self.pilots.retry_due(now) or self.pilots.limit_due(now):
                if decision.question_owed and self._deferring(now):
                    pass  # owed, and a wave of requests or batch-system events is still read: asked after it, as a decision
                elif not decision.question_owed and self._puts_off_the_decision():  # the pilots' question weighs the machine too: put off once, as a decision
                    decision.question_owed = True
                else:  # the main workload moved, or a kept node's time is up
                    decision.question_owed, self.burst.since = False, None
                    self.pilots.adjust(now, idle if idle is not None else self._last_idle or 0, idle_types=self._idle_types_now())
            elif self.pilots.owed:
                self.pilots.settle_owed(now)  # a wave of idle nodes asked for, or of unused nodes given back, in passes
            if self._idle_types is not None:
                self.types.last_idle = self._idle_types
            if idle is not None:
                self._last_idle = idle
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                self._journal_accounts()
                self.world.prune(KEEP_EVENTS, KEEP_ENDED_PILOTS)
                self._forget_dead_processes()
                used = self.views.forget_kinds()
                if used is not None:  # what was remembered of kinds no waiting job has any more goes with them
                    self.weighing.forget_kinds(used)
                # Python's full collections scan every object alive, and at whole-machine scale the controller's memory
                # (nodes, jobs, curves, the modules it imported) made one cost 20-40 ms in the middle of a decision while
                # finding nothing to free: what it holds has no cycles to break. What has lived this long is frozen
                # (moved out of the collector's sight, freed by reference counting as usual); the collector scans
                # what is newer. Given back by shutdown().
                gc.freeze()

    @property
    def busy(self) -> bool:
        """Step again without waiting: batch-system events wait to be handled (a wave larger than one pass), a large
        decision's pilot sizing waits for the next pass, that pass found a decision to take, or pilots the last sizing
        asked for wait to be submitted, or nodes it gave back to be released (more than one pass submits or releases)."""
        return (bool(self._backlog) or self.decision.owes_a_pass or self.decision.due_at_once or self.decision.question_owed
                or (self.pilots.owed and not self.draining))  # fmt: skip

    def _on_rank_exit(self, exit_: RankExit, now: float) -> None:
        self._leaving_ranks.discard((exit_.job_id, exit_.host))
        job = self.world.jobs.get(exit_.job_id)
        if job is None or job.status in TERMINAL or exit_.requested:
            return
        if not exit_.host:
            # The job's launcher ended without the job reporting a result or a failure.
            crashes = job.crashes + 1
            self.world.log("job.crashed", now, job=job.id, returncode=exit_.returncode, crashes=crashes)
            for node in self.world.nodes_of(job.nodes):
                self.world.assign(node, None)
            if crashes >= JOB_RETRIES:
                error = f"the job's launcher exited {exit_.returncode} {crashes} times; last output:\n{self._log_tail(job.id)}"
                self.world.update_job(job, crashes=crashes)
                self._end_job(job, now, "failed", error=error, why=f"launcher exited {exit_.returncode}")
            else:
                self.world.update_job(job, status="pending", nodes=[], crashes=crashes)
                self.world.roll_back(job)
            self.dirty = True
        elif exit_.crashed and exit_.host in job.nodes:
            # A rank that ended on its own on a node its pilot still holds is the app's own doing (sys.exit from a
            # child, a segfault, the OOM killer), not a lost node: relaunched, but not for ever — JOB_RETRIES such ends
            # in a row with nothing committed in between end the job, saying what the rank did.
            crashes = job.crashes + 1 if job.crash_commit == job.committed else 1
            job.crash_commit = job.committed
            self.world.update_job(job, crashes=crashes)
            self.world.log("rank.lost", now, job=job.id, node=exit_.host, returncode=exit_.returncode, crashes=crashes)
            if crashes >= JOB_RETRIES:
                log_path = self.run_dir / "logs" / f"{job.id}.{exit_.host}.log"
                try:
                    tail = log_path.read_text(errors="replace")[-3000:]
                except OSError:
                    tail = ""
                what = exit_words(exit_.returncode)
                error = (f"{tail}\n" if tail else "") + (
                    f"a rank of the app {what} on {exit_.host}, {crashes} times in a row with nothing committed in between: the app's own end, "
                    f"not a lost node (its output: {log_path})")  # fmt: skip
                self._end_job(job, now, "failed", error=error, why=f"a rank {what}")
                return
            self.remove_nodes([exit_.host], now, f"rank crashed ({exit_.returncode})", "ready")

    def _decide_again(self) -> None:
        """Something the allocation rests on changed: the next pass decides again."""
        self.dirty = True

    def end_pilot(self, pilot: Pilot, state: str, now: float) -> None:
        """A pilot is over (``ended`` or ``lost``); its nodes must have been removed. Its agent ends what ran there."""
        self.world.end_pilot(pilot, state, now)
        self.launcher.forget(pilot.id)
        self.heard.forget(pilot.id)
        self._wake_later(pilot.id)  # a heartbeat it has waiting is told to stop

    def _decide_when_due(self, now: float, idle: int | None) -> None:
        """Decide now, unless a burst of requests is still being read (:meth:`_deferring`) or this pass read many
        requests at scale (:meth:`_puts_off_the_decision`: the next pass, which reads none, decides)."""
        if self._deferring(now):
            return
        if self._puts_off_the_decision():
            self.decision.due_at_once = self.urgent = True
            return
        self.decide(now, idle, late=True)

    def _puts_off_the_decision(self) -> bool:
        """True when a large decision due now goes to the next pass: this one handled many requests or batch-system
        events (see :data:`DECIDE_APART_MESSAGES`). The next pass reads no request (:attr:`solves_next`) and does not
        count what it polls, so it is put off once."""
        return self.burst.handled >= DECIDE_APART_MESSAGES and len(self.world.open) >= SIZE_APART_JOBS

    @property
    def solves_next(self) -> bool:
        """Whether the loop's next pass solves the whole machine at scale — a decision put off or owed at once, or the
        pilots' sizing after one — and so reads no request: a pass is either the replies to a batch of requests or one
        solve, never both (the requests wait one pass, as they wait for any pass). Not while a burst of batch-system
        events is read in passes, nor while stopping."""
        decision = self.decision
        if len(self.world.open) < SIZE_APART_JOBS or self.draining or decision.phase == Phase.OFFER or self._backlog:
            return False
        return decision.phase in (Phase.SIZE, Phase.APPLY) or decision.question_owed or (decision.due_at_once and self.dirty and self.urgent)

    def _deferring(self, now: float) -> bool:
        """True while a burst of requests or batch-system events is still being read (see :data:`FLOOD_DEFER_S`)."""
        return self.burst.deferring(now, bool(self._backlog), FLOOD_DEFER_S)

    def _settling(self, now: float) -> bool:
        """True while pilots asked for moments ago are still arriving (bounded in a row by SETTLE_MAX_S)."""
        if not self.pilots.arriving(now, SETTLE_S):
            self._settle_since = None
            return False
        if self._settle_since is None:
            self._settle_since = now
        return now - self._settle_since < SETTLE_MAX_S

    # ------------------------------------------------------------ the decision

    def decide(self, now: float, idle: int | None = None, late: bool = False) -> Allocation | None:
        """Ask the allocator, apply the difference (one runtime call per job that changed), then size
        the pilots from the same answer: release what no job will use, ask for what is missing (with
        :data:`SIZE_APART_JOBS` open jobs or more, in the loop's next pass).

        ``late`` (the loop's decisions): with :data:`SIZE_APART_JOBS` open jobs or more the answer is applied in
        the next pass, which reads no request (:meth:`_apply_decided`): solving the machine and changing hundreds
        of jobs are two passes, not one. If anything changed in between, the answer no longer holds; the decision
        is taken again and applied in the pass that takes it."""
        began = time.perf_counter()
        self.dirty = self.urgent = False
        self._settle_since = self.burst.since = None
        if idle is None:
            idle = self._last_idle or 0
        apart = len(self.world.open) >= SIZE_APART_JOBS
        decided = None
        if self.world.open or self.world.ready:
            t0 = time.perf_counter()
            solved = self.weighing.solve(len(self.world.ready) + idle + self.world.pending_nodes(), 0, apart=apart)
            solve_ms = (time.perf_counter() - t0) * 1000
            self.stats["solve_ms"].append(solve_ms)
            self.methods[solved.answer.method] += 1
            self.last_method = solved.answer.method
            if solved.again:  # more copies of a kind are weighed: by the decision of the next pass, at once
                self.dirty = self.urgent = self.decision.due_at_once = True  # due now: not held back while pilots arrive
                return None
            decided = Decided(solved, solve_ms, idle, apart)
            if late and apart and self.decision.phase != Phase.RETAKE:
                self.decision.advance(Phase.APPLY, decided=decided)
                self.stats["decide_ms"].append((time.perf_counter() - began) * 1000)
                return solved.answer
        answer = self._carry_out(decided, now, idle, apart)
        self.stats["decide_ms"].append((time.perf_counter() - began) * 1000)
        return answer

    def _carry_out(self, decided: Decided | None, now: float, idle: int, apart: bool) -> Allocation | None:
        """Apply a decision's answer and log it; then the pilots are sized on it (with ``apart``, in the next pass,
        after the nodes it leaves free are offered to the jobs it left out)."""
        answer = offer = None
        if decided is not None:
            active, problem, answer, left = decided.solved.active, decided.solved.problem, decided.solved.answer, decided.solved.left
            moved = self._apply(active, answer, now)
            self.world.log("allocation", now, solve_ms=round(decided.solve_ms, 3), method=answer.method, counts={j: n for j, n in answer.counts.items() if n},
                           moved=moved, pool=len(problem.pool.nodes), horizon_s=round(problem.t_fwd, 3))  # fmt: skip
            if apart and any(left) and sum(answer.counts.values()) < len(problem.pool.nodes):
                offer = (problem, answer, left)  # the nodes it leaves free: to the jobs it left out, in the next pass
        if apart and offer is not None:
            self.decision.advance(Phase.OFFER, offer=offer, sizing=answer)
        elif apart and answer is not None:
            self.decision.advance(Phase.SIZE, sizing=answer)
        else:
            self.decision.advance(Phase.READY)
            if not apart:
                self.pilots.adjust(now, idle, answer, idle_types=self._idle_types_now())
        return answer

    def _apply_decided(self, now: float, idle: int | None) -> None:
        """The pass after a large decision: its answer applied, unless something changed since it was taken (then it
        is taken again, in this pass, and applied at once)."""
        decided = self.decision.decided
        if self.dirty:
            self.decision.advance(Phase.RETAKE)
            self._decide_when_due(now, idle if idle is not None else decided.idle)
            return
        self._carry_out(decided, now, decided.idle, decided.apart)

    def _idle(self) -> int | None:
        """Idle nodes the batch system has for us now (on a typed machine, asked per type: ``_idle_types``)."""
        if not self.types.typed:
            return self.gateway.call("idle", self.scheduler.idle_nodes)
        self._idle_types = self.gateway.call("idle", self.scheduler.idle_by_type)
        return sum(self._idle_types.values()) if self._idle_types is not None else None

    def _idle_types_now(self) -> dict[str, int] | None:
        if not self.types.typed:
            return None
        return self._idle_types if self._idle_types is not None else (self.types.last_idle or {t: 0 for t in self.types.names})








    def _offer_free(self, offer: tuple[Problem, Allocation, list[list[Job]]], now: float) -> None:
        """The pass after a large decision: the nodes its answer left free, offered to the waiting jobs it left out
        (:meth:`.Weighing.offer_left_free`) and the jobs that take them started. Nothing changed since (else the decision is
        taken anew), so its problem still holds; the pilots are sized on both answers together, in the pass after."""
        problem, answer, left = offer
        t0 = time.perf_counter()
        left = [[j for j in queue if j.status == "pending" and not j.nodes] for queue in left]
        joined, offered = self.weighing.offer_left_free(problem, answer, left)
        if not offered:
            return
        solve_ms = (time.perf_counter() - t0) * 1000
        moved = self._apply(offered, joined, now)
        self.world.log("allocation", now, solve_ms=round(solve_ms, 3), method=joined.method, counts={j: n for j, n in joined.counts.items() if n},
                       moved=moved, pool=len(problem.pool.nodes), horizon_s=round(problem.t_fwd, 3), offered=len(offered))  # fmt: skip
        if self.decision.phase == Phase.SIZE and self.decision.sizing is not None:
            self.decision.sizing = joined





    def _apply(self, active: list[Job], answer: Allocation, now: float) -> dict[str, int]:
        """Make the allocation so: nodes leave their jobs first, then join, so a node moving from one job to
        another is never seen unused in between; then one start, resize or stop per job that changed."""
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
            for node in world.nodes_of(new):
                world.assign(node, job.id)
            running = job.status == "running"
            cause = f"{', '.join(sorted(lost))} {self._why_lost(lost)}" if lost else None
            if running and new and not old:
                # Every node it had is gone: nothing survives to grow from, so it restarts (from its last commit).
                self.runtime.stop(job.id)
                world.update_job(job, status="pending", nodes=[])
                world.log("job.stopped", now, job=job.id, nodes_before=sorted(lost), cause=cause, redone=world.roll_back(job))
                running = False
            if running and new and old and self.types.typed and self.types.of_nodes(world, new) != self.types.of_nodes(world, old):
                # Another kind of node: a stop (it resumes from its last commit) and a start there.
                running = self._stop_for_a_start(job, old, lost, now, "moved to another node type")
            if running and new and old and (lost or not set(old) <= set(new)) and self._forming(job) and not self.runtime.shrinks_while_forming(job.id):
                # Its ranks are still forming the group (Horovod's hvd.init): a start on the nodes it keeps, not a shrink.
                running = self._stop_for_a_start(job, old, lost, now, f"{cause or 'shrunk'} while its ranks were forming the group")
            try:
                if running and new:
                    if set(new) == set(old) and not lost:
                        continue
                    self.runtime.resize(job.id, new, lost=sorted(lost))
                    world.update_job(job, nodes=new, rescales=job.rescales + 1)
                    self._changed[job.id] = (now, "up" if len(new) > len(old) else "down")
                    if not self.runtime.resize_keeps_progress(grow_only=not lost and set(old) <= set(new), job_id=job.id):
                        world.roll_back(job)
                    world.log("job.resized", now, job=job.id, before=len(old) + len(lost), after=len(new), nodes=new, **({"cause": cause} if cause else {}))
                elif running:
                    self.runtime.stop(job.id)
                    world.update_job(job, status="pending", nodes=[])
                    why = {"cause": cause} if not old and lost else {"cause": "allocation", "objective": round(answer.objective, 3)}
                    world.log("job.stopped", now, job=job.id, nodes_before=sorted(set(old) | lost), redone=world.roll_back(job), **why)
                elif new:
                    self.runtime.start(job.id, self.types.start_spec(world, job, new), new)
                    self._changed[job.id] = (now, "start")
                    self._committed_at[job.id] = now  # a stop loses what it does from here until its first commit
                    world.update_job(job, status="running", nodes=new, started=job.started or now, launches=job.launches + 1)
                    world.log("job.started", now, job=job.id, nodes=new, progress=job.progress, **self.types.placed(world, job, new, now))
                else:
                    continue
            except Exception as exc:  # the runtime could not act: this job fails, the others go on
                log.exception("runtime could not apply the allocation to %s", job.id)
                self._end_job(job, now, "failed", error=f"the runtime could not run the job: {exc!r}", why=repr(exc)[:200])
                continue
            self._meters[job.id] = Meter(len(new), now)
            moved[job.id] = len(new)
            if job.id in self._sized_at:
                self.lifetimes.observe(now - self._sized_at[job.id])
            if new:
                self._sized_at[job.id] = now
            else:
                self._sized_at.pop(job.id, None)
        return moved

    def _stop_for_a_start(self, job: Job, old: list[str], lost: set[str], now: float, cause: str) -> bool:
        """Stop a running job so that :meth:`_apply` starts it on its new nodes (from its last commit); False: not running."""
        self.runtime.stop(job.id)
        self.world.update_job(job, status="pending", nodes=[])
        self.world.log("job.stopped", now, job=job.id, nodes_before=sorted(set(old) | lost), redone=self.world.roll_back(job), cause=cause)
        return False

    def _forming(self, job: Job) -> bool:
        """Whether a job's ranks have neither reported training nor committed since it started: still starting up and
        forming their group (a survivor of a shrink is not: its process reports on, never "first" again)."""
        changed = self._changed.get(job.id)
        return changed is not None and changed[1] == "start" and self._committed_at.get(job.id, math.inf) <= changed[0]

    def _keeps_its_nodes(self, job: Job, answer: Allocation) -> bool:
        """Whether ``answer`` leaves a running job exactly as it is: the same count on the same type, nothing lost."""
        if job.status != "running" or job.lost or not job.nodes or answer.counts.get(job.id, 0) != len(job.nodes):
            return False
        return not self.types.typed or answer.node_type.get(job.id) == self.types.of_nodes(self.world, job.nodes)

    def _why_lost(self, lost: set[str]) -> str:
        states = {self.world.nodes[n].state for n in lost if n in self.world.nodes}
        return "leaving" if states == {"leaving"} else "gone" if "ready" not in states else "lost"

    # ------------------------------------------------------------ helpers

    def _end_job(self, job: Job, now: float, status: str, result: Any = None, error: str | None = None, why: str | None = None) -> None:
        """A job is over (the first outcome wins): stop its ranks, free its nodes, record why."""
        if job.status in TERMINAL:
            return
        self.runtime.stop(job.id)
        for node in self.world.nodes_of(job.nodes):
            self.world.assign(node, None)
        fields: dict[str, Any] = {"status": status, "ended": now, "nodes": []}
        if result is not None:
            fields["result"] = result
        if error is not None:
            fields["error"] = error
        self.world.update_job(job, **fields)
        self.world.log(f"job.{status}", now, job=job.id, **({"error": why} if why else {}), progress=job.progress)
        self.types.learned(job, status)  # a measured model joins the similarity library
        self.profiler.forget(job.id)
        self._meters.pop(job.id, None)
        self._changed.pop(job.id, None)
        self._committed_at.pop(job.id, None)
        self._sized_at.pop(job.id, None)
        self.views.forget(job.id)
        job.lost = set()
        self.dirty = True

    def _known_job(self, job_id: str) -> Job:
        job = self.world.jobs.get(job_id)
        if job is None:
            raise ProtocolError(f"no job {job_id!r}")
        return job

    def _log_tail(self, job_id: str, chars: int = 3000) -> str:
        path = self.run_dir / "logs" / f"{job_id}.horovodrun.log"
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _forget_dead_processes(self) -> None:
        for p in self.journal.processes():
            if not procs.alive(p["pid"], p["start_ticks"]):
                self.journal.drop_process(p["pid"])

    def begin_stop(self) -> float:
        """Stopping: every job's ranks are told to leave — SIGTERM, and the pilots' grace to commit in — while
        their agents are still heard, so that what they commit is recorded and nothing waits on an agent nobody
        answers. Nothing is decided from now on. Returns by when (``time.monotonic``) to stop waiting for them."""
        self.draining = True
        with self.journal.transaction():
            for job in list(self.world.open.values()):
                hosts = self.runtime.hosts(job.id)
                if hosts:
                    self._leaving_ranks.update((job.id, host) for host in hosts)
                    self.runtime.stop(job.id)
            self.world.log("controller.stopping", self.clock(), ranks=len(self._leaving_ranks))
        self._flush_wakes()
        return time.monotonic() + self.config.pilots.grace_s + STOP_MARGIN_S

    def ranks_gone(self) -> bool:
        """Whether every rank told to leave by :meth:`begin_stop` has gone (its agent said so)."""
        return not self._leaving_ranks

    def shutdown(self) -> None:
        """Stop every job's ranks, cancel every pilot; running jobs go back to pending (a re-run resumes them)."""
        log.info("shutting down")
        now = self.clock()
        self.runtime.close()
        self.gateway.call("close", self.scheduler.close)
        world = self.world
        with self.journal.transaction():
            for job in list(world.open.values()):
                if job.status == "running":
                    world.update_job(job, status="pending", nodes=[])
                    world.roll_back(job)
            for pilot in list(world.pilots.values()):
                self.remove_nodes(list(pilot.nodes), now, "controller stopped", "gone")
                self.end_pilot(pilot, "ended", now)
            self.journal.clear_processes()
            self._account(now)
            self._journal_accounts()
            world.log("controller.stopped", now, incarnation=self.incarnation, ranks_not_gone=len(self._leaving_ranks))
        self.journal.close()
        gc.unfreeze()  # what this controller froze is the collector's again (a replay or a test goes on in this process)


__all__ = ["Controller", "JOB_RETRIES", "MAX_BATCH", "Pilot", "ProblemError"]

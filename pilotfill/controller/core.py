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
decision, ending a job, stopping — and the rest is in collaborators that own
their caches: what the pilots' agents ask (:mod:`.pilot_handlers`) and what
clients and ranks ask about jobs (:mod:`.job_handlers`), what a job's reports say
about its training (:mod:`.job_progress`), making an answer so (:mod:`.applier`),
what a decision and the pilots' question weigh (:mod:`.planner`), the
allocator's views of the jobs (:mod:`.views`), the waiting queue
(:mod:`.waiting`), the pilots' liveness — the batch system's events,
heartbeats, walltimes (:mod:`.liveness`) — taking over from a predecessor
(:mod:`.recovery`), the batch system behind back-off (:mod:`.gateway`), the
machine's node-seconds (:mod:`.accounts`), the pilots themselves
(:mod:`pilotfill.pilots.manager`).

The controller runs on a clock it is given: the process in
:mod:`pilotfill.controller.process` gives it the wall clock and a ZeroMQ
server; ``pilotfill replay`` gives it a simulated clock, a trace-driven batch
system and a simulated runtime — the same code, measured.
"""

from __future__ import annotations

import functools
import gc
import logging
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
from ..allocator import typed as typed_solver
from ..config import Config
from ..elastic.base import RankExit, Runtime
from ..elastic.ending import exit_words
from ..elastic.registry import NAMES as RUNTIME_NAMES
from ..elastic.registry import runtime_class
from ..elastic.runtimes import JobRuntimes
from ..lifecycle import TERMINAL, IllegalMove, JobStatus, NodeState, Removal
from ..pilots.launcher import AgentLauncher
from ..pilots.manager import PilotManager
from ..reasons import NodeWhy
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
    Reply,
    StateSnapshot,
    StateSnapshotReply,
    parse,
)
from ..schedulers.base import BatchScheduler, PilotEvent, SchedulerConfigError
from ..security import create_secret, private_dir
from ..journal import JournalError, Journal
from ..transport import Park
from .accounts import NodeSeconds
from .applier import Applier
from .gateway import SchedulerGateway
from .pool_horizon import PoolHorizon
from .job_handlers import JobHandlers
from .liveness import LastHeard, Liveness
from .notices import Notices
from .pilot_handlers import PilotHandlers, Wakes
from .recovery import Adoption, TakeOver
from .schedule import SETTLE_S, Action, DecisionSchedule, Do, Observed
from .job_progress import JobProgress
from .node_types import NodeTypes
from .views import AllocatorViews
from .waiting import WaitingJobs
from .walltime import Walltimes, lead_s
from .planner import Solved, Planner
from .world import Job, Pilot, World

log = logging.getLogger("pilotfill.controller")

JOB_RETRIES = 3
"""A job whose launcher dies without a result or a reported failure is retried this often, then failed."""
STOP_MARGIN_S = 10.0
"""Stopping waits for ranks this long past the pilots' grace: for an agent's heartbeat to say they are gone."""
MAX_BATCH = 256
"""Requests one pass of the loop handles (one group commit) before the controller steps: a flood of messages never
starves heartbeat checks or the allocation, and no reply waits behind more than this many others."""
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
    apart: bool  # taken at scale (schedule.SIZE_APART_JOBS): offers and the pilots' sizing in the passes after


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
        self.journal = Journal(self.run_dir)
        with self.journal.transaction():
            self.incarnation = self.journal.next_incarnation()
        self.world = World(self.journal)
        self.world.load()
        self.started = clock()
        compiled.warm()  # the allocator's compiled DP is loaded before the loop, not in its first decision
        self.profiler = Profiler()
        # how long an allocation made now lasts
        self.pool_horizon = PoolHorizon(self.world, self.journal, config.controller.t_fwd)
        self.holds, self.lifetimes = self.pool_horizon.holds, self.pool_horizon.lifetimes
        self.schedule = DecisionSchedule()  # when to decide (controller/schedule.py)
        self.stopping = False
        self.draining = False  # stopping: ranks are leaving at their commits; nothing is decided any more
        self._leaving_ranks: set[tuple[str, str]] = set()  # (job, host) told to leave while stopping, not yet gone
        self.heard = LastHeard(config.pilots.heartbeat_deadline_s,
                               stall_s=max(config.pilots.heartbeat_s, 2 * config.controller.tick_s, 1.0))
        self._last_step: float | None = None
        self._polled_at = 0.0  # the last scheduler poll
        # what polls said, not yet handled (with when the poll before was)
        self._backlog: deque[tuple[PilotEvent, float]] = deque()
        self._pruned_at = self.started
        # held by pilots, used by jobs (controller/accounts.py)
        self.node_seconds = NodeSeconds(self.world, self.started)
        self.stats: dict[str, list[float]] = {"solve_ms": [], "decide_ms": []}
        self.methods: Counter[str] = Counter()
        self._errors = 0
        self.last_method: str | None = None
        # pilots whose parked heartbeat is answered after the commit (controller/pilot_handlers.py)
        self.wakes = Wakes()
        self.launcher = AgentLauncher(self.world, wake=self.wakes.later)
        self._batching = False  # inside handle_batch: wakes wait for the batch's commit
        self.scheduler = scheduler or self._make_scheduler()
        # why the campaign waits, for the progress line and `pilotfill top` (controller/notices.py)
        self.notices = Notices(self.journal)
        # every call into the batch system, backed off on failure
        self.gateway = SchedulerGateway(self.scheduler, self.world, self.clock, self.notices)
        self.runtime = runtime or self._make_runtime()
        # a machine with several kinds of node (controller/node_types.py)
        self.types = NodeTypes(config, self.run_dir, self.profiler)
        if self.types.typed:
            typed_solver.warm()  # its MILP fallback's imports before the loop, not in the first decision that needs it
        # the allocator's view of each job, made anew when it changed
        self.views = AllocatorViews(self.world, self.profiler, self.types,
                                    priors=config.controller.admission == "worth",
                                    ranks_per_node=config.runtime.ranks_per_node)
        views = self.views
        # kept until a job changes
        self.waiting = WaitingJobs(views.waiting_kind, views.waiting_worth, views.waiting_version,
                                   views.waiting_traits)
        self._idle_types: dict[str, int] | None = None
        # pilots' ends (controller/walltime.py)
        self.walltimes = Walltimes(lead_s(config.pilots.grace_s, config.controller.tick_s))
        self.planner = Planner(self.world, config.controller, self.profiler, self.types, views, self.waiting,
                               self.walltimes, self.pool_horizon.at, clock,
                               fail=lambda job, error, why: self.end_job(job, self.clock(), "failed", error=error,
                                                                         why=why))
        # the batch system's events, silent pilots, walltimes (controller/liveness.py)
        self.liveness = Liveness(self.world, self.heard, self.walltimes, self.gateway, self.scheduler, self.profiler,
                                 ends=self, changed=self._decide_again)
        # what reports say: progress, commits, measured rates (controller/job_progress.py)
        self.progress = JobProgress(self.world, self.profiler, self.types, self.runtime,
                                    at_commit=self.liveness.leave_at_commit, changed=self._decide_again,
                                    notices=self.notices, silent_s=config.runtime.silent_s)
        # makes the answers so (controller/applier.py)
        self.applier = Applier(self.world, self.runtime, self.types, self.progress, self.lifetimes,
                               fail=lambda job, now, error, why: self.end_job(job, now, "failed", error=error, why=why))
        self.pilots = PilotManager(self.world, config.pilots, self.gateway, question=self.planner, ends=self,
                                   incarnation=self.incarnation, wake=self.wakes.later, notices=self.notices)
        # the ranks taken over from a predecessor, until their agents confirm them (controller/recovery.py)
        self.adoption = Adoption()
        # what the pilots' agents ask
        self.pilot_handlers = PilotHandlers(self.world, self.heard, self.launcher, self.pilots, self.wakes, ends=self,
                                            incarnation=self.incarnation, heartbeat_s=config.pilots.heartbeat_s,
                                            changed=self._decide_again, adoption=self.adoption)
        # what clients and ranks ask about jobs (controller/job_handlers.py)
        self.job_handlers = JobHandlers(self.world, self.journal, self.progress, self.types, ends=self,
                                        capacity=self.capacity, checkpoint_dir=self.checkpoint_dir,
                                        changed=self._decide_again)
        # one per message type (protocol.BY_TYPE): each answers its type's reply class (``REPLY``)
        self.handlers: dict[str, Callable[[Message, float], Reply | Park]] = {
            PilotRegister.TYPE: self.pilot_handlers.register,
            PilotHeartbeat.TYPE: self.pilot_handlers.heartbeat,
            PilotLeaving.TYPE: self.pilot_handlers.leaving,
            JobSubmit.TYPE: self.job_handlers.submit,
            JobReport.TYPE: self.job_handlers.report,
            JobDescribe.TYPE: self.job_handlers.describe,
            JobCommit.TYPE: self.job_handlers.commit,
            JobResult.TYPE: self.job_handlers.result,
            JobFailed.TYPE: self.job_handlers.failed,
            JobCancel.TYPE: self.job_handlers.cancel,
            JobGet.TYPE: self.job_handlers.get,
            JobStatusQuery.TYPE: self.job_handlers.status,
            StateSnapshot.TYPE: self._on_state_snapshot,
        }
        for kind in RUNTIME_NAMES:  # a runtime's own messages go to it (the torch agents' rendezvous)
            for type_ in runtime_class(kind).handles:
                self.handlers[type_] = functools.partial(self._on_runtime_message, kind)
        # Take over from a predecessor (controller/recovery.py): what still runs is adopted, the other running jobs
        # resume from their commits.
        TakeOver(self.world, self.journal, self.gateway, self.scheduler, self.runtime, self.heard, self, self.adoption,
                 spec_of=lambda job, nodes: self.types.start_spec(self.world, job, nodes),
                 measure=self.progress.measure_from, incarnation=self.incarnation, now=self.clock(),
                 new_campaign=new_campaign, keep_ended_pilots=KEEP_ENDED_PILOTS).run()
        self.schedule.calm()
        for pilot in self.world.pilots.values():
            self.walltimes.track(pilot.id, pilot.walltime_end)
        gc.freeze()  # see _step_in_transaction: what is alive now is never scanned by the collector again

    # ------------------------------------------------------------ construction

    @property
    def wake(self) -> Callable[[str], object] | None:
        """Answers a pilot's parked heartbeat now (set by the process that serves messages; None: nothing parks)."""
        return self.wakes.wake

    @wake.setter
    def wake(self, wake: Callable[[str], object] | None) -> None:
        self.wakes.wake = wake

    def horizon(self, now: float, extra: int = 0) -> float:
        """Seconds an allocation made now is expected to last (:meth:`.PoolHorizon.at`)."""
        return self.pool_horizon.at(now, extra)

    def _make_runtime(self) -> Runtime:
        """Each job on the runtime its app names, else the configured one (:mod:`pilotfill.elastic.runtimes`); every
        process a runtime puts on a compute node goes through the node's pilot agent (``self.launcher``)."""
        def make(kind: str) -> Runtime:
            return runtime_class(kind).from_config(self.config, self.run_dir, self.launcher,
                                                   on_spawn=self._record_process)

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
                reply = handler(request, now)
            else:
                with self.journal.transaction():
                    reply = handler(request, now)
                if not self._batching:
                    self.wakes.flush()
            # the one place a typed reply becomes the wire's (a parked heartbeat's: transport.Server._send)
            return reply if isinstance(reply, Park) else {"ok": True, **reply.to_dict()}
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
        self.wakes.flush()

    def handle_batch(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply requests that arrived together (:meth:`together`); their replies, in order."""
        self.schedule.handled(len(messages))
        with self.together():
            return [self.handle(m) for m in messages]

    def _on_state_snapshot(self, message: StateSnapshot, now: float) -> StateSnapshotReply:
        self.node_seconds.add_until(now)
        world = self.world.snapshot()
        return StateSnapshotReply(jobs=world["jobs"], pilots=world["pilots"], nodes=world["nodes"],
                                  counters=world["counters"], events=self.journal.events(limit=50),
                                  incarnation=self.incarnation, placement=self.types.placement(),
                                  notices=self.notices.as_list(), node_seconds=self.node_seconds.totals())

    def capacity(self) -> int:
        """The most nodes a job could ever get: the machine (if the batch system says) within the configured cap."""
        machine = self.gateway.call("capacity", self.scheduler.capacity)
        cap = self.config.controller.max_job_nodes
        return min(cap, machine) if isinstance(machine, int) and machine > 0 else cap

    def _on_runtime_message(self, kind: str, message: Message, now: float) -> Reply:
        """A message of a runtime's own (``Runtime.handles``: the torch agents' ``rdzv.*``), answered by that
        runtime."""
        runtime = self.runtime.answering(message.TYPE)
        if runtime is None:
            raise ProtocolError(f"{message.TYPE}: no {kind} job runs in this campaign")
        return runtime.handle(message, now)

    # ------------------------------------------------------------ every way a node goes

    def remove_nodes(self, names: Iterable[str], now: float, why: NodeWhy, to: Removal, deadline: float | None = None,
                     event: str | None = None, taken: bool = False, detail: object = None) -> None:
        """Take nodes away from their jobs and, unless ``to`` is ``Removal.FROM_JOB``, out of the pool.

        ``to``: ``LEAVING`` (SIGTERM: gone within the grace period), ``GONE``
        (ended, lost, released, taken back) or ``FROM_JOB`` (the node stays
        ours, its job lost it: a rank crashed). The jobs shrink at the next
        decision, which follows at once; nothing else is moved here. ``taken``:
        the batch system ended the hold (preemption, walltime), so how long the
        node stayed is what this machine gives, and the horizon learns from it
        (not from our own releases). ``why`` and its ``detail`` are what the journal says.
        """
        world = self.world
        shrunk: dict[str, list[str]] = {}
        said = why.say(detail)
        for name in names:
            node = world.nodes.get(name)
            if (node is None or node.state == NodeState.GONE
                    or (to == Removal.LEAVING and node.state == NodeState.LEAVING)):
                continue
            if node.job is not None:
                shrunk.setdefault(node.job, []).append(name)
            held = None
            if taken and node.state == NodeState.READY:
                held = round(now - node.since, 3)
                self.holds.observe(held)
            if to == Removal.FROM_JOB:
                world.assign(node, None)
            else:
                world.set_node_state(node, NodeState(to.value), now, deadline)
            world.log(event or f"node.{to.value}", now, pilot=node.pilot, node=name, why=said,
                      **({"held_s": held} if held is not None else {}))  # fmt: skip
        for job_id, gone in shrunk.items():
            job = world.jobs.get(job_id)
            if job is None or job.status in TERMINAL:
                continue
            lost = set(gone) & set(job.nodes)
            if lost:
                world.update_job(job, nodes=[n for n in job.nodes if n not in lost])
                job.lost |= lost
                self.schedule.changed(urgent=True)
        self.schedule.changed()

    # ------------------------------------------------------------ polled events

    def step(self, now: float | None = None, more: bool = False) -> None:
        """One pass over what is polled rather than messaged, then a decision if anything changed.

        ``more``: requests are still waiting (the pass read a full batch): the
        decision waits for them, within :data:`.schedule.FLOOD_DEFER_S`. A bug met here is
        logged and the loop goes on (the journal holds what memory holds); only
        a journal that cannot be written stops the controller.
        """
        now = self.clock() if now is None else now
        self.schedule.step_begins(more)
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
            self.schedule.failed()  # the same failing decision is not retried every tick; the next event decides
        self._last_step = now
        self.schedule.step_ends()
        if VALIDATE:
            self.world.validate()

    def _step(self, now: float) -> None:
        self.node_seconds.add_until(now)
        try:
            self._step_in_transaction(now)
        finally:
            self.wakes.flush()
        if self.pilots.fatal is not None:  # journaled above; the process stops with its one line
            raise self.pilots.fatal

    def _step_in_transaction(self, now: float) -> None:
        """Poll what is not messaged, tell the schedule what was seen, do the one thing it says
        (controller/schedule.py)."""
        with self.journal.transaction():
            before, self._polled_at = self._polled_at, now
            self._backlog.extend((event, before) for event in self.gateway.call("poll", self.scheduler.poll, now) or [])
            events = min(MAX_BATCH, len(self._backlog))  # a wave of thousands (pilots at their walltime): in passes
            for _ in range(events):
                event, polled_before = self._backlog.popleft()
                self.liveness.on_pilot_event(event, now, polled_before)
            self.schedule.polled(events)
            for exit_ in self.runtime.poll():
                self._on_rank_exit(exit_, now)
            for job in self.progress.stalled(now, self.runtime.silent_s):
                self.applier.reform(job, now)
                self.schedule.changed()
            self.liveness.drain_walltimes(now)
            self.liveness.check_heartbeats(now, self._last_step)
            idle = self._idle()
            pilots = self.pilots
            seen = Observed(
                idle, len(self.world.open), backlog=bool(self._backlog), draining=self.draining,
                pilots_owed=pilots.owed,
                types_moved=(self.types.typed and self._idle_types is not None
                             and self._idle_types != self.types.last_idle),
                arriving=lambda: pilots.arriving(now, SETTLE_S),
                pilots_due=lambda: pilots.release_due(now) or pilots.retry_due(now) or pilots.limit_due(now),
            )  # fmt: skip
            self._do(self.schedule.next(now, seen), now)
            if self._idle_types is not None:
                self.types.last_idle = self._idle_types
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                self.node_seconds.journal()
                self.world.prune(KEEP_EVENTS, KEEP_ENDED_PILOTS)
                self._forget_dead_processes()
                used = self.views.forget_kinds()
                if used is not None:  # what was remembered of kinds no waiting job has any more goes with them
                    self.planner.forget_kinds(used)
                # Python's full collections scan every object alive, and at whole-machine scale the controller's memory
                # (nodes, jobs, curves, the modules it imported) made one a stall in the middle of a decision while
                # finding nothing to free: what it holds has no cycles to break. What has lived this long is frozen
                # (moved out of the collector's sight, freed by reference counting as usual); the collector scans
                # what is newer. Given back by shutdown().
                gc.freeze()

    def _do(self, action: Action, now: float) -> None:
        """What the schedule said this pass does (one action a pass)."""
        match action.do:
            case Do.DROP:
                self.pilots.forget_owed()  # stopping: no job starts or grows, no pilot is asked for
            case Do.DECIDE:
                self.decide(now, action.idle, late=True)
            case Do.APPLY:
                decided = action.carries
                self._carry_out(decided, now, decided.idle, decided.apart)
            case Do.OFFER:
                self._offer_free(action.carries, now)
            case Do.SIZE:
                self.pilots.adjust(now, action.idle, action.carries, idle_types=self._idle_types_now())
            case Do.ASK:
                self.pilots.adjust(now, action.idle, idle_types=self._idle_types_now())
            case Do.SETTLE:
                self.pilots.settle_owed(now)  # a wave of idle nodes asked for, or of unused nodes given back, in passes

    @property
    def busy(self) -> bool:
        """Step again without waiting: batch-system events wait to be handled (a wave larger than one pass), part of a
        decision is owed to the next pass, or the pilots owe submissions or releases (more than one pass makes)."""
        return self.schedule.busy(bool(self._backlog), self.pilots.owed, self.draining)

    @property
    def solves_next(self) -> bool:
        """Whether the loop's next pass solves the whole machine at scale, and so reads no request."""
        return self.schedule.solves_next(len(self.world.open), self.draining, bool(self._backlog))

    @property
    def decision(self):
        """Where a decision spread over passes stands (:class:`.schedule.Decision`)."""
        return self.schedule.decision

    @property
    def dirty(self) -> bool:
        """Whether the allocation rests on something that changed since it was decided."""
        return self.schedule.dirty

    def _on_rank_exit(self, exit_: RankExit, now: float) -> None:
        self._leaving_ranks.discard((exit_.job_id, exit_.host))
        job = self.world.jobs.get(exit_.job_id)
        if job is None or job.status in TERMINAL or exit_.requested:
            return
        if not exit_.host:
            # The job's launcher ended without the job reporting a result or a failure.
            crashes = job.crashes + 1
            self.world.log("job.crashed", now, job=job.id, returncode=exit_.returncode, crashes=crashes)
            if crashes >= JOB_RETRIES:
                error = (f"the job's launcher {exit_words(exit_.returncode)}, {crashes} times in a row; last output:\n"
                         f"{exit_.output}")
                self.world.update_job(job, crashes=crashes)
                self.end_job(job, now, "failed", error=error, why=f"launcher exited {exit_.returncode}")
            else:
                self.world.requeue(job, crashes=crashes)
            self.schedule.changed()
        elif exit_.crashed and exit_.host in job.nodes:
            # A rank that ended on its own on a node its pilot still holds is the app's own doing (sys.exit from a
            # child, a segfault, the OOM killer), not a lost node: relaunched, but not for ever — JOB_RETRIES such
            # ends in a row with nothing committed in between end the job, saying what the rank did.
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
                    f"a rank of the app {what} on {exit_.host}, {crashes} times in a row with nothing committed in "
                    f"between: the app's own end, not a lost node (its output: {log_path})")
                self.end_job(job, now, "failed", error=error, why=f"a rank {what}")
                return
            self.remove_nodes([exit_.host], now, NodeWhy.RANK_CRASHED, Removal.FROM_JOB, detail=exit_.returncode)

    def _decide_again(self) -> None:
        """Something the allocation rests on changed: the next pass decides again."""
        self.schedule.changed()

    def end_pilot(self, pilot: Pilot, state: str, now: float) -> None:
        """A pilot is over (``ended`` or ``lost``); its nodes must have been removed. Its agent ends what ran there."""
        self.world.end_pilot(pilot, state, now)
        self.launcher.forget(pilot.id)
        self.adoption.forget(pilot.id)
        self.heard.forget(pilot.id)
        self.wakes.later(pilot.id)  # a heartbeat it has waiting is told to stop

    # ------------------------------------------------------------ the decision

    def decide(self, now: float, idle: int | None = None, late: bool = False) -> Allocation | None:
        """Ask the allocator, apply the difference (one runtime call per job that changed), then size
        the pilots from the same answer: release what no job will use, ask for what is missing (with
        :data:`.schedule.SIZE_APART_JOBS` open jobs or more, in the loop's next pass).

        ``late`` (the loop's decisions): at scale the answer is applied in the next pass, which reads no request:
        solving the machine and changing hundreds of jobs are two passes, not one. If anything changed in between,
        the answer no longer holds; the decision is taken again and applied in the pass that takes it."""
        began = time.perf_counter()
        self.schedule.deciding()
        if idle is None:
            idle = self.schedule.last_idle or 0
        apart = self.schedule.apart(len(self.world.open))
        decided = None
        if self.world.open or self.world.ready:
            t0 = time.perf_counter()
            solved = self.planner.solve(len(self.world.ready) + idle + self.world.pending_nodes(), 0, apart=apart)
            solve_ms = (time.perf_counter() - t0) * 1000
            self.stats["solve_ms"].append(solve_ms)
            self.methods[solved.answer.method] += 1
            self.last_method = solved.answer.method
            if solved.again:  # more copies of a kind are weighed: by the decision of the next pass, at once
                self.schedule.weigh_more()
                return None
            decided = Decided(solved, solve_ms, idle, apart)
            if self.schedule.apply_later(late, apart, decided):
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
            active, problem, answer, left = (decided.solved.active, decided.solved.problem, decided.solved.answer,
                                             decided.solved.left)
            moved = self.applier.apply(active, answer, now)
            self.world.log("allocation", now, solve_ms=round(decided.solve_ms, 3), method=answer.method,
                           counts={j: n for j, n in answer.counts.items() if n}, moved=moved,
                           pool=len(problem.pool.nodes), horizon_s=round(problem.t_fwd, 3))
            if apart and any(left) and sum(answer.counts.values()) < len(problem.pool.nodes):
                offer = (problem, answer, left)  # the nodes it leaves free: to the jobs it left out, in the next pass
        self.schedule.carried_out(apart, offer, answer)
        if not apart:
            self.pilots.adjust(now, idle, answer, idle_types=self._idle_types_now())
        return answer

    def _idle(self) -> int | None:
        """Idle nodes the batch system has for us now (on a typed machine, asked per type: ``_idle_types``)."""
        if not self.types.typed:
            return self.gateway.call("idle", self.scheduler.idle_nodes)
        self._idle_types = self.gateway.call("idle", self.scheduler.idle_by_type)
        return sum(self._idle_types.values()) if self._idle_types is not None else None

    def _idle_types_now(self) -> dict[str, int] | None:
        if not self.types.typed:
            return None
        return (self._idle_types if self._idle_types is not None
                else (self.types.last_idle or {t: 0 for t in self.types.names}))


    def _offer_free(self, offer: tuple[Problem, Allocation, list[list[Job]]], now: float) -> None:
        """The pass after a large decision: the nodes its answer left free, offered to the waiting jobs it left out
        (:meth:`.Planner.offer_left_free`) and the jobs that take them started. Nothing changed since (else the
        decision is taken anew), so its problem still holds; the pilots are sized on both answers together, in the
        pass after."""
        problem, answer, left = offer
        t0 = time.perf_counter()
        left = [[j for j in queue if j.status == JobStatus.PENDING and not j.nodes] for queue in left]
        joined, offered = self.planner.offer_left_free(problem, answer, left)
        if not offered:
            return
        solve_ms = (time.perf_counter() - t0) * 1000
        moved = self.applier.apply(offered, joined, now)
        self.world.log("allocation", now, solve_ms=round(solve_ms, 3), method=joined.method,
                       counts={j: n for j, n in joined.counts.items() if n}, moved=moved, pool=len(problem.pool.nodes),
                       horizon_s=round(problem.t_fwd, 3), offered=len(offered))
        self.schedule.offered(joined)


    # ------------------------------------------------------------ helpers

    def end_job(self, job: Job, now: float, status: str, result: Any = None, error: str | None = None,
                why: str | None = None) -> None:
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
        if status == JobStatus.FINISHED:
            self.job_handlers.finished(job, now)
        self.types.learned(job, status)  # a measured model joins the similarity library
        self.profiler.forget(job.id)
        self.progress.forget(job.id)
        self.applier.forget(job.id)
        self.views.forget(job.id)
        job.lost = set()
        self.schedule.changed()

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
        self.wakes.flush()
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
            for job in list(world.running.values()):
                world.requeue(job)  # a re-run resumes it from its commit
            for pilot in list(world.pilots.values()):
                self.remove_nodes(list(pilot.nodes), now, NodeWhy.CONTROLLER_STOPPED, Removal.GONE)
                self.end_pilot(pilot, "ended", now)
            self.journal.clear_processes()
            self.node_seconds.add_until(now)
            self.node_seconds.journal()
            world.log("controller.stopped", now, incarnation=self.incarnation, ranks_not_gone=len(self._leaving_ranks))
        self.journal.close()
        # what this controller froze is the collector's again (a replay or a test goes on in this process)
        gc.unfreeze()


__all__ = ["Controller", "JOB_RETRIES", "MAX_BATCH", "Pilot", "ProblemError"]

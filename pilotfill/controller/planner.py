"""What a decision and the pilots' question weigh, and the allocator's answer to them.

The controller asks two things of the allocator: the decision (which jobs get
which nodes now) and the pilots' question (how many nodes would the jobs use
with ``extra`` more: :class:`~pilotfill.pilots.manager.Question`). Both weigh
the same jobs the same way — every running job, and waiting ones from two
queues, the most promising first, copies of a sweep a few at a time — and
both leave out the free nodes whose pilot ends before a rescale would pay.
:class:`Planner` holds that, with what it remembers between questions (how
many copies of a kind the last answer used, the last question's answer). It
reads the world and changes nothing in it but a job the allocator cannot use,
which it fails through the controller (``fail``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..allocator import Allocation, NodePool, Problem, ProblemError, Profiler, allocate
from ..allocator import Job as AllocJob
from ..config import ControllerConfig
from ..lifecycle import TERMINAL, JobStatus
from .node_types import NodeTypes
from .views import AllocatorViews
from .waiting import DUE_SHARE, HOLDS_NODES, LIKE_NO_OTHER, OVERDUE_S, Admitted, WaitingJobs, in_turns
from .walltime import Walltimes
from .world import Job, World

MIN_COPIES = 4
"""Waiting jobs of one kind a decision weighs at least (see :meth:`Planner.solve`)."""
SOLVER_CLOCK = time.thread_time
"""What the allocator's time limit is read on (it reads no clock of its own): this thread's CPU time, not the wall's,
so that on a busy host the same problem gets the same search and the controller's other threads do not spend it."""


class Solved(NamedTuple):
    """What :meth:`Planner.solve` weighed and answered."""

    active: list[Job]  # the jobs weighed (running, and waiting ones by rank)
    problem: Problem
    answer: Allocation
    # waiting jobs left out, each queue's rest, most promising first (empty once offered the free nodes)
    left: list[list[Job]]
    again: bool = False  # a large decision that weighs more copies of a kind in the next pass: not to be applied
    unweighed: tuple[Job, ...] = ()  # with ``again``: the copies of those kinds not weighed yet


class Planner:
    """The jobs a decision or the pilots' question weighs, its problem and the allocator's answer (the controller's
    :class:`~pilotfill.pilots.manager.Question`)."""

    def __init__(
        self,
        world: World,
        config: ControllerConfig,
        profiler: Profiler,
        types: NodeTypes,
        views: AllocatorViews,
        waiting: WaitingJobs,
        walltimes: Walltimes,
        horizon: Callable[[float, int], float],
        clock: Callable[[], float],
        fail: Callable[[Job, str, str], None],
    ):
        """``horizon(now, extra)``: how long an allocation made now lasts; ``fail(job, error, why)``: the controller
        ends a job the allocator cannot use."""
        self.world, self.config, self.profiler, self.types = world, config, profiler, types
        self.views, self.waiting, self.walltimes = views, waiting, walltimes
        self.horizon, self.clock, self.fail = horizon, clock, fail
        # (a pilot-sizing question?, kind of waiting job) -> how many of it the last such question weighed (see solve)
        self.copies: dict[tuple[bool, int], int] = {}
        self._memo: tuple[tuple, int] | None = None  # the last pilot-sizing answer and what it rested on (see wanted)
        self.overdue_s = OVERDUE_S  # admission by worth: a job waiting this long is due (a replay may measure others)
        self.due_share = DUE_SHARE
        # jobs made due (admission by worth), until they end: they start first, and keep that
        self.due: dict[str, None] = {}
        # the due jobs the last admission started first (what :meth:`problem` marks)
        self._due_now: frozenset[str] = frozenset()

    def forget_answer(self) -> None:
        """The next question is solved anew even if nothing it rests on changed (a test compares both ways)."""
        self._memo = None

    def forget_kinds(self, used: set[int]) -> None:
        """What was remembered of kinds no waiting job has any more goes with them (``used``: the kinds left)."""
        self.copies = {key: n for key, n in self.copies.items() if key[1] in used}

    def wanted_types(
        self, extra: dict[str, int], answer: Allocation | None, without: tuple[str, ...] = ()
    ) -> dict[str, int]:
        """:meth:`wanted` per node type: how many nodes of each type the jobs would use with ``extra`` more of each
        (``without``: ready nodes left out, as in :meth:`wanted`)."""
        if sum(extra.values()) <= 0 and answer is not None and not without:
            return self.types.counts_by_type(answer)
        room = len(self.world.ready) - len(without) + sum(extra.values())
        # weighed as a decision is (chains a few at a time): all of them at once made cores slow for HiGHS to prove
        if self.config.admission == "worth":
            return self.types.counts_by_type(self.solve(room, extra, without).answer) if self.world.open else {}
        active = self.active(room)
        if not active:
            return {}
        potential = self.allocate(self.problem(active, extra, without))
        return self.types.counts_by_type(potential)

    def wanted(self, extra: int, answer: Allocation | None, without: tuple[str, ...] = ()) -> int:
        """How many nodes the jobs would use if ``extra`` more were ready: the pilots' target. ``without``: ready
        nodes left out (the question before giving them back: would the jobs ask for them again, as new nodes?)."""
        if without:
            if not self.world.open:
                return 0
            return self.used(
                lambda: self.solve(len(self.world.ready) - len(without) + extra, extra, without, apart=True)
            )
        if extra <= 0 and answer is not None:
            return sum(answer.counts.values())
        if not self.world.open:
            return 0
        # Asked again at the same instant with nothing the answer rests on changed (a second step of one tick, or
        # of one replayed event): the same answer, not a second solve of the whole machine.
        world = self.world
        key = (self.clock(), len(world.ready), extra, world.jobs_version, self.profiler.changes)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        every = self.whole_pool(len(world.ready) + extra)
        if every is None:
            every = self.used(lambda: self.solve(len(world.ready) + extra, extra, apart=True))
        self._memo = (key, every)
        return every

    def whole_pool(self, room: int) -> int | None:
        """The pilots' question answered without a solve where the answer is certain: when at least ``room`` waiting
        jobs could each start on one node and gain from it, no optimum leaves a node of the pool unused (with one
        free, one of those jobs would not be running and would gain from it), so the jobs would use the whole pool —
        the ``room`` nodes less the free ones whose pilot ends too soon to be offered (judged on every job the
        question weighs, as :meth:`problem` does). A queue of thousands (a saturated machine) then costs the
        question no solve. None where it is not certain (several kinds of node; too few jobs that start on one node)."""
        if self.types.typed:
            return None
        waiting = self.admitted(room).jobs
        if self.starters(waiting, room) < room:
            return None
        running = list(self.world.running.values())
        made_of = [self.views.inputs(job) for job in running]
        self.views.prepare(running, made_of)
        try:
            views = [self.views.view(job, inputs) for job, inputs in zip(running, made_of)]
        except (ProblemError, KeyError, TypeError, ValueError):  # a job the allocator cannot use: the solve fails it
            return None
        within = self.rescale_within(views)
        for job in waiting:  # thousands on a saturated machine: each one's costs kept until it changes
            traits = self.waiting.traits(job)
            if traits is None:
                return None
            within = max(within, traits[1])
        return room - len(self.ending_soon(within, self.clock()))

    def starters(self, waiting: list[Job], enough: int) -> int:
        """How many of ``waiting`` would gain from one node alone (counted up to ``enough``; 0 where one cannot be
        told: several kinds of node, a job the allocator cannot use). With that many for as many free nodes, no
        optimum leaves one of them unused."""
        if self.types.typed:
            return 0
        could = [job for job in waiting if job.spec["min_nodes"] == 1 and job.spec["weight"] > 0]
        if len(could) < enough:  # too few could start on one node, whatever their curves
            return 0
        starters = 0
        traits_of = self.waiting.traits
        for job in could:
            traits = traits_of(job)
            if traits is None:
                return 0
            starters += traits[0]
            if starters >= enough:
                break
        return starters

    def used(self, ask: Callable[[], Solved]) -> int:
        """How many nodes the answer to a pilots' question uses (``ask``: :meth:`solve` ``apart``):
        those it gives the jobs it weighed, and those of the nodes it leaves free that the jobs it left out would take
        (:meth:`offer_left_free`) — all of them, without a second solve,
        where enough of those jobs would each gain from one node."""
        solved = ask()
        while solved.again:  # every copy of a kind weighed was used
            used = sum(solved.answer.counts.values())
            free = len(solved.problem.pool.nodes) - used
            waiting = [*(job for queue in solved.left for job in queue), *solved.unweighed]
            if free <= 0 or self.starters(waiting, free) >= free:
                return used + max(free, 0)  # with more copies too, every node is used: no second solve
            solved = ask()  # asked once more, now, with more copies (a question is answered in its pass)
        used = sum(solved.answer.counts.values())
        free = len(solved.problem.pool.nodes) - used
        if free <= 0 or not any(solved.left):
            return used
        if self.starters([job for queue in solved.left for job in queue], free) >= free:
            return used + free
        answer, _ = self.offer_left_free(solved.problem, solved.answer, solved.left)
        return sum(answer.counts.values())

    def solve(
        self, room: int, extra: int | dict[str, int], without: tuple[str, ...] = (), apart: bool = False
    ) -> Solved:
        """The jobs a decision weighs, its problem, the allocator's answer
        and the waiting jobs left out (:class:`Solved`).

        Every running job is weighed, and at most ``controller.weigh_waiting`` waiting jobs from each of two queues
        (jobs that ran, jobs that never ran), the most promising first; jobs alike join a few at a time (weighed
        whole they make cores slow to prove). docs/architecture/controller.md ("Which jobs a decision weighs") says why.

        ``apart``: a large decision, one solve of the machine per pass of the loop: the caller offers the nodes left
        free in the next pass, whose decision weighs the copies added here; the answer is ``again``, not applied.
        """
        admitted = self.admitted(room)
        jobs, kinds = admitted.jobs, admitted.kinds
        running = list(self.world.running.values())
        due = self._due_now
        forced = (
            (kinds == HOLDS_NODES) | np.fromiter((j.id in due for j in jobs), dtype=bool, count=len(jobs))
            if due
            else kinds == HOLDS_NODES
        )
        # weighed whatever their rank: they hold nodes, or are due
        running += [jobs[i] for i in np.flatnonzero(forced).tolist()]
        # kind -> the positions among ``jobs`` of the waiting jobs alike, in submission order
        alike: dict[int, list[int]] = {}
        # a chain, the most work left first: each worth as much as the next or more
        if self.config.admission == "worth":
            chain = self.views.chain
            for i in np.flatnonzero((kinds >= 0) & ~forced).tolist():
                alike.setdefault(chain(jobs[i]), []).append(i)
            for at in alike.values():
                at.sort(key=lambda i: (-(jobs[i].spec.get("total_samples") or math.inf) + jobs[i].progress, i))
        else:
            for i in np.flatnonzero((kinds >= 0) & ~forced).tolist():
                alike.setdefault(int(kinds[i]), []).append(i)
        # A decision and a pilot-sizing question (more room) weigh different numbers of copies: each remembers its own.
        question = (sum(extra.values()) if isinstance(extra, dict) else extra) > 0
        copies = {kind: self.copies.get((question, kind), MIN_COPIES) for kind in alike}
        limit = self.config.weigh_waiting

        # positions in submission order -> those jobs, the most promising first
        def ranked(at: np.ndarray) -> list[Job]:
            if 0 < limit < len(at):
                at = self.waiting.most_promising(admitted, at)
                # every group's most promising are weighed, not the best group's alone
                if self.config.objective == "share":
                    at = at[in_turns([jobs[i].spec.get("group", "") for i in at.tolist()])]
            return [jobs[i] for i in at.tolist()]

        def fresh() -> list[Job]:
            return ranked(
                np.sort(np.fromiter((i for kind, at in alike.items() for i in at[: copies[kind]]), dtype=np.int64))
            )

        queues = [ranked(np.flatnonzero((kinds == LIKE_NO_OTHER) & ~forced)), fresh()]
        weigh = [limit if 0 < limit < len(q) else len(q) for q in queues]
        while True:
            weighed = [j for q, w in zip(queues, weigh) for j in q[:w]]
            active = sorted(running + weighed, key=lambda j: j.seq)
            problem = self.problem(active, extra, without)
            answer = self.allocate(problem)
            left = [q[w:] for q, w in zip(queues, weigh)]
            if not apart:
                answer, offered = self.offer_left_free(problem, answer, left)
                left = []
                if offered:
                    weighed += offered
                    active = sorted(running + weighed, key=lambda j: j.seq)
            ids = {j.id for j in weighed}
            added = 0
            unweighed: list[Job] = []
            for kind, at in alike.items():
                offered = [jobs[i] for i in at[: copies[kind]]]
                fit = room // max(1, jobs[at[0]].spec["min_nodes"])  # no more of them than the room could start
                if len(offered) < min(len(at), fit) and all(
                    j.id in ids and answer.counts.get(j.id, 0) > 0 for j in offered
                ):
                    # every copy weighed was used: as many as could start
                    copies[kind] = min(len(at), max(2 * len(offered), fit))
                    added += copies[kind] - len(offered)
                    unweighed += [jobs[i] for i in at[len(offered) :]]
            # kinds no longer waiting are forgotten
            remembered = {key: n for key, n in self.copies.items() if key[0] != question}
            if added and apart:
                self.copies = remembered | {(question, kind): n for kind, n in copies.items()}
                return Solved(active, problem, answer, left, again=True, unweighed=tuple(unweighed))
            if added:
                # the copies added rank beside those used: all of them weighed
                queues[1], weigh[1] = fresh(), weigh[1] + added
                continue
            for kind, at in alike.items():
                used = sum(1 for i in at[: copies[kind]] if answer.counts.get(jobs[i].id, 0) > 0)
                if 2 * used > MIN_COPIES:  # next time: about what this answer used (MIN_COPIES, unless remembered)
                    remembered[(question, kind)] = 2 * used
            self.copies = remembered
            return Solved(active, problem, answer, left)

    def offer_left_free(
        self, problem: Problem, answer: Allocation, left: list[list[Job]]
    ) -> tuple[Allocation, list[Job]]:
        """Nodes ``answer`` leaves free, offered to the waiting jobs a decision left out (``left``: each queue's rest,
        the most promising first): as many of each as the free nodes could start, then all of them. Those jobs are
        allocated the free nodes alone — what the weighed jobs were given stands — so a wave of new nodes (or the
        pilots' question, with every idle node) costs a solve of the jobs that could take them, not a second solve of
        the whole machine. Returns the answer with theirs joined, and the jobs offered."""
        offered: list[Job] = []
        rounds = 0
        while rounds < 2:
            free = len(problem.pool.nodes) - sum(answer.counts.values())
            if free <= 0:
                break
            more = []
            for i, queue in enumerate(left):
                take = len(queue) if rounds else free  # first as many as the free nodes could start, then all
                more += [j for j in queue[:take] if j.spec["min_nodes"] <= free]
                left[i] = queue[take:]
            rounds += 1
            views = self.views_of(more)
            if not views:
                continue
            used = {n for nodes in answer.assignment.values() for n in nodes}
            nodes = tuple(n for n in problem.pool.nodes if n not in used)
            types = {n: problem.pool.types[n] for n in nodes if n in problem.pool.types}
            rest = self.allocate(Problem(tuple(views), NodePool(nodes, types), {}, problem.t_fwd))
            answer = answer.joined(rest)
            offered += [j for j in more if j.status not in TERMINAL]
        return answer, offered

    def allocate(self, problem: Problem) -> Allocation:
        """The allocator's answer to ``problem`` under the configured formulation, objective and time limit."""
        config = self.config
        return allocate(problem, config.formulation, config.solver_time_limit_s, config.objective, clock=SOLVER_CLOCK,
                        share_cost=config.share_cost)  # fmt: skip

    def admitted(self, room: int) -> Admitted:
        """The waiting jobs a decision admits with ``room`` nodes (:func:`.waiting.admit`: by worth, or in submission
        order, as ``controller.admission`` says), described anew where they changed since the last decision (the
        world's record of changed jobs, JPA's versions)."""
        changed = self.world.take_changed() | self.profiler.take_touched()
        now = self.clock()
        self.waiting.sync(self.world, changed, recheck=self.types.typed, now=now)
        config = self.config
        by_worth = config.admission == "worth"
        self._due_now = self.dues(room, now) if by_worth else frozenset()
        due = (job.seq for job_id in self._due_now if (job := self.world.open[job_id]).status != JobStatus.RUNNING)
        return self.waiting.admitted(
            room,
            config.max_jobs,
            len(self.world.running),
            by_group=config.objective == "share",
            by_worth=by_worth,
            due=due,
        )

    def dues(self, room: int, now: float) -> frozenset[str]:
        """The due jobs a decision with ``room`` nodes starts first (:mod:`..allocator.due`): those made due before,
        running or not, and the waiting jobs that have waited ``overdue_s`` (made due now), in submission order, while
        their ``min_nodes`` fit in ``due_share`` of the room — the first always. No job is passed over for ever: the
        oldest due job runs wherever it fits and keeps running until it ends, then the next oldest, and a job made due
        goes before every job made due after it."""
        world = self.world
        for job_id in [job_id for job_id in self.due if job_id not in world.open]:
            del self.due[job_id]  # ended
        known = [world.open[job_id] for job_id in self.due]
        overdue = self.waiting.overdue(now - self.overdue_s)
        cap = self.due_share * room
        taken, out = 0, []
        candidates = heapq.merge(
            sorted(known, key=lambda j: j.seq), (j for j in overdue if j.id not in self.due), key=lambda j: j.seq
        )
        for job in candidates:
            lo = job.spec["min_nodes"]
            if lo > room:
                continue  # could never start here: it takes no place
            if out and taken + lo > cap:
                break
            taken += lo
            out.append(job.id)
        self.due.update(dict.fromkeys(out))
        return frozenset(out)

    def active(self, room: int) -> list[Job]:
        """The jobs a decision weighs: the running ones and the waiting ones admitted (:meth:`admitted`) while they
        could start on the ``room`` nodes that could be had (or ``controller.max_jobs`` of them when set)."""
        return sorted([*self.world.running.values(), *self.admitted(room).jobs], key=lambda j: j.seq)

    def problem(self, active: list[Job], extra: int | dict[str, int], without: tuple[str, ...] = ()) -> Problem:
        """The allocation problem now; ``extra`` adds hypothetical nodes (what pilots could bring; per type on a
        machine with several kinds of node); ``without`` leaves ready nodes out."""
        jobs = self.views_of(active)
        if self._due_now:  # run first (:mod:`..allocator.due`)
            jobs = [view.as_due() if view.id in self._due_now else view for view in jobs]
        holding = self.world.holding
        current = {job.id: holding(job) for job in active if job.nodes}  # a job that failed in _views holds none
        now = self.clock()
        ending = self.ending_soon(self.rescale_within(jobs), now)
        left_out = ending.union(without)  # a set: ``without`` may be thousands of nodes (all of them, to give back)
        ready = tuple(n for n in self.world.ready if n not in left_out)
        if self.types.typed:
            pool, types = self.types.pool(self.world, ready, extra if isinstance(extra, dict) else {})
            return Problem(
                tuple(jobs),
                NodePool(pool, types),
                current,
                self.horizon(now, sum(extra.values()) if isinstance(extra, dict) else extra),
            )
        pool = ready + tuple(f"+{i}" for i in range(extra))
        return Problem(tuple(jobs), NodePool(pool), current, self.horizon(now, extra))

    def views_of(self, jobs: list[Job]) -> list[AllocJob]:
        """The allocator's views of ``jobs``; a job the allocator cannot use fails, with the reason."""
        made_of = [self.views.inputs(job) for job in jobs]  # once per job (a thousand in a whole-machine decision)
        self.views.prepare(jobs, made_of)
        views = []
        for job, inputs in zip(jobs, made_of):
            try:
                views.append(self.views.view(job, inputs))
            except (ProblemError, KeyError, TypeError, ValueError) as exc:  # a spec that slipped past the checks
                self.fail(job, f"the allocator cannot use this job: {exc}", str(exc)[:200])
        return views

    def job_ending_within(self, seconds: float) -> bool:
        """Whether a running job should finish its work within ``seconds`` at its current size (its remaining
        samples at the rate its curve gives there): its nodes, free then, may make a growth worth it that the
        nodes about to be given back would complete."""
        for job in self.world.running.values():
            total = job.spec.get("total_samples")
            if not total or not job.nodes:
                continue
            try:
                view = self.views.view(job)
            except (ProblemError, KeyError, TypeError, ValueError):
                continue
            rate = max((curve.at(len(job.nodes)) for curve in view.throughput.values()), default=0.0)
            if rate > 0 and view.remaining_samples / rate <= seconds:
                return True
        return False

    @staticmethod
    def rescale_within(jobs: list[AllocJob]) -> float:
        """The costliest rescale among ``jobs`` (scale-up and scale-down seconds): what a free node must outlast."""
        return max((j.scale_up_cost_s + j.scale_down_cost_s for j in jobs), default=0.0)

    def ending_soon(self, within: float, now: float) -> set[str]:
        """Free nodes whose pilot's drain comes within ``within`` seconds (the costliest rescale the jobs weighed would
        pay, :meth:`rescale_within`): not offered."""
        world = self.world
        ending = set()
        for pilot_id, _ in self.walltimes.ending_within(now, within) if within > 0 else ():
            pilot = world.pilots.get(pilot_id)
            if pilot is not None:
                ending.update(n for n in pilot.nodes if n in world.ready and world.nodes[n].job is None)
        return ending

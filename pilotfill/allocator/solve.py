"""One entry point: ``allocate(problem)`` always returns an allocation.

The formulation is chosen as DESIGN says: the exact DP where it applies (one
node type per job), the exact typed solver where jobs choose among node types
(a node price per type, reduced-cost fixing and an exact search over the jobs
torn between types: :mod:`.typed`), the aggregated MILP where neither can
answer; the node-level
model and the greedy heuristic only on request. A solver that fails or runs out of time
falls back to its incumbent, else to greedy: the caller is never left without
an answer and the controller loop never stalls on a solver.

No clock is read here: the typed solver's time limit is read on the caller's
(``allocate(..., clock=time.thread_time)``, as the controller does); without one
its search is bounded by its limit of states alone, and the same problem gets the
same answer however busy the host (the MILPs keep their solvers' own time limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import numpy as np

from . import dp, due, greedy, milp, nodelevel, shares, typed
from .moves import Assignment
from .problem import DEFAULT_TYPE, Allocation, Job, Problem
from .profiler import EXPLORE_RATE
from .typecore import Clock
from .values import ValueTable, current_rate, exploration_tables, hop_table, value_matrices, value_tables

EXPLORE_TIME_S = 0.03
"""What the typed explore stage may spend (:func:`.typed.solve`'s limit, its search alone: HiGHS overruns a limit this
short): exploring is a bonus within a decision's budget of 100 ms; past it, the best exploration found."""


MEASURING_RATE = EXPLORE_RATE / 1000
"""A job running at this metric rate or more is being measured (JPA's exploring rate, 10¹² samples/s; the fastest
measured jobs here, 10⁵): a due job does not displace it (:mod:`.due`)."""


class Formulation(str, Enum):
    AGGREGATED = "aggregated"  # exact: DP where it applies, MILP otherwise
    MILP = "milp"  # the aggregated MILP even where the DP applies (cross-checks)
    NODE_LEVEL = "node-level"  # BFTrainer's baseline
    GREEDY = "greedy"


class Objective(str, Enum):
    SAMPLES = "samples"  # the most total worth (samples, weighted): BFTrainer's objective
    SHARE = "share"  # every group its share's optimum first, then the most total worth (:mod:`.shares`)


def allocate(problem: Problem, formulation: Formulation | str = Formulation.AGGREGATED, time_limit_s: float = 1.0,
             objective: Objective | str = Objective.SAMPLES, clock: Clock | None = None,
             share_cost: float = shares.COST) -> Allocation:
    """Node counts and concrete nodes for every job of ``problem``.

    Two stages: the optimum by the jobs' confirmed curves (under ``objective``),
    then, on the nodes that answer leaves free, growth along the optimistic
    curves of jobs that have one (the profiler exploring). The second stage
    never takes a node from the first, so exploring never evicts or shrinks a
    measured job. Jobs that are ``due`` run first in the first stage (:mod:`.due`), and keep that through the second.

    ``clock``: what the typed solver's time limits are read on (:func:`.typed.solve`; the controller's:
    :func:`time.thread_time`). None: its searches are bounded by their limit of states alone. ``share_cost``: the
    most of the samples optimum the share objective gives up (:func:`.shares.solve`).
    """
    answer = None
    if Formulation(formulation) is Formulation.AGGREGATED and any(j.due for j in problem.jobs):
        answer = _due(problem, Objective(objective), time_limit_s, clock, share_cost)
    if answer is None and Objective(objective) is Objective.SHARE and len({j.group for j in problem.jobs}) > 1:
        answer = _shares(problem, time_limit_s, clock, share_cost)
    if answer is None:
        answer = _allocate(problem, Formulation(formulation), time_limit_s, clock)
    if any(j.explore is not None for j in problem.jobs):
        answer = _explore(problem, answer, clock)
    return answer


def _allocate(problem: Problem, formulation: Formulation, time_limit_s: float,
              clock: Clock | None = None) -> Allocation:
    if formulation is Formulation.GREEDY:
        return _greedy(problem, "greedy", optimal=False)
    if formulation is Formulation.NODE_LEVEL:
        try:
            result, assignment = nodelevel.solve(problem, time_limit_s)
        except Exception as exc:  # a solver crash must not stop the loop
            return _greedy(problem, "greedy", optimal=False, note=f"node-level failed: {exc!r}")
        if result.counts is None or assignment is None:
            return _greedy(problem, "greedy", optimal=False, note=f"node-level: {result.status}")
        return _finish(problem, result.counts, result.types, "node-level", result.optimal, result.status, assignment)
    if formulation is Formulation.AGGREGATED:
        answer = _dp(problem)
        if answer is None:
            try:
                answer = _typed(problem, time_limit_s, clock)
            except Exception:  # a solver bug must not stop the loop: the MILP, then greedy, answer instead
                answer = None
        if answer is not None:
            return answer
    try:
        result = milp.solve(problem, time_limit_s)
    except Exception as exc:
        return _greedy(problem, "greedy", optimal=False, note=f"milp failed: {exc!r}")
    if result.counts is None:
        return _greedy(problem, "greedy", optimal=False, note=f"milp: {result.status}")
    return _finish(problem, result.counts, result.types, "milp", result.optimal, result.status)


def objective_of(problem: Problem, counts: Mapping[str, int], types: Mapping[str, str | None],
                 tables: list[list[ValueTable]] | None = None) -> float:
    """The model's value of a count vector, from the same tables every method uses."""
    if tables is None or tables is problem.__dict__.get("_value_tables"):
        return _objective(problem, counts, types)
    total = 0.0
    for job, job_tables in zip(problem.jobs, tables or value_tables(problem)):
        n = counts.get(job.id, 0)
        if n == 0:
            total += float(job_tables[0].values[0])  # stopped: the same value on every type
            continue
        table = next((t for t in job_tables if t.node_type == types.get(job.id)), None)
        total += float(table.values[n]) if table is not None and n <= table.cap else -np.inf
    return total


def _objective(problem: Problem, counts: Mapping[str, int], types: Mapping[str, str | None]) -> float:
    """:func:`objective_of` on the problem's own tables, read from its value matrices (one gather per node type, not one
    lookup per job: every answer of a whole-machine decision is valued, over a thousand jobs)."""
    jobs = problem.jobs
    if not jobs:
        return 0.0
    n = np.fromiter((counts.get(j.id, 0) for j in jobs), dtype=np.int64, count=len(jobs))
    value = np.full(len(jobs), -np.inf)
    for node_type, (members, matrix) in value_matrices(problem).items():
        rows = np.asarray(members, dtype=np.int64)
        at = n[rows]
        mine = (np.fromiter((types.get(jobs[i].id) == node_type for i in members), dtype=bool, count=len(members))
                & (at > 0))
        stopped = at == 0  # the same value on every type: whichever matrix holds the job says it
        value[rows[stopped]] = matrix[stopped.nonzero()[0], 0]
        inside = mine & (at < matrix.shape[1])
        value[rows[inside]] = matrix[inside.nonzero()[0], at[inside]]
    return float(value.sum())


def _dp(problem: Problem) -> Allocation | None:
    """The exact DP, per node type, when every job can use exactly one type."""
    if any(len(j.node_types) != 1 for j in problem.jobs):
        return None
    pool = problem.pool.by_type()
    counts: dict[str, int] = {}
    types: dict[str, str | None] = {}
    for node_type, (members, matrix) in value_matrices(problem).items():  # each job in one type's matrix
        try:
            ns, _ = dp.solve(matrix, len(pool.get(node_type, [])))
        except dp.TooLarge:
            return None  # the MILP is faster on what is left
        for i, n in zip(members, ns):
            job_id = problem.jobs[i].id
            counts[job_id] = n
            types[job_id] = node_type if n > 0 else None
    return _finish(problem, counts, types, "dp", True, "OPTIMAL")


def _typed(problem: Problem, time_limit_s: float, clock: Clock | None = None) -> Allocation | None:
    """The exact solver across node types (:mod:`.typed`); None when a one-type knapsack inside it is too large for
    the DP (:class:`.dp.TooLarge`: the MILP then)."""
    all_tables = value_tables(problem)
    capacities = {t: len(ns) for t, ns in problem.pool.by_type().items()}
    if not capacities:
        capacities = {DEFAULT_TYPE: 0}
    tables = []
    for job_tables in all_tables:
        mine = {t.node_type: t.values for t in job_tables if t.node_type in capacities}
        tables.append(mine or {next(iter(capacities)): job_tables[0].values[:1]})
    try:
        choices, _, how = typed.solve(tables, capacities, time_limit_s, clock=clock)
    except dp.TooLarge:
        return None
    counts = {job.id: c.count for job, c in zip(problem.jobs, choices)}
    types = {job.id: c.node_type for job, c in zip(problem.jobs, choices)}
    proven = "time limit" not in how
    return _finish(problem, counts, types, "typed-" + how.split(" ")[0], proven,
                   "OPTIMAL" if proven else "time limit: best found", tables=all_tables)


def _shares(problem: Problem, time_limit_s: float, clock: Clock | None = None,
            cost: float = shares.COST) -> Allocation | None:
    """The share objective (:mod:`.shares`); None where a knapsack inside it is too large or the solver fails (the
    samples objective answers then: a decision is never lost to the objective)."""
    all_tables = value_tables(problem)
    capacities = {t: len(ns) for t, ns in problem.pool.by_type().items()} or {DEFAULT_TYPE: 0}
    tables = [{t.node_type: t.values for t in job_tables if t.node_type in capacities}
              or {next(iter(capacities)): job_tables[0].values[:1]}
              for job_tables in all_tables]
    try:
        choices, _, how = shares.solve(tables, [j.group for j in problem.jobs], capacities, time_limit_s, clock, cost)
    except Exception:  # dp.TooLarge, or a solver bug: the samples objective instead
        return None
    counts = {job.id: c.count for job, c in zip(problem.jobs, choices)}
    types = {job.id: c.node_type for job, c in zip(problem.jobs, choices)}
    proven = "time limit" not in how
    return _finish(problem, counts, types, how, proven, "OPTIMAL" if proven else "time limit: best found",
                   tables=all_tables)


def _due(problem: Problem, objective: Objective, time_limit_s: float, clock: Clock | None = None,
         share_cost: float = shares.COST) -> Allocation | None:
    """The objective's optimum among the answers that run the due jobs first (:mod:`.due`); None where a knapsack
    inside it is too large or the solver fails (the objective alone answers then: a decision is never lost to the
    rule)."""
    all_tables = value_tables(problem)
    capacities = {t: len(ns) for t, ns in problem.pool.by_type().items()} or {DEFAULT_TYPE: 0}
    tables = [{t.node_type: t.values for t in job_tables if t.node_type in capacities}
              or {next(iter(capacities)): job_tables[0].values[:1]}
              for job_tables in all_tables]
    jobs = problem.jobs
    groups = [j.group for j in jobs] if objective is Objective.SHARE else None
    # keeps its nodes until it reports
    measuring = [current_rate(job, held) >= MEASURING_RATE for job, held in zip(jobs, problem.held_counts)]
    try:
        choices, _, how = due.solve(tables, [i for i, j in enumerate(jobs) if j.due], capacities, time_limit_s,
                                    groups, measuring, clock, share_cost)
    except Exception:  # dp.TooLarge, or a solver bug
        return None
    counts = {job.id: c.count for job, c in zip(jobs, choices)}
    types = {job.id: c.node_type for job, c in zip(jobs, choices)}
    proven = "time limit" not in how
    return _finish(problem, counts, types, how, proven, "OPTIMAL" if proven else "time limit: best found",
                   tables=all_tables)


def _explore(problem: Problem, answer: Allocation, clock: Clock | None = None) -> Allocation:
    """Hand out again, this time valuing growth by the optimistic curves, every node the first stage does
    not keep for the job that holds it: the nodes nobody holds and the nodes it took from their jobs.

    What the first stage decided for the jobs that hold nodes (keep, shrink,
    stop) stands, so exploring never evicts or shrinks a measured job; the
    nodes it frees and the nodes nobody holds are re-decided among the first
    stage's growth, jobs never measured (worth measuring first) and measured
    jobs growing along their optimistic curves (DP per node type). A node the
    first stage took from a job to give to another is never left idle: it is
    in what is handed out.
    """
    if len(problem.pool.by_type()) > 1 and any(len(j.node_types) > 1 for j in problem.jobs):
        return _explore_typed(problem, answer, clock)
    counts, types = dict(answer.counts), dict(answer.node_type)
    changed = False
    held_all = problem.held_counts  # each job's {type: count}, only counts > 0
    for node_type, nodes in problem.pool.by_type().items():
        kept = 0
        candidates, bases, helds = [], [], []
        for job, held_types in zip(problem.jobs, held_all):
            t, n = types.get(job.id), counts.get(job.id, 0)
            held = held_types.get(node_type, 0)
            if job.due and n > 0:  # given its place by the rule (:mod:`.due`): that stands
                kept += n if t == node_type else 0
                continue
            if t == node_type:
                kept += min(n, held)
            elif t is not None or node_type not in job.throughput:
                continue
            base = min(n, held) if t == node_type else 0
            if (held and base < held) or len(held_types) > (1 if held else 0):
                continue  # shrunk or stopped by the first stage, or running on another type: no growth here
            candidates.append(job)
            bases.append(base)
            helds.append(held_types)
        room = len(nodes) - kept
        if room <= 0 or not candidates:
            continue
        tables = exploration_tables(problem, candidates, node_type, bases, room, helds)
        try:
            extra, _ = dp.solve(tables, room)
        except dp.TooLarge:
            continue  # exploring is a bonus: never worth a slow decision
        for job, base, k in zip(candidates, bases, extra):
            if base + k != counts.get(job.id, 0) or (k and types.get(job.id) != node_type):
                changed = True
            counts[job.id] = base + k
            types[job.id] = node_type if base + k > 0 else None
    if not changed:
        return answer
    explored = _finish(problem, counts, types, answer.method + "+explore", answer.optimal, answer.note)
    return explored if explored.method.endswith("+explore") else answer


def _explore_typed(problem: Problem, answer: Allocation, clock: Clock | None = None) -> Allocation:
    """The second stage where jobs choose among node types: the nodes the first stage does not keep for the jobs
    that hold them are handed out again, all types at once (the exact typed solver), among growth of jobs on
    the type they run on, jobs not running (measured first where predicted best) and moves of running jobs to a
    type they have not measured, valued by their optimistic curve there against what they have now. What the
    first stage decided for the jobs that hold nodes stands (keep, shrink, stop, move), so exploring never evicts
    or shrinks a measured job; a job moved by the first stage keeps the nodes it was given."""
    counts, types = dict(answer.counts), dict(answer.node_type)
    pool = problem.pool.by_type()
    room = {t: len(ns) for t, ns in pool.items()}
    stay_tables = None
    candidates: list[tuple] = []  # (job, base type or None, base count, {type: table})
    fixed: list = []
    for job in problem.jobs:
        held = problem.held_by_type(job)
        t_now = types.get(job.id)
        n_now = counts.get(job.id, 0)
        running = next(iter(held)) if len(held) == 1 else None
        if job.due and n_now > 0:
            fixed.append(job)  # given its place by the rule (:mod:`.due`): that stands
            continue
        if held and (running is None or t_now not in (None, running) or n_now < held.get(running, 0)):
            fixed.append(job)  # shrunk, stopped or moved by the first stage: that stands
            continue
        # A job running where it is keeps what it holds (its growth is re-decided here); one not running, or started
        # by the first stage, is re-decided from nothing.
        candidates.append((job, running, held[running]) if running is not None else (job, None, 0))
    for job in fixed:
        if counts.get(job.id, 0) > 0:
            room[types[job.id]] -= counts[job.id]
    for job, running, base in candidates:
        if running is not None:
            room[running] -= base
    if all(r <= 0 for r in room.values()):
        return answer
    found: list[dict[str, np.ndarray]] = [{} for _ in candidates]
    # type -> (candidate, job, base) valued by growth there: one batch per type
    growing: dict[str, list[tuple[int, Job, int]]] = {}
    for i, (job, running, base) in enumerate(candidates):
        for t in job.node_types:
            if room.get(t, 0) <= 0:
                continue
            if running is not None and running != t:
                if stay_tables is None:
                    stay_tables = {id(j): ts for j, ts in zip(problem.jobs, value_tables(problem))}
                stay = next(tb for tb in stay_tables[id(job)] if tb.node_type == running).values
                found[i][t] = hop_table(problem, job, t, room[t], float(stay[min(base, len(stay) - 1)]))
            else:  # grows where it runs, or starts from nothing
                growing.setdefault(t, []).append((i, job, base if running == t else 0))
    for t, items in growing.items():
        rows = exploration_tables(problem, [job for _, job, _ in items], t, [base for _, _, base in items], room[t])
        for (i, _, _), row in zip(items, rows):
            found[i][t] = row  # (−inf past the job's own cap: the batch's rows are as wide as its widest)
    tables = [{t: mine[t] for t in job.node_types if t in mine} or {next(iter(room)): np.zeros(1)}
              for (job, _, _), mine in zip(candidates, found)]
    capacities = {t: max(0, r) for t, r in room.items()}
    try:
        choices, _, _ = typed.solve(tables, capacities, EXPLORE_TIME_S, milp=False, clock=clock)
    except (dp.TooLarge, ValueError):
        return answer  # exploring is a bonus: never worth a slow or failed decision
    changed = False
    for (job, running, base), c in zip(candidates, choices):
        if running is not None and c.node_type in (None, running):
            new_n, new_t = base + c.count, running if base + c.count > 0 else None
        else:
            new_n, new_t = (c.count, c.node_type) if c.count > 0 else (base, running if base else None)
        if new_n != counts.get(job.id, 0) or new_t != types.get(job.id):
            changed = True
        counts[job.id], types[job.id] = new_n, new_t
    if not changed:
        return answer
    explored = _finish(problem, counts, types, answer.method + "+explore", answer.optimal, answer.note)
    return explored if explored.method.endswith("+explore") else answer


def _greedy(problem: Problem, method: str, optimal: bool, note: str = "") -> Allocation:
    counts, types = greedy.solve(problem)
    return _finish(problem, counts, types, method, optimal, note)


def _finish(problem: Problem, counts, types, method: str, optimal: bool, note: str, assignment=None,
            tables=None) -> Allocation:
    counts = dict(counts)
    types = {j: (t if counts.get(j, 0) > 0 else None) for j, t in types.items()}
    if assignment is None:
        assignment = Assignment(problem, counts, types)  # nodes named when first read
    value = objective_of(problem, counts, types, tables)
    if not np.isfinite(value):  # an incumbent the model should never have produced
        return _greedy(problem, "greedy", optimal=False, note=f"{method} gave an infeasible answer")
    return Allocation(counts=counts, node_type=types, assignment=assignment, objective=value, method=method,
                      optimal=optimal, note=note)

"""What each node count is worth to each job: the tables every formulation optimises.

BFTrainer's objective for job j going from c to n nodes is

    w_j · ( T_fwd · M_j(n)  −  [n > c]·cost_up_j · M_j(c)  −  [n < c]·cost_down_j · M_j(c) )

with M_j the metric (throughput unless the job names another curve) and the
rescale loss charged at the job's current rate. The objective is separable, so
it is tabulated once per (job, node type) for n = 0 … cap; the DP, the greedy
fallback and both MILPs read the same table. Three refinements over BFTrainer:
a job earns only while it still runs — for the time it needs to finish at
n nodes, or at its current size for any n below that, when that is shorter
than the horizon — so growing a job about to finish is not worth a rescale,
yet no job is shrunk for being near its end (a job that finishes sooner frees
its nodes sooner); remaining work is an estimate, not a result — a job that has not
returned keeps at least its minimum size's worth over the horizon, so a job
near (or past) its declared total still gets nodes to finish on; and a job
whose current count is below its minimum has rate 0. A job
that holds nodes of one type may keep, grow or shrink there, or stop; or move
to another type, which is a stop and a start: its table there charges what
stopping charges (``scale_down_cost_s`` and ``restart_cost_s`` at its current
rate), so a job moves only when the other type's gain over the horizon pays
for that. Every table of a job has the same value at 0 nodes: stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .problem import Job, Problem, ScalingCurve, compress_linear

INFEASIBLE = -math.inf


@dataclass(frozen=True)
class ValueTable:
    """Worth of job ``job`` on ``node_type`` at n = 0 … len(values)-1 nodes (−inf: not allowed)."""

    job: Job
    node_type: str
    current: int
    values: np.ndarray

    @property
    def cap(self) -> int:
        return len(self.values) - 1

    @property
    def only_zero(self) -> bool:
        """True when the job cannot run on this type at all now."""
        return not np.isfinite(self.values[1:]).any()

    def feasible_counts(self) -> np.ndarray:
        return np.flatnonzero(np.isfinite(self.values))

    def breakpoints(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Corners of the table as a piecewise-linear curve over 0…cap (for SOS2 models).

        The infeasible gap 1…min−1 is bridged linearly (the models forbid it by
        bounds), so only real corners remain.
        """
        v = self.values.copy()
        lo = self.job.min_nodes
        if lo > 1 and lo <= self.cap:
            v[1:lo] = np.interp(np.arange(1, lo), [0, lo], [v[0], v[lo]])
        elif lo > self.cap:
            v = v[:1]
        if len(v) == 1:
            return (0,), (float(v[0]),)
        return compress_linear(list(range(len(v))), [float(x) for x in v])


def current_rate(job: Job, held: dict[str, int]) -> float:
    """The job's metric rate at its current nodes (0 when it is not running validly)."""
    types = [t for t, c in held.items() if c > 0]
    if len(types) != 1:
        return 0.0
    t = types[0]
    c = held[t]
    if c < job.min_nodes or c > job.max_nodes or t not in job.throughput:
        return 0.0
    return job.metric(t).at(c)


def worth_per_node(job: Job) -> tuple[float, float]:
    """Upper bounds on what a job holding no nodes gains per node per second of horizon, over every count it may run
    on and every node type: by the curve the first stage values (weight × metric(n) / n), and by the one exploring
    values (its optimistic curve where it has one): how the controller ranks a long queue of waiting jobs."""
    confirmed = explored = 0.0
    for t in job.throughput:
        metric = job.metric(t).best_per_node(job.max_nodes)
        confirmed = max(confirmed, metric)
        explore = job.explore.get(t) if job.explore is not None else None
        explored = max(explored, explore.best_per_node(job.max_nodes) if explore is not None else metric)
    return job.weight * confirmed, job.weight * explored


def value_tables(problem: Problem) -> list[list[ValueTable]]:
    """One list of tables per job (one table per node type it can use), in job order: views of the rows of
    :func:`value_matrices`, made once per problem (a problem is immutable; the stages of one decision share them),
    read-only. The DP reads the matrices alone and never makes these (a thousand jobs' worth of small objects)."""
    cached = problem.__dict__.get("_value_tables")
    if cached is None:
        matrices = value_matrices(problem)
        pool_sizes = {t: len(ns) for t, ns in problem.pool.by_type().items()}
        rows: dict[tuple[int, str], np.ndarray] = {}
        for t, (members, matrix) in matrices.items():
            size = pool_sizes.get(t, 0)
            for i, row in zip(members, matrix):
                rows[(i, t)] = row[: min(problem.jobs[i].max_nodes, size) + 1]
        cached = problem.__dict__["_value_tables"] = [
            [ValueTable(job, t, problem.held_by_type(job).get(t, 0), rows[(i, t)]) for t in job.throughput]
            for i, job in enumerate(problem.jobs)
        ]
    return cached


def value_matrices(problem: Problem) -> dict[str, tuple[list[int], np.ndarray]]:
    """What each count is worth to each job, per node type, as one matrix of the jobs that can use the type (their
    indices, and one row each, −inf past a job's cap; computed for all jobs at once, one array operation per term,
    not one per job: at whole-machine scale a decision weighs hundreds of jobs). Made once per problem, read-only."""
    cached = problem.__dict__.get("_value_matrices")
    if cached is None:
        cached = problem.__dict__["_value_matrices"] = _value_matrices(problem)
        for _, matrix in cached.values():
            matrix.flags.writeable = False
    return cached


def _value_matrices(problem: Problem) -> dict[str, tuple[list[int], np.ndarray]]:
    pool_sizes = {t: len(ns) for t, ns in problem.pool.by_type().items()}
    held = problem.held_counts
    by_type: dict[str, list[int]] = {}
    for i, job in enumerate(problem.jobs):
        for t in job.throughput:
            by_type.setdefault(t, []).append(i)
    matrices: dict[str, tuple[list[int], np.ndarray]] = {}
    for t, members in by_type.items():
        jobs = [problem.jobs[i] for i in members]
        size = pool_sizes.get(t, 0)
        caps = [min(job.max_nodes, size) for job in jobs]
        current = [held[i].get(t, 0) for i in members]
        # The rate now (:func:`current_rate`): by its metric on this type, within its bounds, and on no other type
        # (else it is not running validly): read from the row's own table by :func:`_batch`, not job by job.
        only_here = [c > 0 and len(held[i]) == 1 for i, c in zip(members, current)]
        matrix = _batch(jobs, t, caps, current, None, problem.t_fwd, only_here=only_here)
        # A job running on another type gets here by a stop (what stopping loses, at its rate now) and a start: the
        # row was made as for a job not running anywhere, so the stop is charged on every count, 0 (stopping) included.
        moving = [k for k, i in enumerate(members) if held[i] and (len(held[i]) > 1 or t not in held[i])]
        if moving:
            loss = [jobs[k].weight * (jobs[k].scale_down_cost_s + jobs[k].restart_cost_s)
                    * current_rate(jobs[k], held[members[k]]) for k in moving]
            matrix[moving] -= np.array(loss)[:, None]
        matrices[t] = (members, matrix)
    return matrices


def exploration_tables(problem: Problem, jobs: list[Job], node_type: str, bases: list[int], free: int,
                       held_of: list[dict[str, int]] | None = None) -> np.ndarray:  # fmt: skip
    """What adding k = 0 … ``free`` nodes of ``node_type`` to each job's base count is worth (−inf where
    base + k is not allowed), one row per job: by its optimistic curve if it has one, else by its curve. The
    second stage of :func:`..solve.allocate`. ``held_of``: each job's :meth:`.Problem.held_by_type`, where the caller
    has them."""
    curves, caps, current, only_here = [], [], [], []
    if held_of is None:
        held_of = [problem.held_by_type(job) for job in jobs]
    for job, base, held in zip(jobs, bases, held_of):
        explore = job.explore.get(node_type) if job.explore is not None else None
        curve = explore if explore is not None else job.metric(node_type)
        curves.append((curve, explore if explore is not None else job.throughput[node_type]))
        caps.append(max(base, min(job.max_nodes, base + free)))
        c = held.get(node_type, 0)
        current.append(c)
        only_here.append(c > 0 and len(held) == 1)  # held: the types it holds nodes of
    if not jobs:
        return np.zeros((0, 1))
    # A rescale costs time at the rate the job has now: by the same curve that values the growth (the confirmed
    # one is flat past the sizes measured, and would make growing from an unmeasured size look cheap): read from
    # the rows :func:`_batch` makes of that curve.
    matrix = _batch(jobs, node_type, caps, current, None, problem.t_fwd, curves, only_here=only_here)
    base = np.asarray(bases)
    cap = np.asarray(caps)
    k = np.arange(max(0, int((cap - base).max())) + 1)
    at = base[:, None] + k[None, :]  # the count each column stands for
    rows = np.arange(len(jobs))[:, None]
    out = matrix[rows, np.minimum(at, matrix.shape[1] - 1)] - matrix[rows[:, 0], base][:, None]
    out[at > cap[:, None]] = INFEASIBLE
    out[:, 0] = 0.0
    return out


def hop_table(problem: Problem, job: Job, node_type: str, free: int, stay: float) -> np.ndarray:
    """What moving ``job`` (running on another type) to 0 … ``free`` nodes of ``node_type`` is worth against ``stay``
    (its value where it is): by its optimistic curve there, less what the stop costs (−inf where not allowed; 0 at 0:
    it stays). Exploring a type it has not run on (:func:`..solve.allocate`'s second stage, on free nodes only)."""
    explore = job.explore.get(node_type) if job.explore is not None else None
    curve = explore if explore is not None else job.metric(node_type)
    cap = min(job.max_nodes, free)
    if cap < job.min_nodes:
        return np.zeros(1)
    row = _batch([job], node_type, [cap], [0], [0.0], problem.t_fwd,
                 [(curve, explore if explore is not None else job.throughput[node_type])])[0]
    loss = job.weight * (job.scale_down_cost_s + job.restart_cost_s) * current_rate(job, problem.held_by_type(job))
    out = row - loss - stay
    out[0] = 0.0
    return out


def exploration_table(problem: Problem, job: Job, node_type: str, base: int, free: int) -> np.ndarray:
    """:func:`exploration_tables` for one job."""
    return exploration_tables(problem, [job], node_type, [base], free)[0]


def _batch(jobs: list[Job], node_type: str, caps: list[int], current: list[int], rate_now: list[float] | None,
           t_fwd: float, curves: list[tuple[ScalingCurve, ScalingCurve]] | None = None,
           only_here: list[bool] | None = None) -> np.ndarray:
    """Value rows for ``jobs`` on ``node_type`` at n = 0 … cap_j (one row each; −inf past a job's cap).

    ``curves``: (metric, throughput) per job instead of the job's own (exploring values growth by the optimistic curve).
    ``rate_now`` None: each job's rate now is its metric at its current count, where it holds nodes of this type only
    (``only_here``) within its bounds, else 0 (:func:`current_rate`), read from the metric's rows made here.

    Row j is w_j·(gain_j(n) − penalty_j(n)) with gain the metric over the time
    the job still runs (its remaining work at n nodes, or at its current size
    for any n below it; never less than its minimum size's worth over the
    horizon) and penalty the rescale or restart cost at its current rate.
    """
    J, W = len(jobs), max(caps) + 1
    n = np.arange(W)
    cap_a = np.asarray(caps)
    if curves is None:
        curves = [(job.metric(node_type), job.throughput[node_type]) for job in jobs]
    same = all(m is t for m, t in curves)  # the metric is the throughput (no objective): one table per job, not two
    if all(c == caps[0] for c in caps):  # the usual case: one width for all
        metric = np.array([m.table(caps[0]) for m, _ in curves]).reshape(J, W)
        thr = metric if same else np.array([t.table(caps[0]) for _, t in curves]).reshape(J, W)
    elif (W - 1 <= (top := max(job.max_nodes for job in jobs))
          and (top < 2 * W + 64 or all(job.max_nodes == top for job in jobs))):
        # every curve's table up to the jobs' largest maximum, cut to the widest cap, one array for all (what lies past
        # a job's cap is never read: made −inf below). Rows are not copied one by one into a matrix, and a curve's
        # table is made once whatever the room (exploring: each job's cap its base plus the room). Of jobs of different
        # maxima only when bounded, so that a job that may take the whole machine does not tabulate every other curve
        # that far.
        metric = np.array([m.table(top) for m, _ in curves]).reshape(J, top + 1)[:, :W]
        thr = metric if same else np.array([t.table(top) for _, t in curves]).reshape(J, top + 1)[:, :W]
    else:  # each row a prefix of its curve's table up to the job's maximum (made once per curve, whatever the room)
        metric, thr = np.zeros((J, W)), np.zeros((J, W))
        for j, ((m, t), cap, job) in enumerate(zip(curves, caps, jobs)):
            metric[j, : cap + 1] = m.table(max(cap, job.max_nodes))[: cap + 1]
            thr[j, : cap + 1] = t.table(max(cap, job.max_nodes))[: cap + 1]
    lo, hi, remaining, up, down, restart, weight = np.array(
        [(job.min_nodes, job.max_nodes, job.remaining_samples, job.scale_up_cost_s, job.scale_down_cost_s,
          job.restart_cost_s, job.weight) for job in jobs],
        dtype=float,
    ).reshape(J, 7).T
    lo = lo.astype(int)
    cur = np.asarray(current)
    rows = np.arange(J)
    floor = t_fwd * thr[rows, np.minimum(lo, cap_a)]  # not returned: worth its minimum at least
    remaining = np.where(np.isinf(remaining), np.inf, np.maximum(remaining, floor))
    ref_at = np.where(cur >= lo, np.minimum(cur, cap_a), 0)  # below its size: as long as at its size
    ref = thr[rows[:, None], np.minimum(np.maximum(n[None, :], ref_at[:, None]), cap_a[:, None])]
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.where(ref > 0, np.minimum(t_fwd, remaining[:, None] / ref), t_fwd)
    gain = metric * busy
    if rate_now is None:
        valid = np.asarray(only_here, dtype=bool) & (cur >= lo) & (cur <= hi)
        rate = np.where(valid & (cur <= cap_a), metric[rows, np.minimum(cur, cap_a)], 0.0)
        # held past the row (exploring a smaller base): off the curve
        for j in np.flatnonzero(valid & (cur > cap_a)).tolist():
            rate[j] = curves[j][0].at(int(cur[j]))
    else:
        rate = np.asarray(rate_now, dtype=float)
    penalty = np.where(n[None, :] > cur[:, None], (up * rate)[:, None],
                       np.where(n[None, :] < cur[:, None], (down * rate)[:, None], 0.0))
    penalty[:, 0] += np.where(cur > 0, restart * rate, 0.0)  # stopping loses work since the last commit and a restart
    gain[:, 0] = 0.0  # not running earns nothing, whatever the curve says at 0
    values = weight[:, None] * (gain - penalty)
    values[(n[None, :] >= 1) & (n[None, :] < np.minimum(lo, cap_a + 1)[:, None])] = INFEASIBLE
    values[n[None, :] > cap_a[:, None]] = INFEASIBLE
    return values


def _table(job: Job, node_type: str, cap: int, current: int, rate_now: float, t_fwd: float) -> ValueTable:
    """One job's table (the reference for :func:`_batch`, kept for tests and single-job callers)."""
    values = _batch([job], node_type, [cap], [current], [rate_now], t_fwd)[0]
    return ValueTable(job=job, node_type=node_type, current=current, values=values)

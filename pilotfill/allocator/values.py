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
that holds nodes of one type may keep, grow or shrink there, or stop — never
jump to another type in one decision, which would be migration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .problem import Job, Problem, compress_linear

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


def value_tables(problem: Problem) -> list[list[ValueTable]]:
    """One list of tables per job (one table per node type it can use), in job order."""
    pool_sizes = {t: len(ns) for t, ns in problem.pool.by_type().items()}
    out: list[list[ValueTable]] = []
    for job in problem.jobs:
        held = problem.held_by_type(job)
        rate_now = current_rate(job, held)
        on = {t for t, c in held.items() if c > 0}
        tables = []
        for t in job.node_types:
            cap = min(job.max_nodes, pool_sizes.get(t, 0))
            table = _table(job, t, cap, held.get(t, 0), rate_now, problem.t_fwd)
            if on and t not in on:
                table.values[1:] = INFEASIBLE  # moving to another type would be migration: stop first
            tables.append(table)
        out.append(tables)
    return out


def exploration_table(problem: Problem, job: Job, node_type: str, base: int, free: int) -> np.ndarray:
    """What adding k = 0 … ``free`` nodes of ``node_type`` to ``job``'s ``base`` is worth (−inf where
    base + k is not allowed): by its optimistic curve if it has one, else by its curve. The second
    stage of :func:`..solve.allocate`."""
    held = problem.held_by_type(job)
    cap = min(job.max_nodes, base + free)
    if cap <= base:
        return np.zeros(1)
    curves = job.explore if job.explore is not None and node_type in job.explore else None
    valued = job if curves is None else Job(job.id, job.min_nodes, job.max_nodes, curves, job.scale_up_cost_s, job.scale_down_cost_s,
                                            job.remaining_samples, job.weight, None, None, job.restart_cost_s)  # fmt: skip
    # A rescale costs time at the rate the job has now: by the same curve that values the growth (the confirmed
    # one is flat past the sizes measured, and would make growing from an unmeasured size look cheap).
    full = _table(valued, node_type, cap, held.get(node_type, 0), current_rate(valued, held), problem.t_fwd).values
    out = full[base:] - full[base]
    out[0] = 0.0
    return out


def _table(job: Job, node_type: str, cap: int, current: int, rate_now: float, t_fwd: float) -> ValueTable:
    n = np.arange(cap + 1)
    metric = job.metric(node_type).table(cap)
    if math.isinf(job.remaining_samples):
        gain = t_fwd * metric
    else:
        thr = job.throughput[node_type].table(cap)
        lowest = min(job.min_nodes, cap)
        remaining = max(job.remaining_samples, t_fwd * thr[lowest])  # not returned: worth its minimum at least
        ref = thr[np.maximum(n, min(current, cap) if current >= job.min_nodes else 0)]  # below its size: as long as at its size
        with np.errstate(divide="ignore", invalid="ignore"):
            busy = np.where(ref > 0, np.minimum(t_fwd, remaining / ref), t_fwd)
        gain = metric * busy
    penalty = np.where(n > current, job.scale_up_cost_s * rate_now, 0.0)
    penalty = np.where(n < current, job.scale_down_cost_s * rate_now, penalty)
    if current > 0:
        penalty[0] += job.restart_cost_s * rate_now  # stopping loses work since the last commit and a restart
    gain[0] = 0.0  # not running earns nothing, whatever the curve says at 0
    values = job.weight * (gain - penalty)
    values[1 : min(job.min_nodes, cap + 1)] = INFEASIBLE
    return ValueTable(job=job, node_type=node_type, current=current, values=values)

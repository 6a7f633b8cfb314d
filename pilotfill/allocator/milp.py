"""The aggregated MILP: one integer node count per job and node type (python-mip, CBC).

With identical nodes any vector of counts that fits can be realised without
migration (see :mod:`.moves`), so BFTrainer's per-node binaries are not needed
to reach its optimum. Each count n_jt carries its value through an SOS2
piecewise-linear curve over the corners of the job's value table (exact at
integer counts, rescale loss included); a binary y_jt says the job runs on
type t, with min_j·y ≤ n ≤ max_j·y and at most one type per job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import mip

from .problem import Problem
from .values import ValueTable, value_tables


@dataclass
class CurveVars:
    """The variables that model one value table in a MILP."""

    table: ValueTable
    count: mip.Var | mip.LinExpr | int
    runs: mip.Var | int
    value: mip.LinExpr | float


@dataclass(frozen=True)
class MilpResult:
    """Counts and types per job (None when the solver found nothing usable)."""

    counts: dict[str, int] | None
    types: dict[str, str | None] | None
    optimal: bool
    status: str


TIE_BREAK = 1e-9
"""Relative worth of one node: among equal optima, prefer fewer nodes (leave them to the main workload)."""


@contextmanager
def quiet_solver() -> Iterator[None]:
    """CBC prints some messages (Coin0505I, …) straight to file descriptor 1 whatever ``verbose`` says;
    keep them off stdout, where ``--json`` output and live views go."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def optimize(m: mip.Model, curves_by_job: Sequence[Sequence[CurveVars]]) -> mip.OptimizationStatus:
    """Maximise the tables' value, ties to fewer nodes; a model with nothing to decide is optimal at once."""
    counts = [c.count for curves in curves_by_job for c in curves if not isinstance(c.count, int)]
    if not counts:
        return mip.OptimizationStatus.OPTIMAL
    scale = max((abs(float(v)) for curves in curves_by_job for c in curves for v in c.table.values
                 if abs(v) != float("inf")), default=1.0)
    m.objective = mip.maximize(mip.xsum(c.value for curves in curves_by_job for c in curves)
                               - TIE_BREAK * max(scale, 1.0) * mip.xsum(counts))
    with quiet_solver():
        return m.optimize()


def new_model(time_limit_s: float, solver: str = mip.CBC) -> mip.Model:
    m = mip.Model(sense=mip.MAXIMIZE, solver_name=solver)
    m.verbose = 0
    m.threads = 1
    m.max_mip_gap = 1e-9
    m.max_mip_gap_abs = 1e-7
    m.max_seconds = time_limit_s
    return m


def add_curve(m: mip.Model, table: ValueTable, count: mip.LinExpr | None = None) -> CurveVars:
    """Model ``table`` in ``m``: returns the count, the runs-on-this-type binary and the value.

    ``count`` lets a caller (the node-level model) supply its own count
    expression; otherwise an integer variable is created.
    """
    job = table.job
    if table.only_zero:
        if isinstance(count, mip.LinExpr) and count.expr:
            m += count == 0
        return CurveVars(table, 0, 0, 0.0)
    xs, vs = table.breakpoints()
    # Relative to stopping: every table of a job has the stop value at 0 nodes, and a job's value is counted once
    # whichever type it runs on (a constant per job changes no decision).
    vs = tuple(v - float(table.values[0]) for v in vs)
    n = m.add_var(var_type=mip.INTEGER, lb=0, ub=table.cap) if count is None else count
    y = m.add_var(var_type=mip.BINARY)
    lam = [m.add_var(lb=0.0, ub=1.0) for _ in xs]
    m += mip.xsum(lam) == 1
    m += n == mip.xsum(x * l for x, l in zip(xs, lam))
    m += n >= job.min_nodes * y
    m += n <= table.cap * y
    if len(lam) > 2:
        m.add_sos([(l, float(x)) for l, x in zip(lam, xs)], 2)
    return CurveVars(table, n, y, mip.xsum(v * l for v, l in zip(vs, lam)))


def one_type_per_job(m: mip.Model, curves: Sequence[CurveVars]) -> None:
    runs = [c.runs for c in curves if not isinstance(c.runs, int)]
    if len(runs) > 1:
        m += mip.xsum(runs) <= 1


def read_counts(curves_by_job: Sequence[Sequence[CurveVars]]) -> tuple[dict[str, int], dict[str, str | None]]:
    counts: dict[str, int] = {}
    types: dict[str, str | None] = {}
    for curves in curves_by_job:
        job = curves[0].table.job
        counts[job.id], types[job.id] = 0, None
        for c in curves:
            n = c.count if isinstance(c.count, int) else c.count.x
            if n is not None and round(n) > 0:
                counts[job.id], types[job.id] = int(round(n)), c.table.node_type
    return counts, types


def solve(problem: Problem, time_limit_s: float = 1.0, solver: str = mip.CBC) -> MilpResult:
    """Solve the aggregated model; on a time limit return the incumbent if there is one."""
    tables = value_tables(problem)
    m = new_model(time_limit_s, solver)
    curves_by_job = [[add_curve(m, t) for t in job_tables] for job_tables in tables]
    for curves in curves_by_job:
        one_type_per_job(m, curves)
    for node_type, nodes in problem.pool.by_type().items():
        counts = [c.count for curves in curves_by_job for c in curves
                  if c.table.node_type == node_type and not isinstance(c.count, int)]
        if counts:
            m += mip.xsum(counts) <= len(nodes)
    status = optimize(m, curves_by_job)
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return MilpResult(None, None, False, status.name)
    counts, types = read_counts(curves_by_job)
    return MilpResult(counts, types, status == mip.OptimizationStatus.OPTIMAL, status.name)

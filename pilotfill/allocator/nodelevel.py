"""BFTrainer's node-level formulation, kept as a baseline and a cross-check. Never used for decisions.

From the paper: a binary x_jv per job j and node v (v runs j); each node runs
at most one job; each job runs on 0 or between its min and max nodes; no
migration — a job may add nodes or drop nodes in one decision, never both;
the objective is forward progress over T_fwd minus the progress lost to
rescaling at the job's current rate. Here the no-migration rule is written
with one binary g_j per job (g_j = 1: keeps every node it holds and may add;
g_j = 0: adds none and may drop), and the curve and rescale loss come from the
same value tables as the aggregated model. With several node types a job may
also move to another type, which is a stop and a start (a binary m_j: it drops
every node it holds and takes nodes of another type only), charged as the
value tables charge it. It has J·V binaries, which is why
it takes seconds at 128 nodes while the aggregated model takes milliseconds;
CBC may also overrun the time limit in its root processing at large sizes,
one more reason it is only a baseline.
"""

from __future__ import annotations

import mip

from .milp import MilpResult, add_curve, new_model, one_type_per_job, optimize
from .problem import Problem
from .values import value_tables


def solve(problem: Problem, time_limit_s: float = 60.0,
          solver: str = mip.CBC) -> tuple[MilpResult, dict[str, tuple[str, ...]] | None]:
    """Solve node by node; returns counts/types and the concrete nodes per job."""
    tables = value_tables(problem)
    pool = problem.pool
    by_type = pool.by_type()
    m = new_model(time_limit_s, solver)
    x: dict[tuple[str, str], mip.Var] = {}
    curves_by_job = []
    for job, job_tables in zip(problem.jobs, tables):
        held = problem.current.get(job.id, frozenset())
        held_types = {pool.type_of(v) for v in held}
        grow = m.add_var(var_type=mip.BINARY)
        move = m.add_var(var_type=mip.BINARY) if held else 0
        if held:
            m += grow + move <= 1
        curves = []
        for table in job_tables:
            nodes = by_type.get(table.node_type, [])
            xs = [m.add_var(var_type=mip.BINARY) for _ in nodes]
            elsewhere = bool(held) and table.node_type not in held_types
            for v, var in zip(nodes, xs):
                x[job.id, v] = var
                if v in held:
                    m += var >= grow  # growing keeps every node held
                    m += var <= 1 - move  # moving drops them all
                elif elsewhere:
                    m += var <= move  # another type's nodes only by moving there
                else:
                    m += var <= grow  # shrinking takes no new node
            curves.append(add_curve(m, table, mip.xsum(xs) if xs else mip.LinExpr()))
        one_type_per_job(m, curves)
        curves_by_job.append(curves)
    for v in pool.nodes:
        users = [x[j.id, v] for j in problem.jobs if (j.id, v) in x]
        if len(users) > 1:
            m += mip.xsum(users) <= 1
    status = optimize(m, curves_by_job)
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return MilpResult(None, None, False, status.name), None
    assignment = {j.id: tuple(v for v in pool.nodes if (j.id, v) in x and x[j.id, v].x > 0.5) for j in problem.jobs}
    counts = {j: len(vs) for j, vs in assignment.items()}
    types = {j: (pool.type_of(vs[0]) if vs else None) for j, vs in assignment.items()}
    return MilpResult(counts, types, status == mip.OptimizationStatus.OPTIMAL, status.name), assignment

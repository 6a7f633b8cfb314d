"""One entry point: ``allocate(problem)`` always returns an allocation.

The formulation is chosen as DESIGN says: the exact DP where it applies (one
node type per job), the aggregated MILP otherwise; the node-level model and
the greedy heuristic only on request. A solver that fails or runs out of time
falls back to its incumbent, else to greedy: the caller is never left without
an answer and the controller loop never stalls on a solver.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import numpy as np

from . import dp, greedy, milp, nodelevel
from .moves import realise
from .problem import Allocation, Problem
from .values import ValueTable, value_tables


class Formulation(str, Enum):
    AGGREGATED = "aggregated"  # exact: DP where it applies, MILP otherwise
    MILP = "milp"  # the aggregated MILP even where the DP applies (cross-checks)
    NODE_LEVEL = "node-level"  # BFTrainer's baseline
    GREEDY = "greedy"


def allocate(problem: Problem, formulation: Formulation | str = Formulation.AGGREGATED, time_limit_s: float = 1.0) -> Allocation:
    """Node counts and concrete nodes for every job of ``problem``."""
    formulation = Formulation(formulation)
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
        if answer is not None:
            return answer
    try:
        result = milp.solve(problem, time_limit_s)
    except Exception as exc:
        return _greedy(problem, "greedy", optimal=False, note=f"milp failed: {exc!r}")
    if result.counts is None:
        return _greedy(problem, "greedy", optimal=False, note=f"milp: {result.status}")
    return _finish(problem, result.counts, result.types, "milp", result.optimal, result.status)


def objective_of(problem: Problem, counts: Mapping[str, int], types: Mapping[str, str | None], tables: list[list[ValueTable]] | None = None) -> float:
    """The model's value of a count vector, from the same tables every method uses."""
    total = 0.0
    for job, job_tables in zip(problem.jobs, tables or value_tables(problem)):
        for t in job_tables:
            n = counts.get(job.id, 0) if types.get(job.id) == t.node_type else 0
            total += float(t.values[n]) if n <= t.cap else -np.inf
    return total


def _dp(problem: Problem) -> Allocation | None:
    """The exact DP, per node type, when every job can use exactly one type."""
    if any(len(j.node_types) != 1 for j in problem.jobs):
        return None
    all_tables = value_tables(problem)
    tables = [ts[0] for ts in all_tables]
    pool = problem.pool.by_type()
    groups: dict[str, list] = {}
    for t in tables:
        groups.setdefault(t.node_type, []).append(t)
    if not all(dp.applies([t.values for t in g], len(pool.get(nt, []))) for nt, g in groups.items()):
        return None
    counts: dict[str, int] = {}
    types: dict[str, str | None] = {}
    for node_type, group in groups.items():
        ns, _ = dp.solve([t.values for t in group], len(pool.get(node_type, [])))
        for t, n in zip(group, ns):
            counts[t.job.id] = n
            types[t.job.id] = node_type if n > 0 else None
    return _finish(problem, counts, types, "dp", True, "OPTIMAL", tables=all_tables)


def _greedy(problem: Problem, method: str, optimal: bool, note: str = "") -> Allocation:
    counts, types = greedy.solve(problem)
    return _finish(problem, counts, types, method, optimal, note)


def _finish(problem: Problem, counts, types, method: str, optimal: bool, note: str, assignment=None, tables=None) -> Allocation:
    types = {j: (t if counts.get(j, 0) > 0 else None) for j, t in types.items()}
    if assignment is None:
        assignment = realise(problem, counts, types)
    value = objective_of(problem, counts, types, tables)
    if not np.isfinite(value):  # an incumbent the model should never have produced
        return _greedy(problem, "greedy", optimal=False, note=f"{method} gave an infeasible answer")
    return Allocation(counts=dict(counts), node_type=types, assignment=assignment, objective=value, method=method, optimal=optimal, note=note)

"""From node counts to concrete nodes, without migration.

A job that keeps its count keeps its nodes; a shrinking job keeps a subset of
its own (the first by name); a growing job keeps all of its own and takes
free ones in pool order. Because every
count vector that fits the pool can be realised this way, the aggregated
models lose nothing by deciding counts only.
"""

from __future__ import annotations

from collections.abc import Mapping

from .problem import Problem, ProblemError


def realise(problem: Problem, counts: Mapping[str, int], types: Mapping[str, str | None]) -> dict[str, tuple[str, ...]]:
    """Assign concrete nodes to match ``counts`` (each job on ``types[job]``)."""
    pool = problem.pool
    kept: dict[str, list[str]] = {}
    taken: set[str] = set()
    for job in problem.jobs:
        n, t = counts.get(job.id, 0), types.get(job.id)
        held = problem.current.get(job.id, ())
        own = list(held) if not pool.types else [v for v in held if pool.type_of(v) == t]
        if n < len(own):
            own = sorted(own)[:n]  # a shrinking job keeps the first of its own by name
        kept[job.id] = own if n > 0 else []
        taken.update(kept[job.id])
    free = {}
    for t, nodes in pool.by_type().items():
        free[t] = [v for v in nodes if v not in taken]
    out: dict[str, tuple[str, ...]] = {}
    for job in problem.jobs:
        n, t = counts.get(job.id, 0), types.get(job.id)
        need = n - len(kept[job.id])
        if need > 0:
            spare = free.get(t, [])
            if need > len(spare):
                raise ProblemError(f"counts exceed the free nodes of type {t!r}")
            kept[job.id] += spare[:need]
            del spare[:need]
        out[job.id] = tuple(kept[job.id])
    return out

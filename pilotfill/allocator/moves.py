"""From node counts to concrete nodes, without migration.

A job that keeps its count keeps its nodes; a shrinking job keeps a subset of
its own (the first by name); a growing job keeps all of its own and takes
free ones in pool order. Because every
count vector that fits the pool can be realised this way, the aggregated
models lose nothing by deciding counts only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

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


class Assignment(Mapping[str, tuple[str, ...]]):
    """:func:`realise`'s answer, made when first read: a question that needs only the counts (how many nodes
    would the jobs use?) and a first stage the second one revises never pay for naming nodes."""

    def __init__(self, problem: Problem, counts: Mapping[str, int], types: Mapping[str, str | None]):
        by_type: dict[str | None, int] = {}
        for job_id, n in counts.items():
            if n > 0:
                by_type[types.get(job_id)] = by_type.get(types.get(job_id), 0) + n
        sizes = {t: len(ns) for t, ns in problem.pool.by_type().items()}
        for t, n in by_type.items():
            if n > sizes.get(t, 0):
                raise ProblemError(f"counts exceed the free nodes of type {t!r}")
        self._args: tuple | None = (problem, counts, types)
        self._nodes: dict[str, tuple[str, ...]] = {}

    def _made(self) -> dict[str, tuple[str, ...]]:
        if self._args is not None:
            self._nodes, self._args = realise(*self._args), None
        return self._nodes

    def __getitem__(self, job_id: str) -> tuple[str, ...]:
        return self._made()[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())

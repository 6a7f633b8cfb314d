"""The fallback: a fast, always-feasible answer when a solver fails or runs out of time.

Every job keeps what it holds (when that is still allowed and fits); then free
nodes go, one jump at a time, to the job whose best jump (to any larger
allowed count) gains the most per node. No solver, no failure mode, and never
worse than standing still.
"""

from __future__ import annotations

import numpy as np

from .problem import Problem
from .values import ValueTable, value_tables


def solve(problem: Problem) -> tuple[dict[str, int], dict[str, str | None]]:
    """Counts and node type per job."""
    tables = value_tables(problem)
    free = {t: len(ns) for t, ns in problem.pool.by_type().items()}
    counts: dict[str, int] = {}
    chosen: dict[str, ValueTable | None] = {}
    for job, job_tables in zip(problem.jobs, tables):
        counts[job.id], chosen[job.id] = 0, None
        for t in job_tables:
            if t.current > 0 and np.isfinite(t.values[min(t.current, t.cap)]) and t.current <= t.cap:
                if t.current <= free.get(t.node_type, 0) and t.values[t.current] >= t.values[0]:
                    counts[job.id], chosen[job.id] = t.current, t
                    free[t.node_type] -= t.current
                break
    by_id = {job.id: job_tables for job, job_tables in zip(problem.jobs, tables)}
    while True:
        best = (0.0, None, None, 0)
        for job_id, job_tables in by_id.items():
            n = counts[job_id]
            options = [chosen[job_id]] if chosen[job_id] is not None else job_tables
            for t in options:
                room = min(t.cap, n + free.get(t.node_type, 0))
                if room <= n:
                    continue
                gains = (t.values[n + 1 : room + 1] - t.values[n]) / np.arange(1, room - n + 1)
                k = int(np.argmax(gains))
                if gains[k] > best[0]:
                    best = (float(gains[k]), job_id, t, n + 1 + k)
        _, job_id, t, target = best
        if job_id is None:
            break
        free[t.node_type] -= target - counts[job_id]
        counts[job_id], chosen[job_id] = target, t
    types = {j: (t.node_type if t is not None and counts[j] > 0 else None) for j, t in chosen.items()}
    return counts, types

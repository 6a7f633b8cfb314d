"""Exact allocation on identical nodes: a multiple-choice knapsack solved by dynamic programming.

With one node type the objective is a sum of per-job tables and the only
coupling is Σ n_j ≤ N, so the optimum is a max-plus convolution of the tables:
O(N · Σ_j |choices_j|) array operations, vectorised over the capacity axis.
That answers 200 jobs on 4,654 nodes in tens of milliseconds, where the MILP
needs seconds; the MILP remains for what this cannot express (several node
types on one job).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WORK_LIMIT = 400_000_000
"""Above this many cell updates the DP is slower than the MILP; :func:`applies` says no."""


def work(tables: Sequence[np.ndarray], capacity: int) -> int:
    """Cell updates the DP would make (0 when capacity is not binding)."""
    if sum(len(t) - 1 for t in tables) <= capacity:
        return 0
    return sum(int(np.isfinite(t).sum()) for t in tables) * (capacity + 1)


def applies(tables: Sequence[np.ndarray], capacity: int) -> bool:
    return work(tables, capacity) <= WORK_LIMIT


def solve(tables: Sequence[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """Counts maximising Σ_j tables[j][n_j] subject to Σ_j n_j ≤ capacity.

    ``tables[j][n]`` is job j's worth at n nodes, −inf where n is not allowed;
    ``tables[j][0]`` must be finite (a job can always be stopped). Ties go to
    the smaller count, so nodes nobody gains from are left free.
    """
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    tables = [np.asarray(t, dtype=float) for t in tables]
    for j, t in enumerate(tables):
        if len(t) == 0 or not np.isfinite(t[0]):
            raise ValueError(f"table {j} must have a finite value at 0 nodes")
    if sum(len(t) - 1 for t in tables) <= capacity:
        counts = [int(np.argmax(t)) for t in tables]
        return counts, float(sum(t[n] for t, n in zip(tables, counts)))

    choices = [np.flatnonzero(np.isfinite(t)) for t in tables]
    rows: list[np.ndarray] = [np.zeros(1)]  # rows[j][c]: best of the first j jobs on at most c nodes
    scratch = np.empty(capacity + 1)
    for t, ks in zip(tables, choices):
        prev = rows[-1]
        reach = min(capacity, len(prev) - 1 + len(t) - 1)
        prev_ext = _extend(prev, reach + 1)
        cur = prev_ext + t[0]
        for k in ks[1:].tolist():
            if k > reach:
                break
            shifted = scratch[: reach + 1 - k]
            np.add(prev_ext[: reach + 1 - k], t[k], out=shifted)
            np.maximum(cur[k:], shifted, out=cur[k:])
        rows.append(cur)

    counts = [0] * len(tables)
    c = len(rows[-1]) - 1
    best = float(rows[-1][c])
    for j in range(len(tables) - 1, -1, -1):
        t, ks = tables[j], choices[j]
        ks = ks[ks <= c]
        prev_ext = _extend(rows[j], c + 1)
        k = int(ks[np.argmax(prev_ext[c - ks] + t[ks])])
        counts[j] = k
        c = min(c - k, len(rows[j]) - 1)
    return counts, best


def _extend(row: np.ndarray, length: int) -> np.ndarray:
    """``row`` padded with its last value: "at most c nodes" is flat past what it can use."""
    if len(row) >= length:
        return row[:length]
    return np.concatenate([row, np.full(length - len(row), row[-1])])

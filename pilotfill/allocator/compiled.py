"""The allocator's inner loops that numpy cannot vectorise well, compiled (numba).

The exact DP over the core (:func:`.dp.dense`) is a chain of max-plus
convolutions: each job's row depends on the previous job's, so numpy can
vectorise only along the capacity axis and pays a call per job and count. At
whole-machine scale under saturating demand the core holds a thousand running
jobs of ten counts each over hundreds of nodes: ten thousand numpy calls, 50–75
ms per decision. The same loop compiled does the same arithmetic (the same
additions and comparisons, in the same order: bit-identical answers) in a tenth
of that. More loops of the same solver are here for the same reason: the
jobs' concave hulls, from which the node price is read (it was sixty passes of
a bisection over every job and count, 7–15 ms of a whole-machine decision), the
choice at a price and the greedy rounding (one pass per node it places).

Compiled once per machine (numba caches the machine code beside this file, or
in the user's cache when the install is read-only): :func:`warm` loads it
before a controller's loop starts, so that no decision pays for it.
"""

from __future__ import annotations

from functools import cache
from typing import Callable

import numpy as np


def _jit(function: Callable) -> Callable:
    """numba's compiler, caching the machine code where it can (beside this file, else the user's cache); where no
    place is writable (a read-only install and home), compiled in each process instead of failing."""
    from numba import njit

    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:  # numba: "cannot cache function …: no locator available"
        return njit(nogil=True)(function)


@cache
def _knapsack() -> Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, float]]:
    """The compiled DP (numba is imported on first use, not with the allocator: a CLI that never solves never pays for it)."""
    def knapsack(flat: np.ndarray, offsets: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
        jobs = len(offsets) - 1
        prev = np.zeros(capacity + 1)
        cur = np.empty(capacity + 1)
        choice = np.zeros((jobs, capacity + 1), np.int32)  # the count job j takes at each capacity (smallest on ties)
        for j in range(jobs):
            lo = offsets[j]
            width = offsets[j + 1] - lo
            first = flat[lo]
            for c in range(capacity + 1):
                cur[c] = prev[c] + first
            for k in range(1, min(width, capacity + 1)):
                v = flat[lo + k]
                if not np.isfinite(v):
                    continue
                for c in range(k, capacity + 1):
                    x = prev[c - k] + v
                    if x > cur[c]:
                        cur[c] = x
                        choice[j, c] = k
            prev, cur = cur, prev
        counts = np.zeros(jobs, np.int64)
        c = capacity
        for j in range(jobs - 1, -1, -1):
            counts[j] = choice[j, c]
            c -= counts[j]
        return counts, prev[capacity]

    return _jit(knapsack)


@cache
def _choices() -> Callable[[np.ndarray, float, np.ndarray], int]:
    def choose(values: np.ndarray, price: float, out: np.ndarray) -> int:
        total = 0
        for j in range(values.shape[0]):
            best = -np.inf
            pick = 0
            for k in range(values.shape[1]):
                x = values[j, k] - price * k
                if x > best:
                    best = x
                    pick = k
            out[j] = pick
            total += pick
        return total

    return _jit(choose)


@cache
def _rounding() -> Callable[[np.ndarray, np.ndarray, int], None]:
    def round_up(values: np.ndarray, counts: np.ndarray, free: int) -> None:
        jobs, width = values.shape
        while free > 0:
            best = -np.inf
            bj = -1
            bk = -1
            for j in range(jobs):
                c = counts[j]
                now = values[j, c]
                for k in range(c + 1, min(width, c + free + 1)):
                    v = values[j, k]
                    if not np.isfinite(v):
                        continue
                    gain = v - now
                    if gain > 0:
                        rate = gain / (k - c)
                        if rate > best:
                            best = rate
                            bj = j
                            bk = k
            if bj < 0:
                return
            free -= bk - counts[bj]
            counts[bj] = bk

    return _jit(round_up)


@cache
def _hull_edges() -> Callable[[np.ndarray, np.ndarray, np.ndarray], int]:
    def edges(values: np.ndarray, slopes: np.ndarray, steps: np.ndarray) -> int:
        jobs, width = values.shape
        stack = np.empty(width, np.int64)
        m = 0
        for j in range(jobs):
            top = 0
            for k in range(width):
                v = values[j, k]
                if not np.isfinite(v):
                    continue
                # pop the last vertex while it is not strictly above the chord: slopes must fall strictly
                while top >= 2:
                    a, b = stack[top - 2], stack[top - 1]
                    if (values[j, b] - values[j, a]) / (b - a) <= (v - values[j, b]) / (k - b):
                        top -= 1
                    else:
                        break
                stack[top] = k
                top += 1
            for i in range(top - 1):
                a, b = stack[i], stack[i + 1]
                s = (values[j, b] - values[j, a]) / (b - a)
                if s > 0:
                    slopes[m] = s
                    steps[m] = b - a
                    m += 1
        return m

    return _jit(edges)


def hull_edges(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every job's upper concave hull of (count, value) from 0 nodes, as its edges of positive slope: (slopes, steps in
    count). At node price λ a job takes the hull vertex past every edge steeper than λ (the smaller on ties), so the
    nodes the jobs ask for at λ are the steps of the edges steeper than λ: the price at which they fit is one of these
    slopes, found by one sort instead of sixty passes over every job and count."""
    values = np.ascontiguousarray(values, dtype=float)
    slopes = np.empty(values.size, dtype=float)
    steps = np.empty(values.size, dtype=np.int64)
    m = _hull_edges()(values, slopes, steps)
    return slopes[:m], steps[:m]


def choose(values: np.ndarray, price: float) -> np.ndarray:
    """Each job's best count at node price ``price``: argmax_n values[j, n] − price·n, the smallest on ties."""
    out = np.empty(values.shape[0], dtype=np.int64)
    _choices()(np.ascontiguousarray(values, dtype=float), float(price), out)
    return out


def round_up(values: np.ndarray, counts: np.ndarray, capacity: int) -> np.ndarray:
    """A feasible answer improved greedily on the nodes it leaves free, the best gain per node first (the first
    job and smallest count on ties)."""
    counts = np.array(counts, dtype=np.int64)
    _rounding()(np.ascontiguousarray(values, dtype=float), counts, int(capacity - counts.sum()))
    return counts


def knapsack(tables: list[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """Counts maximising Σ_j tables[j][n_j] subject to Σ_j n_j ≤ capacity, and that maximum: the plain DP,
    O(capacity · Σ_j |tables[j]|). ``tables[j][0]`` is the value at zero nodes; −inf marks a count not allowed."""
    lengths = np.fromiter((len(t) for t in tables), dtype=np.int64, count=len(tables))
    offsets = np.zeros(len(tables) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(t, dtype=float) for t in tables]) if tables else np.zeros(0)
    counts, best = _knapsack()(flat, offsets, int(capacity))
    return counts.tolist(), float(best)


def knapsack_flat(flat: np.ndarray, offsets: np.ndarray, capacity: int) -> np.ndarray:
    """:func:`knapsack` over tables laid end to end in ``flat`` (table j is ``flat[offsets[j]:offsets[j + 1]]``): the counts."""
    counts, _ = _knapsack()(np.asarray(flat, dtype=float), np.asarray(offsets, dtype=np.int64), int(capacity))
    return counts


def warm() -> None:
    """Compile (or load from numba's cache) the kernel now, not in the first decision."""
    knapsack([np.array([0.0, 1.0, 1.5])], 1)
    values = np.array([[0.0, 1.0, 1.5], [0.0, 2.0, -np.inf]])
    round_up(values, choose(values, 10.0), 2)
    hull_edges(values)

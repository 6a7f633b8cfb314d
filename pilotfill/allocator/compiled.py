"""The allocator's inner loops that numpy cannot vectorise well, compiled (numba).

The exact DP over the core (:func:`.dp.dense`) is a chain of max-plus
convolutions: each job's row depends on the previous job's, so numpy can
vectorise only along the capacity axis and pays a call per job and count: at
whole-machine scale under saturating demand (a thousand running jobs of ten
counts each) ten thousand numpy calls a decision. The same loop compiled does
the same arithmetic (the same additions and comparisons, in the same order:
bit-identical answers) without those calls. Given an incumbent's value and a
node price it also keeps only the states whose Lagrangian bound reaches that
value (the same answer: see :func:`knapsack_flat`): on a whole machine with
three thousand free nodes the rows are a band of a few dozen capacities, not
three thousand. More loops of the same solver are here for the same reason: the
jobs' concave hulls, from which the node price is read (not a bisection over
every job and count), the choice at a price and the greedy rounding (one pass
per node it places).

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
def _knapsack() -> Callable[[np.ndarray, np.ndarray, int, float, float], tuple[np.ndarray, float, int]]:
    """The compiled DP (numba is imported on first use, not with the allocator: a CLI that never solves never pays
    for it)."""
    def knapsack(flat: np.ndarray, offsets: np.ndarray, capacity: int, price: float,
                 floor: float) -> tuple[np.ndarray, float, int]:
        jobs = len(offsets) - 1
        cells = 0  # the state updates made: what the floor saves
        # What the tables after j can add at most on the nodes left, at the node price (the Lagrangian bound):
        # after[j] = Σ_{i > j} max_k (table_i[k] − price·k).
        after = np.zeros(jobs + 1)
        for j in range(jobs - 1, -1, -1):
            best = -np.inf
            for k in range(offsets[j + 1] - offsets[j]):
                x = flat[offsets[j] + k] - price * k
                if x > best:
                    best = x
            after[j] = after[j + 1] + best
        prev = np.zeros(capacity + 1)
        cur = np.empty(capacity + 1)
        # The count job j takes at each capacity of its band (the smallest on ties): choice[base[j] + c], the bands end
        # to end (a whole-machine core is a thousand jobs by thousands of nodes, its bands a few dozen capacities each).
        choice = np.empty(max(16, jobs * min(capacity + 1, 64)), np.int32)
        base = np.zeros(jobs, np.int64)
        used = 0
        # The states (capacity used at most c) that can still reach the floor, at most [lo, hi]: one whose bound
        # (its value, the price of the nodes left, what the rest can add) is below the floor is in no answer as good
        # as the floor, nor is any state made from it (a state's bound never exceeds its predecessor's).
        lo, hi = 0, capacity
        while hi >= 0 and prev[hi] + price * (capacity - hi) + after[0] < floor:
            hi -= 1
        for j in range(jobs):
            if hi < lo:
                break
            start = offsets[j]
            width = offsets[j + 1] - start
            first = flat[start]
            top = min(capacity, hi + width - 1)
            if used + top - lo + 1 > len(choice):
                grown = np.empty(max(2 * len(choice), used + top - lo + 1), np.int32)
                grown[:used] = choice[:used]
                choice = grown
            base[j] = used - lo
            choice[used : used + top - lo + 1] = 0
            used += top - lo + 1
            for c in range(lo, hi + 1):
                cur[c] = prev[c] + first
            for c in range(hi + 1, top + 1):
                cur[c] = -np.inf
            for k in range(1, min(width, capacity + 1)):
                v = flat[start + k]
                if not np.isfinite(v):
                    continue
                cells += max(0, min(hi + k, capacity) + 1 - lo - k)
                for c in range(lo + k, min(hi + k, capacity) + 1):
                    x = prev[c - k] + v
                    if x > cur[c]:
                        cur[c] = x
                        choice[base[j] + c] = k
            new_lo, new_hi = top + 1, -1
            for c in range(lo, top + 1):
                if cur[c] + price * (capacity - c) + after[j + 1] < floor:
                    cur[c] = -np.inf
                elif cur[c] > -np.inf:
                    if c < new_lo:
                        new_lo = c
                    new_hi = c
            lo, hi = new_lo, new_hi
            prev, cur = cur, prev
        counts = np.zeros(jobs, np.int64)
        if hi < capacity:  # nothing reaches the floor within the capacity: the caller's floor was wrong
            return counts, -np.inf, cells
        c = capacity
        for j in range(jobs - 1, -1, -1):
            counts[j] = choice[base[j] + c]
            c -= counts[j]
        return counts, prev[capacity], cells

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
    counts, best, _ = _knapsack()(flat, offsets, int(capacity), 0.0, -np.inf)
    return counts.tolist(), float(best)


def knapsack_flat(flat: np.ndarray, offsets: np.ndarray, capacity: int, price: float = 0.0,
                  floor: float = -np.inf) -> np.ndarray:
    """:func:`knapsack` over tables laid end to end in ``flat`` (table j is ``flat[offsets[j]:offsets[j + 1]]``):
    the counts.

    Given a value ``floor`` that some answer reaches (an incumbent's, less what rounding can hide) and a node price
    ``price`` ≥ 0, the DP keeps only the states whose Lagrangian bound at that price reaches the floor: the same
    answer (every state on an optimal path, and every tie on the way, is kept), on a band of capacities around the
    optimal path instead of every capacity. ``None`` is returned where no answer reaches the floor."""
    counts, best, _ = _knapsack()(np.asarray(flat, dtype=float), np.asarray(offsets, dtype=np.int64), int(capacity),
                                  float(price), float(floor))
    return counts if best > -np.inf else None


def knapsack_cells(flat: np.ndarray, offsets: np.ndarray, capacity: int, price: float = 0.0,
                   floor: float = -np.inf) -> int:
    """The state updates :func:`knapsack_flat` makes with that floor and price (what the floor saves, for tests and
    benchmarks)."""
    return int(_knapsack()(np.asarray(flat, dtype=float), np.asarray(offsets, dtype=np.int64), int(capacity),
                           float(price), float(floor))[2])


def warm() -> None:
    """Compile (or load from numba's cache) the kernel now, not in the first decision."""
    knapsack([np.array([0.0, 1.0, 1.5])], 1)
    values = np.array([[0.0, 1.0, 1.5], [0.0, 2.0, -np.inf]])
    round_up(values, choose(values, 10.0), 2)
    hull_edges(values)

"""The typed solver's core, exactly: a search over the jobs that still hesitate between types, pruned by a bound
that is exact per type.

Given prices λ with bound UB (:mod:`.typeprices`) and a threshold θ, a solution worth at least θ pays, job by
job, a reduced cost of at most UB − θ for its choice; every other choice is dropped (fixing). What is left splits in
two: *firm* jobs, left with counts on one type at most (and maybe stopping), and *hesitant* ones, with counts on
two types or more. For the firm jobs of each type, one DP row gives their best worth on every number of nodes.

The hesitant jobs are decided one by one, breadth first: a state is how many nodes of each type the jobs decided so
far take, with the best worth reaching it (so copies of one model deciding in another order are one state). A state
is dropped when even an upper bound on its best completion is below θ. The bound is a Lagrangian decomposition by
type: the jobs not decided yet may each be counted on every type they can use, less a charge μ_j for every type
after the first (μ_j: the job's reduced worth on its second-best type at λ), and per type the best total of them
and the firm jobs on the nodes left is exact (a DP row per type and depth, computed once). That is much tighter than
the Lagrangian bound with λ alone — the knapsack per type is solved, not relaxed — and it is what keeps the states
few. At the end each state's firm jobs take the rest of each type, by their rows: the best state is the optimum
among the solutions worth at least θ.

With θ at the value of a known solution, that is the optimum; with θ above the optimum, the search proves that
nothing is worth θ. A *dive* — the same search keeping only the few states with the best bounds per level — finds
good solutions fast (:func:`.typed.solve` chooses the thresholds and uses the dives).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import dp


class TooManyStates(ValueError):
    """The exact search grew past its limit of states or of time (the caller solves the core as a MILP instead)."""


Clock = Callable[[], float]
"""A clock in seconds, the caller's: the allocator reads none of its own. The controller's is :func:`time.thread_time`
(this thread's CPU time, not the wall's: on a busy host the same problem gets the same search)."""


@dataclass(frozen=True)
class Deadline:
    """When a search gives up, by the caller's clock. Without a clock a search never runs out of time (it is bounded
    by its limit of states alone), and ``seconds`` is what a solver with a clock of its own (HiGHS) is given."""

    at: float = math.inf
    clock: Clock | None = None
    seconds: float = math.inf

    @staticmethod
    def after(seconds: float, clock: Clock | None) -> Deadline:
        """``seconds`` from now by ``clock`` (None: no clock)."""
        return Deadline(clock() + seconds, clock, seconds) if clock is not None else Deadline(seconds=seconds)

    def passed(self) -> bool:
        return self.clock is not None and self.clock() > self.at

    def left(self) -> float:
        """The seconds left (without a clock: all of them)."""
        return self.at - self.clock() if self.clock is not None else self.seconds

    def halfway(self) -> Deadline:
        """Half of the time left from now (without a clock: the same)."""
        if self.clock is None:
            return self
        return Deadline(self.clock() + (self.at - self.clock()) / 2, self.clock, self.seconds)


NO_DEADLINE = Deadline()


@dataclass(frozen=True)
class Solution:
    """A solution's worth, and how to spell it out: a type index and a count per job (count 0: stopped). Spelling
    out solves the firm jobs' knapsacks again, so only the solution kept is."""

    value: float
    spell: Callable[[], tuple[np.ndarray, np.ndarray]]


STATE_LIMIT = 160_000
"""States, all levels together, past which a search gives up (:class:`TooManyStates`; the caller hands that core to
the MILP): on the slowest typed solves of a known-curve replay a lower limit sent cores to HiGHS that this many states
prove sooner."""


RANK_MERGE_ABOVE = 4096
"""A level of more (state, choice) pairs than this is merged by key without ``lexsort`` (cheaper below it): the
same states, in the same order (:func:`best_per_key`) ..."""
DENSE_KEYS_PER_PAIR = 8
"""... through an array indexed by key when the keys span at most this many per pair."""


class Core:
    """The choices left at threshold ``theta`` with prices ``price`` (bound ``upper``): firm rows, hesitant jobs in
    search order, and the bound rows. ``values[j, t, n]``: job j's worth (−inf: not allowed; n = 0 unused);
    ``stop[j]``: its worth stopped."""

    def __init__(self, values: np.ndarray, stop: np.ndarray, caps: np.ndarray, price: np.ndarray, upper: float,
                 theta: float):
        J, T, W = values.shape
        self.values, self.stop, self.caps = values, stop, caps.astype(int)
        n = np.arange(W)
        reduced = values - price[None, :, None] * n[None, None, :]
        reduced[:, :, 0] = -np.inf
        best = np.maximum(stop, reduced.reshape(J, -1).max(axis=1))
        gap = max(0.0, upper - theta)
        keep = np.isfinite(values) & (best[:, None, None] - reduced <= gap)
        keep[:, :, 0] = False
        may_stop = (best - stop <= gap) | ~keep.any(axis=(1, 2))
        gain = np.where(keep, values - stop[:, None, None], -np.inf)  # over stopping
        gain[:, :, 0] = np.where(may_stop, 0.0, -np.inf)[:, None]
        self.gain, self.keep = gain, keep
        kinds = keep.any(axis=2)
        on_one = kinds.sum(axis=1) <= 1
        self.firm = [np.flatnonzero(kinds[:, k] & on_one) for k in range(T)]  # (the others with no choice left stop)
        self.base = float(stop.sum())
        self.rows = [_row(gain[self.firm[k], k], int(self.caps[k])) for k in range(T)]
        hesitant, charge = _order(np.flatnonzero(~on_one), keep, may_stop,
                                  gain - price[None, :, None] * n[None, None, :])
        self.order = hesitant
        self.charges = np.concatenate([np.cumsum(charge[::-1])[::-1], [0.0]])  # Σ μ over jobs h…
        self.bound, self.offsets = _bounds(self.rows, gain[hesitant] - charge[:, None, None], self.caps)
        self.root = self.base + self.charges[0] + float(self.bound[0][self.offsets + self.caps].sum())
        self.starts, self.choices = _choices(keep[hesitant], may_stop[hesitant], gain[hesitant], self.caps)

    def search(self, theta: float, deadline: Deadline = NO_DEADLINE, limit: int | None = None) -> Solution | None:
        """The best solution worth at least ``theta`` (None: there is none); :class:`TooManyStates` past ``limit``
        states (:data:`STATE_LIMIT`) or past ``deadline`` (by the caller's clock)."""
        return self._layers(theta, STATE_LIMIT if limit is None else limit, None, deadline)

    def dive(self, theta: float, width: int, deadline: Deadline = NO_DEADLINE) -> Solution | None:
        """A good solution, if the search keeping only the ``width`` states with the best bounds per level finds one."""
        return self._layers(theta, 10**12, width, deadline)

    def _layers(self, theta: float, limit: int, width: int | None, deadline: Deadline) -> Solution | None:
        if not self.root >= theta:  # nothing worth theta (the firm jobs alone may not even fit)
            return None
        if not len(self.order):  # the firm rows alone: the root bound is exact
            return self._solution(self.root, np.zeros(len(self.caps), dtype=np.int64), [])
        states = np.zeros(1, dtype=np.int64), self.caps[None, :].astype(np.int64), np.zeros(1)  # key, nodes left, worth
        trail: list[tuple[np.ndarray, np.ndarray]] = []
        total = 0
        for h in range(len(self.order)):
            moves = self._moves(h)
            bound = self._expand(h, moves, states)
            if h == len(self.order) - 1:
                return self._finish(bound, trail, theta)
            s, i = np.nonzero(bound >= theta)
            if s.size == 0:
                return None
            states, s, i = self._merge(moves, states, s, i)
            if width is not None and len(s) > width:
                top = np.argpartition(-bound[s, i], width)[:width]
                states, s, i = tuple(a[top] for a in states), s[top], i[top]
            total += len(s)
            if total > limit:
                raise TooManyStates(f"{total:,} states by {h + 1} of {len(self.order)} hesitant jobs")
            if deadline.passed():
                raise TooManyStates(f"out of time by {h + 1} of {len(self.order)} hesitant jobs ({total:,} states)")
            trail.append((s, i))
        return None

    def _moves(self, h: int) -> tuple[np.ndarray, ...]:
        """Hesitant job h's choices left (stopping first where allowed): type, count, gain, key step, nodes taken."""
        return tuple(x[self.starts[h] : self.starts[h + 1]] for x in self.choices)

    def _expand(self, h: int, moves, states) -> np.ndarray:
        """Bound of every (state, choice of hesitant job h) pair (−inf where the choice does not fit). A state
        that got here had a finite bound, so each type's row is finite where it stands."""
        kind, count, gains, _, _ = moves
        _, left, worth = states
        rows = self.bound[h + 1]
        at = self.offsets + left
        parts = rows[at]  # each type's best with the nodes left, for the jobs after h
        without = (worth + parts.sum(axis=1) + (self.charges[h + 1] + self.base))[:, None] - parts
        return without[:, kind] + rows[at[:, kind] - count] + gains

    @staticmethod
    def _merge(moves, states, s, i):
        """The new states (one per key, the best worth), and the (state, choice) pair that made each."""
        keys, left, worth = states
        _, _, gains, step, taken = moves
        new_keys, new_worth = keys[s] + step[i], worth[s] + gains[i]
        pick = best_per_key(new_keys, new_worth)
        s, i = s[pick], i[pick]
        return (new_keys[pick], left[s] - taken[i], new_worth[pick]), s, i

    def _finish(self, bound, trail, theta: float) -> Solution | None:
        """At the last hesitant job the bound is exact: the best (state, choice), completed with the firm jobs."""
        s, i = divmod(int(np.argmax(bound)), bound.shape[1])
        value = float(bound[s, i])
        if not value >= theta:
            return None
        choices = [i]
        for parent, move in reversed(trail):
            choices.append(int(move[s]))
            s = int(parent[s])
        choices.reverse()
        used = sum(self._moves(h)[4][c] for h, c in enumerate(choices))
        return self._solution(value, used, choices)

    def _solution(self, value: float, used: np.ndarray, choices: list[int]) -> Solution:
        return Solution(value, lambda: self._spell(used, choices))

    def _spell(self, used: np.ndarray, choices: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The hesitant jobs' choices, and each type's firm jobs on the nodes they leave (exactly, by the DP)."""
        J = len(self.stop)
        types, counts = np.zeros(J, dtype=int), np.zeros(J, dtype=int)
        for h, (j, c) in enumerate(zip(self.order, choices)):
            kind, count, _, _, _ = self._moves(h)
            types[j], counts[j] = kind[c], count[c]
        for k, firm in enumerate(self.firm):
            if firm.size:
                for j, c in zip(firm.tolist(), _knapsack([self.gain[j, k] for j in firm], int(self.caps[k] - used[k]))):
                    types[j], counts[j] = k, c
        return types, counts


def best_per_key(keys: np.ndarray, worth: np.ndarray) -> np.ndarray:
    """For every key, in increasing order, the position of its best worth (the first such on a tie): what
    ``lexsort((-worth, keys))`` keeps of each key, for less. A large level of a search, over a key range a few times
    its size, is scattered into an array indexed by key; one over a wider range is sorted once by one integer (key,
    then the rank of its worth); a small one by ``lexsort``, cheapest there."""
    n = len(keys)
    top = int(keys.max()) + 1 if n else 0
    if n > RANK_MERGE_ABOVE and top <= DENSE_KEYS_PER_PAIR * n:
        best = np.full(top, -np.inf)
        np.maximum.at(best, keys, worth)
        won = np.flatnonzero(worth == best[keys])
        first = np.full(top, n, dtype=np.int64)
        np.minimum.at(first, keys[won], won)
        return first[first < n]
    if n > RANK_MERGE_ABOVE and top < (2**62) // n:
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(-worth, kind="stable")] = np.arange(n)
        order = np.argsort(keys * n + rank)
    else:
        order = np.lexsort((-worth, keys))
    sorted_keys = keys[order]
    first = np.empty(n, dtype=bool)
    first[:1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    return order[first]


def _order(hesitant: np.ndarray, keep: np.ndarray, may_stop: np.ndarray,
           reduced: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hesitant jobs in search order and their charges μ (each one's reduced gain on its second-best type at the
    prices, ≥ 0 where it may stop: the decomposition is a valid bound for any such μ). Valuable jobs torn between
    types first, fewer choices first among like ones: pruning bites early."""
    if not hesitant.size:
        return hesitant, np.zeros(0)
    per_type = np.where(keep[hesitant], reduced[hesitant], -np.inf).max(axis=2)
    second = np.sort(per_type, axis=1)[:, -2]
    charge = np.where(may_stop[hesitant], np.maximum(second, 0.0), second)
    decade = np.floor(np.log10(np.maximum(charge, 1.0)))
    order = np.lexsort((hesitant, keep[hesitant].sum(axis=(1, 2)), -decade))
    return hesitant[order], charge[order]


def _bounds(rows: list[np.ndarray], tables: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``bound[h]``: per type, the best of the hesitant jobs h… (``tables``: gains less the charge) and the firm jobs
    (``rows``) on c nodes of it, every c; and where each type's row starts in a flattened level. A −inf pad on the
    left of each row makes "more nodes than are left" −inf without a test (past a type's capacity the rows hold
    values never read)."""
    H, T, W = tables.shape
    pad, width = W, int(caps.max()) + 1
    bound = np.full((H + 1, T, pad + width), -np.inf)
    for k in range(T):
        bound[H, k, pad : pad + caps[k] + 1] = rows[k]
    tables = tables.copy()
    tables[:, :, 0] = 0.0  # not on this type (a type the job cannot use adds nothing)
    counts = np.isfinite(tables[:, :, 1:]).any(axis=1)
    for h in range(H - 1, -1, -1):
        bound[h] = bound[h + 1]
        for c in np.flatnonzero(counts[h]) + 1:
            np.maximum(bound[h, :, pad + c :], bound[h + 1, :, pad : pad + width - c] + tables[h, :, c, None],
                       out=bound[h, :, pad + c :])
    return bound.reshape(H + 1, -1), np.arange(T) * (pad + width) + pad


def _choices(keep: np.ndarray, may_stop: np.ndarray, gain: np.ndarray,
             caps: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Each hesitant job's choices left, stopping first where allowed, as flat arrays (type, count, gain, step of the
    state key, nodes taken per type), and where each job's choices start."""
    H, T, _ = keep.shape
    dims = caps + 1
    strides = np.array([int(np.prod(dims[k + 1 :])) for k in range(T)], dtype=np.int64)
    job, kind, count = np.nonzero(keep)
    stops = np.flatnonzero(may_stop)
    job = np.concatenate([stops, job])
    order = np.argsort(job, kind="stable")
    none = np.zeros(len(stops), dtype=int)
    job, kind, count = job[order], np.concatenate([none, kind])[order], np.concatenate([none, count])[order]
    gains = np.where(count > 0, gain[job, kind, count], 0.0)
    taken = np.zeros((len(kind), T), dtype=np.int64)
    taken[np.arange(len(kind)), kind] = count
    return np.searchsorted(job, np.arange(H + 1)), (kind, count, gains, count * strides[kind], taken)


def _convolve(row: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Max-plus: out[c] = max over allowed k of row[c − k] + table[k] (table[k] = −inf: not allowed)."""
    cap = len(row) - 1
    out = np.full(cap + 1, -np.inf)
    for k in np.flatnonzero(np.isfinite(table[: cap + 1])):
        np.maximum(out[k:], row[: cap + 1 - k] + table[k], out=out[k:])
    return out


def _row(tables: np.ndarray, capacity: int) -> np.ndarray:
    """The best total of ``tables`` (a row per job: gains over stopping, −inf at 0 when it must run) on at most c
    nodes, every c. Jobs left with one count and no stop — most, once fixing is tight — are one shift together."""
    allowed = np.isfinite(tables)
    fixed = allowed.sum(axis=1) == 1
    at = np.argmax(allowed[fixed], axis=1)
    shift, worth = int(at.sum()), float(tables[fixed][np.arange(len(at)), at].sum())
    row = np.full(capacity + 1, -np.inf)
    if shift <= capacity:
        row[shift:] = worth
    for t in tables[~fixed]:
        row = _convolve(row, t)
    return row


def _knapsack(tables: list[np.ndarray], capacity: int) -> list[int]:
    """Counts for ``tables`` on ``capacity`` nodes, exactly (the smallest count a job must run on taken first, so
    that the DP sees a job that may stop)."""
    if capacity < 0:
        raise ValueError("the hesitant jobs took more nodes than there are")
    low = [int(np.flatnonzero(np.isfinite(t))[0]) for t in tables]
    counts, _ = dp.solve([t[k:] for t, k in zip(tables, low)], capacity - sum(low))
    return [c + k for c, k in zip(counts, low)]

"""Exact allocation on identical nodes: a multiple-choice knapsack, solved exactly and fast.

With one node type the objective is a sum of per-job tables and the only
coupling is Σ n_j ≤ N. A plain dynamic programme over the capacity axis is
exact but costs O(N · Σ_j |choices_j|): at whole-machine scale (4,734 nodes,
hundreds of jobs of up to 64 nodes each) that is 10⁸ cell updates, a quarter
of a second or more per decision. The solver here reaches the same optimum in
milliseconds, as the exact algorithms for large multiple-choice knapsacks do
(Dyer–Zemel; Pisinger's core algorithm):

1. **Relax.** For a node price λ ≥ 0 every job alone picks
   ``argmax_n t_j(n) − λ·n``; the price at which the jobs together ask for at
   most N nodes gives the Lagrangian bound ``UB(λ) = λN + Σ_j max_n (t_j(n) − λn)``
   and a feasible answer. λ is read from the slopes of the jobs' concave hulls
   (the nodes the jobs ask for at λ are the steps of the hull edges steeper
   than λ), one pass over every job and count, compiled, and one sort.
2. **Round.** The feasible answer is improved greedily on the nodes left
   over: a lower bound ``LB``.
3. **Fix.** Any optimum pays, job by job, a non-negative *reduced cost*
   ``max_m (t_j(m) − λm) − (t_j(n) − λn)`` for its choice, and these sum to at
   most ``UB − LB``; so every choice whose reduced cost exceeds that gap is in
   no optimum and is dropped. On these tables nearly every job keeps one or two
   choices.
4. **Solve the core** — the jobs left with several choices — by the plain DP (compiled: :mod:`.compiled`), kept
   to the states that can still reach ``LB`` by the bound at λ: a band of capacities around the optimal path, not
   every capacity (on a whole machine's core of a thousand jobs, a small share of the cells).

The answer is the DP's on the whole problem (the same objective; ties go to
the smaller count, so nodes nobody gains from are left free).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import compiled

WORK_LIMIT = 400_000_000
"""Above this many DP cell updates (after fixing) :func:`solve` raises :class:`TooLarge`: the MILP is faster there."""
CORE_SHARES = (0.1,)
"""Before fixing against the whole gap, the DP over the choices within these shares of it: a better incumbent, fast."""
BISECTIONS = 60
"""Bisection steps on the node price where the hulls' slopes, rounded, do not give it (each step one pass over every job
and count)."""


class TooLarge(ValueError):
    """The core left after fixing is still too large for the DP (the caller falls back to the MILP)."""


def work(tables: Sequence[np.ndarray], capacity: int) -> int:
    """Cell updates the plain DP would make (0 when capacity is not binding): what the core solver avoids."""
    if sum(len(t) - 1 for t in tables) <= capacity:
        return 0
    return sum(int(np.isfinite(t).sum()) for t in tables) * (capacity + 1)


def applies(tables: Sequence[np.ndarray], capacity: int) -> bool:
    """Whether :func:`solve` may be used at all (finite tables; the core's size is checked while solving)."""
    return all(len(t) > 0 and np.isfinite(t[0]) for t in tables)


def solve(tables: Sequence[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """Counts maximising Σ_j tables[j][n_j] subject to Σ_j n_j ≤ capacity.

    ``tables[j][n]`` is job j's worth at n nodes, −inf where n is not allowed;
    ``tables[j][0]`` must be finite (a job can always be stopped). Ties go to
    the smaller count, so nodes nobody gains from are left free.
    """
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    if len(tables) == 0:
        return [], 0.0
    if isinstance(tables, np.ndarray) and tables.ndim == 2:  # one row per job, −inf past its cap
        lengths = np.full(len(tables), tables.shape[1])
    else:
        lengths = np.fromiter((len(t) for t in tables), dtype=int, count=len(tables))
    if (lengths == 0).any():
        raise ValueError(f"table {int(np.argmin(lengths))} must have a finite value at 0 nodes")
    width = int(min(lengths.max(), capacity + 1))  # more nodes than there are is no choice
    if isinstance(tables, np.ndarray) and tables.ndim == 2:
        values = np.array(tables[:, :width], dtype=float)
    elif (lengths == width).all():
        values = np.array(tables, dtype=float).reshape(len(tables), width)  # one copy (the tables are the callers')
    else:
        values = np.full((len(tables), width), -np.inf)
        for j, t in enumerate(tables):
            values[j, : min(len(t), width)] = np.asarray(t, dtype=float)[:width]
    first = np.isfinite(values[:, 0])
    if not first.all():
        raise ValueError(f"table {int(np.argmin(first))} must have a finite value at 0 nodes")
    finite = np.isfinite(values)
    # every job's largest count fits at once
    if int((width - 1 - np.argmax(finite[:, ::-1], axis=1)).sum()) <= capacity:
        counts = np.argmax(values, axis=1)
        return counts.tolist(), float(values[np.arange(len(values)), counts].sum())
    values = _contenders(_undominated(values), capacity)
    live = np.isfinite(values[:, 1:]).any(axis=1)
    if not live.all():  # jobs left with 0 nodes only are settled: the rest is solved without them
        counts = np.zeros(len(values), dtype=int)
        part, value = _solve_live(values[live], capacity)
        counts[live] = part
        return counts.tolist(), value + float(values[~live, 0].sum())
    counts, value = _solve_live(values, capacity)
    return list(counts), value


def _solve_live(values: np.ndarray, capacity: int) -> tuple[list[int], float]:
    """:func:`solve` on a value matrix whose every job may still run."""
    if len(values) == 0:
        return [], 0.0
    width = values.shape[1]
    best = choices_at(values, 0.0)
    if best.sum() <= capacity:  # every job's own best fits: that is the optimum
        counts = best.tolist()
        return counts, float(values[np.arange(len(values)), best].sum())

    price, feasible, over = break_price(values, capacity)
    incumbent = round_up(values, toward(values, feasible, over, capacity), capacity)
    n = np.arange(width)
    reduced_best = (values - price * n).max(axis=1)
    upper = price * capacity + float(reduced_best.sum())
    reduced = reduced_best[:, None] - (values - price * n)  # ≥ 0 where finite
    rows = np.arange(len(values))
    finite = np.isfinite(values)
    # A better incumbent first: the exact DP over the choices closest to the bound (a small core, the incumbent's
    # choices kept so that it stays feasible). The nearer the incumbent to the optimum, the more is fixed below.
    for share in CORE_SHARES:
        lower = float(values[rows, incumbent].sum())
        gap = max(0.0, upper - lower)
        near = finite & (reduced <= gap * share)
        near[rows, incumbent] = True
        if int(near.sum()) == len(rows):
            break
        try:
            better, value = solve_core(values, near, capacity, price, lower)
        except TooLarge:
            break
        if value > lower:
            incumbent = np.asarray(better)
    lower = float(values[rows, incumbent].sum())
    gap = max(0.0, upper - lower)
    # What rounding can hide in the bound, the incumbent and a reduced cost: sums of len(values) terms, each error
    # at most that many roundings of the largest term's size. Not a share of the objective: jobs never measured are
    # worth ~1e13 each while exploring, and a share of that total would keep every measured job's every count.
    magnitude = price * capacity + float(np.abs(np.where(finite, values, 0.0)).max(axis=1).sum())
    slack = 4.0 * (len(values) + 1) * np.finfo(float).eps * max(1.0, magnitude)
    keep = finite & (reduced <= gap + slack)
    keep[rows, incumbent] = True
    return solve_core(values, keep, capacity, price, lower)


def _undominated(values: np.ndarray) -> np.ndarray:
    """Drop (set to −inf) each count worth no more than a smaller count of the same job: an optimum using it can
    use the smaller one instead, on fewer nodes. A job never measured (a token rate, flat past its minimum) keeps
    two choices instead of sixty, and the core below stays the size of what is really in question."""
    if values.shape[1] < 2:
        return values
    before = np.maximum.accumulate(values, axis=1)
    out = values.copy()
    out[:, 1:][before[:, :-1] >= values[:, 1:]] = -np.inf
    return out


def _contenders(values: np.ndarray, capacity: int) -> np.ndarray:
    """Fix at 0 nodes every job that is not, at any count ``n``, among the ``capacity − n + 1`` best gains at ``n``.

    Exact: in an optimum where such a job runs on ``n`` nodes, at most ``capacity − n`` other jobs run, so one of
    the ``capacity − n + 1`` jobs that gain at least as much from ``n`` nodes is idle and could have them instead.
    With few free nodes and hundreds of candidates (exploring the nodes a decision left free) a handful remain."""
    jobs, width = values.shape
    if jobs <= capacity or width < 2:
        return values
    gains = values[:, 1:] - values[:, :1]
    keep = np.zeros(jobs, dtype=bool)
    for n in range(1, width):
        top = capacity - n + 1
        column = gains[:, n - 1]
        finite = np.isfinite(column)
        if int(finite.sum()) <= top:
            keep |= finite
            continue
        column = np.where(finite, column, -np.inf)
        threshold = -np.partition(-column, top - 1)[top - 1]  # the top-th best gain
        above = column > threshold
        keep |= above
        # ties: the earlier jobs (submission order)
        keep[np.flatnonzero(column == threshold)[: top - int(above.sum())]] = True
    if keep.all():
        return values
    out = values.copy()
    out[~keep, 1:] = -np.inf
    return out


def choices_at(values: np.ndarray, price: float) -> np.ndarray:
    """Each job's best count at node price ``price`` (the smallest on ties; compiled: sixty of these per decision)."""
    return compiled.choose(values, price)


def break_price(values: np.ndarray, capacity: int) -> tuple[float, np.ndarray, np.ndarray]:
    """The smallest node price at which the jobs' own choices fit, those choices, and the choices just below that
    price (which do not fit).

    The price is read from the slopes of the jobs' concave hulls (:func:`.compiled.hull_edges`): the nodes asked for
    at a price are the steps of the edges steeper than it, so the price is the slope at which their sum, steepest
    first, reaches what is too many. Where rounding makes the choices there not fit after all, bisection finds it."""
    slopes, steps = compiled.hull_edges(values)
    if len(slopes):
        # Only the steepest edges can hold the price: every edge asks one node at least, so those past which the rest
        # fit are among the ``capacity + 1`` steepest. They are picked in one pass and sorted alone (exploring a few
        # free nodes among a thousand jobs' edges sorts a few dozen, not tens of thousands).
        total = int(steps.sum())
        if capacity + 1 < len(slopes):
            top = np.argpartition(slopes, len(slopes) - capacity - 1)[len(slopes) - capacity - 1 :]
            steepest, their_steps = slopes[top], steps[top]
        else:
            steepest, their_steps = slopes, steps
        order = np.argsort(steepest, kind="stable")
        ranked = steepest[order]
        # asked[i]: nodes of the edges no steeper than ranked[i]
        asked = total - int(their_steps.sum()) + np.cumsum(their_steps[order])
        i = int(np.searchsorted(asked, total - capacity, side="left"))  # the first slope past which the rest fit
        if i < len(ranked):
            price = float(ranked[i])
            for hi in (price, price * (1 + 1e-12), price * (1 + 1e-9)):
                choice = choices_at(values, hi)
                if int(choice.sum()) <= capacity:
                    below = slopes[slopes < price]  # the next price below: every edge it crosses asks
                    lo = (float(below.max()) + price) / 2 if below.size else price / 2
                    return hi, choice, choices_at(values, lo)
    return bisect_break_price(values, capacity)


def bisect_break_price(values: np.ndarray, capacity: int) -> tuple[float, np.ndarray, np.ndarray]:
    """:func:`break_price` by bisection (to its precision): where the hulls' slopes, rounded, do not give it."""
    finite = np.where(np.isfinite(values), values, np.nan)
    spread = np.nanmax(finite, axis=1) - np.nanmin(finite, axis=1)
    hi = float(np.nanmax(spread)) + 1.0  # above any job's gain per node: every job takes its smallest count
    lo = 0.0
    choice, over = choices_at(values, hi), choices_at(values, lo)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        c = choices_at(values, mid)
        if c.sum() <= capacity:
            hi, choice = mid, c
        else:
            lo, over = mid, c
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi, choice, over


def toward(values: np.ndarray, fits: np.ndarray, over: np.ndarray, capacity: int) -> np.ndarray:
    """From the choices that fit toward those that do not, job by job while they fit: at the break price many
    jobs (copies of one model, say) change their minds at once, and each of them gains about the price per node."""
    counts = fits.copy()
    free = capacity - int(counts.sum())
    rows = np.flatnonzero(over != fits)
    if rows.size == 0 or free <= 0:
        return counts
    step = over[rows] - fits[rows]
    gain = (values[rows, over[rows]] - values[rows, fits[rows]]) / np.where(step != 0, step, 1)
    for j, s in zip(rows[np.argsort(-gain, kind="stable")].tolist(), step[np.argsort(-gain, kind="stable")].tolist()):
        if 0 < s <= free:
            counts[j] += s
            free -= s
            if free == 0:
                break
    return counts


def round_up(values: np.ndarray, counts: np.ndarray, capacity: int) -> np.ndarray:
    """Improve a feasible answer greedily on the nodes it leaves free: the best gain per node first (compiled)."""
    return compiled.round_up(values, counts, capacity)


def solve_core(values: np.ndarray, keep: np.ndarray, capacity: int, price: float = 0.0,
               lower: float = -np.inf) -> tuple[list[int], float]:
    """The exact DP over the choices left after fixing; jobs with one choice left are fixed at it.

    ``lower`` is the value of an answer among the choices kept (the incumbent) and ``price`` a node price: the DP then
    keeps only the states that can still reach ``lower`` by the Lagrangian bound at that price (the same answer, on a
    band of capacities; :func:`.compiled.knapsack_flat`).

    Two kinds of job need no table of their own (exact: a max-plus convolution of such tables is a merge):

    * jobs whose choices left are a run of counts with gains that never grow from one node to the next (concave:
      measured jobs growing along their curves, linear ones above all, and every "one more node or not") are one
      table: the best ``m`` nodes for all of them are their ``m`` largest one-node gains, each job's taken in order;
    * jobs left with two choices a step of ``w`` > 1 nodes apart (start on ``w`` nodes or not) are one table per
      ``w``: the best ``m`` of them are those with the ``m`` largest gains.

    Hundreds of jobs a decision weighs are like that, and where the Lagrangian bound cannot tell them apart (on
    linear curves every count is as good at the node price) fixing leaves them all in the core."""
    lowest = keep.argmax(axis=1)  # each job's smallest surviving count
    left = capacity - int(lowest.sum())
    counts = lowest.copy()
    width = values.shape[1]
    kept = keep.sum(axis=1)
    highest = width - 1 - np.argmax(keep[:, ::-1], axis=1)
    gain = np.diff(np.where(keep, values, 0.0), axis=1)  # gain[:, n] = worth of node n + 1 over n nodes
    n = np.arange(width - 1)
    step = (n[None, :] >= lowest[:, None]) & (n[None, :] < highest[:, None])  # the one-node steps within a job's run
    scale = np.abs(np.where(keep, values, 0.0)).max(axis=1)
    rises = (gain[:, 1:] - gain[:, :-1] > 1e-12 * np.maximum(scale, 1.0)[:, None]) & step[:, 1:] & step[:, :-1]
    merged = (kept > 1) & (highest - lowest + 1 == kept) & ~rises.any(axis=1)
    pieces: list[np.ndarray] = []  # the core's tables, end to end: the merged one, each job's own, one per step w
    lengths: list[np.ndarray] = []
    if merged.any() and left > 0:
        rows, cols = np.nonzero(step & merged[:, None])
        gains = gain[rows, cols]
        order = np.lexsort((cols, rows, -gains))[:left]  # largest first; ties: earlier jobs, then smaller counts
        by_gain = rows[order]
        pieces.append(np.concatenate([[0.0], np.cumsum(gains[order])]))
        lengths.append(np.array([len(order) + 1]))
    several = (kept > 1) & ~merged
    # a table of its own each, in job order: the counts from its lowest to highest kept
    own = np.flatnonzero(several & (kept > 2))
    if own.size:
        span = np.arange(width)
        inside = (span >= lowest[own, None]) & (span <= highest[own, None])
        pieces.append(np.where(keep[own], values[own], -np.inf)[inside])  # row by row: each job's table in turn
        lengths.append(highest[own] - lowest[own] + 1)
    # start on w more nodes or not: one table per w, the largest gains first
    two = np.flatnonzero(several & (kept == 2))
    steps = highest[two] - lowest[two]
    pair_gain = values[two, highest[two]] - values[two, lowest[two]]
    order = np.lexsort((two, -pair_gain, steps))
    groups = []
    for w in np.unique(steps).tolist():
        group = order[steps[order] == w]
        fit = min(len(group), max(left, 0) // w)
        t = np.full(fit * w + 1, -np.inf)
        t[0::w] = np.concatenate([[0.0], np.cumsum(pair_gain[group[:fit]])])
        pieces.append(t)
        lengths.append(np.array([len(t)]))
        groups.append((w, two[group]))
    if pieces:
        flat, sizes = np.concatenate(pieces), np.concatenate(lengths)
        if int((sizes - 1).sum()) > left and int(np.isfinite(flat).sum()) * (left + 1) > WORK_LIMIT:
            raise TooLarge(f"{len(sizes)} jobs keep several choices after fixing: "
                           f"{int(np.isfinite(flat).sum()) * (left + 1):,} DP cells")
        # The incumbent's worth in the DP's terms: its own tables hold values, every other job adds gains over its
        # lowest count; less what rounding can hide in the DP's sums and bounds.
        others = np.ones(len(values), dtype=bool)
        others[own] = False
        fixed = float(values[others, lowest[others]].sum())
        magnitude = price * capacity + float(np.abs(np.where(keep, values, 0.0)).max(axis=1).sum())
        floor = lower - fixed - 16.0 * (len(values) + left + 2) * np.finfo(float).eps * max(1.0, magnitude)
        extra = dense_flat(flat, sizes, left, price, floor)
        at = 0
        if merged.any() and left > 0:
            np.add.at(counts, by_gain[: extra[0]], 1)
            at = 1
        counts[own] += extra[at : at + own.size]
        at += own.size
        for (w, who), k in zip(groups, extra[at:].tolist()):
            counts[who[: k // w]] += w
    total = float(values[np.arange(len(values)), counts].sum())
    return counts.tolist(), total


def dense_flat(flat: np.ndarray, sizes: np.ndarray, capacity: int, price: float = 0.0,
               floor: float = -np.inf) -> np.ndarray:
    """:func:`dense` over tables laid end to end (``sizes``: their lengths): each table's count (ties: the smaller).
    ``floor`` and ``price``: the states kept (:func:`.compiled.knapsack_flat`); a floor no answer reaches is ignored."""
    if capacity < 0:
        raise TooLarge("the fixed choices exceed the capacity")  # cannot happen for a feasible incumbent
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if int((sizes - 1).sum()) <= capacity:  # every table's best fits at once: each one's first best count
        best = np.maximum.reduceat(flat, offsets[:-1])
        at = np.flatnonzero(flat == np.repeat(best, sizes))
        return at[np.searchsorted(at, offsets[:-1])] - offsets[:-1]
    if floor > -np.inf:
        counts = compiled.knapsack_flat(flat, offsets, capacity, price, floor)
        if counts is not None:
            return counts
    return compiled.knapsack_flat(flat, offsets, capacity)


def dense(tables: Sequence[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """The plain DP: a max-plus convolution of the tables over the capacity axis (exact, O(N·Σ|choices|); compiled,
    :mod:`.compiled`). Ties go to the smaller count. :func:`dense_flat` on the tables laid end to end."""
    if not tables:
        return [], 0.0
    sizes = np.fromiter((len(t) for t in tables), dtype=np.int64, count=len(tables))
    counts = dense_flat(np.concatenate([np.asarray(t, dtype=float) for t in tables]), sizes, capacity).tolist()
    return counts, float(sum(t[n] for t, n in zip(tables, counts)))

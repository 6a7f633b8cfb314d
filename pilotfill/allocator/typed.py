"""Exact allocation across node types: a node price per type, reduced-cost fixing, then an exact search on the core.

With several kinds of node each job picks one type and a count on it (or
stops), and each type has its own capacity:

    max Σ_j v_j(t_j, n_j)   subject to   Σ_{j: t_j = t} n_j ≤ N_t   for every type t.

0. **Pinned jobs.** A job whose best type beats its every other choice by more than all other jobs could gain
   (one that has not reported yet keeps its nodes: moving or stopping it costs some 10¹³) runs on that type in every
   optimum: its other choices go, and where its best count is beyond doubt too it leaves the problem with its nodes
   (:func:`pin`). Left in, such values made one sum of 10¹⁵ whose rounding was coarser than most jobs' gains.
1. **A small machine** (a grid of node counts per type whose DP costs at most some 30 million cell updates): the
   plain DP over that grid (:mod:`.typegrid`), exact, and cheaper there than what follows when the LP relaxation
   is loose (a job's 8 nodes a good share of a type). Past 5 million updates the steps below are tried first with
   a search of some thousand states (a probe): where the bound is tight — most pilot-sizing questions, with every
   idle node counted, and most decisions while learning — they prove the optimum for a fraction of the grid's cost;
   where it fails the grid runs after it, a little later.
2. **Prices.** One node price per type near the LP relaxation's optimum (:mod:`.typeprices`): the bound UB.
3. **A first answer.** Copies of each model are shared among types as the prices share them, and each type's jobs
   are solved exactly by the one-type solver (:func:`.dp.solve`): the incumbent, LB. (The types jobs run on now
   made a worse first answer on every hard decision of the benchmark: not tried.)
4. **The core, exactly, from the bound down** (:mod:`.typecore`). For a threshold θ, every choice whose reduced
   cost exceeds UB − θ is in no solution worth θ and is dropped; jobs left on one type are one DP row per type, and
   the jobs that still hesitate between types are searched state by state (nodes of each type taken so far), pruned
   by a bound exact per type: the best solution worth θ, or none. Near UB the core is small and its search cheap,
   so θ starts just below UB and steps down, farther each time, until a search finds a solution — the optimum,
   since nothing is worth the θ before. After each empty search a dive (the search keeping only its best states)
   on that small core may raise LB; once θ would pass LB, the search at LB finishes.

Were the search ever to grow too large, or still run at half the time limit (read on the caller's clock), the core
goes to HiGHS (through SciPy) as a MILP, copies of a model counted rather than named, with the time left.
:func:`solve_milp` is the whole model solved by HiGHS without the decomposition (one binary per job, type and count):
the reference the benchmark and the tests compare.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import dp, typecore, typegrid
from .milp import quiet_solver
from .typecore import Clock, Core, Deadline, Solution, TooManyStates
from .typeprices import prices

FIRST_STEP = 256
"""The first threshold is UB less this share of the gap between UB and the first answer."""
GROW = 2
"""Each next threshold is this many times farther below UB (the search at a threshold far below the optimum costs
more: the steps stay small)."""
DIVE_WIDTH = 16
"""States a dive keeps per level."""


@dataclass(frozen=True)
class Choice:
    """A job's answer: a type and a count (``node_type`` None and ``count`` 0: stopped)."""

    node_type: str | None
    count: int


def solve(tables: Sequence[dict[str, np.ndarray]], capacities: dict[str, int], time_limit_s: float = 1.0,
          milp: bool = True, clock: Clock | None = None) -> tuple[list[Choice], float, str]:  # fmt: skip
    """Exact optimum: ``tables[j][t][n]`` is job j's worth on type t at n nodes (−inf where not allowed; every
    table of a job has the same finite value at 0, stopped). Returns the choices, the value and how the core was
    solved (``"dp"``, or ``"dp+milp"`` where the search grew too large or ran long; ``time_limit_s`` bounds the
    search and that MILP together: past it, the best solution found, ``"… (time limit)"``). The limit is read on
    ``clock``, the caller's (the controller's is the CPU time of its thread, :func:`time.thread_time`, not the wall's:
    on a busy host the same problem gets the same search, and the controller's other threads do not spend its time).
    Without a clock the search is bounded by its limit of states alone (:data:`.typecore.STATE_LIMIT`), so its answer
    does not depend on how busy the host is, and the MILP by HiGHS's own clock, ``time_limit_s`` a try.
    ``milp=False``: no MILP — a search past its limit, or out of time, leaves the best solution it found (``"dp
    (search limit)"``): for a stage whose answer is a bonus (HiGHS may overrun a limit of a few tens of
    milliseconds)."""
    deadline = Deadline.after(time_limit_s, clock)
    types = sorted(capacities)
    J, T = len(tables), len(types)
    if J == 0:
        return [], 0.0, "dp"
    original, original_stop = value_matrix(tables, capacities, types)
    caps = np.array([capacities[t] for t in types], dtype=float)
    values, stop, decided, (ts, ns) = pin(original, original_stop, caps)
    # no count to choose (a due job's table on top, full): out of the search
    idle = ~np.isfinite(values[:, :, 1:]).any(axis=(1, 2))
    if idle.any():
        decided, ts, ns = decided | idle, np.where(idle, 0, ts), np.where(idle, 0, ns)
    left = caps - np.bincount(ts[decided], weights=ns[decided], minlength=T)
    # the grid DP is not cut short: taken where it fits the limit
    grid = min(typegrid.WORK, time_limit_s / typegrid.UPDATE_S)
    (ts[~decided], ns[~decided]), how = _solve(values[~decided], stop[~decided], left, deadline, grid, milp)
    return _answer(types, ts, ns), _worth(original, original_stop, ts, ns), how


PROBE_ABOVE = 5_000_000
"""A grid DP of more cell updates than this (see :data:`.typegrid.UPDATE_S`) is tried after a short search: ..."""
PROBE_STATES = 1 / 20_000
"""... of at most one search state per this many of the grid's cell updates, in each of its searches (the
thresholds step down from the bound to the first answer in about nine of them)."""


PIN_MARGIN = 2.0
"""A job is pinned to its best type when that beats its next best choice by this many times all other jobs could
gain together (twice: a margin no rounding of the values can close)."""


def pin(values: np.ndarray, stop: np.ndarray,
        caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Jobs whose type no optimum can doubt, taken out of the search: the values and stops to solve, which jobs are
    decided already, and a type and count per job (meaningful where decided).

    A job that has not reported yet keeps its nodes until it does: stopping or moving it costs its change times an
    exploring rate (:data:`.profiler.EXPLORE_RATE`), some 10¹³ where every other job's worth is 10²–10⁸. In one
    sum such values leave the bound's tolerance (relative to the total) coarser than most jobs' gains and the search
    hesitating over all of them: a learned typed replay's slowest decisions were these. Yet their answer
    is plain: if the jobs P, each at its best choice (type t*, count c*), fit together and each one's best beats its
    best choice elsewhere (or stopping) by more than all jobs outside P could gain, then in every optimum each runs
    on its t* (else all of P at their best and the rest stopped is worth more). Those jobs are *pinned*: their other
    types and stopping are dropped, their values on t* shifted to 0 at best (the optima do not move: every solution
    left differs by one constant), stopping replaced by a loss larger than the rest could gain. A pinned job whose
    best count is also its smallest allowed, or beats every other count by that margin, is decided outright: it
    takes c* nodes of t* off the capacity and leaves the problem.
    """
    J = len(values)
    gain, best_type, at, order, rest, ok = _pins(values, stop, caps)
    ts, ns = best_type.copy(), at.copy()
    decided = np.zeros(J, dtype=bool)
    if not ok.size:
        return values, stop, decided, (ts, ns)
    k = int(ok[-1]) + 1
    pinned, bar = order[:k], PIN_MARGIN * rest[k - 1]
    values, stop = values.copy(), stop.copy()
    for j in pinned.tolist():
        t = best_type[j]
        row = gain[j, t]
        allowed = np.flatnonzero(np.isfinite(row))
        second = np.max(np.delete(row, at[j]), initial=-np.inf)
        if at[j] == allowed[0] or row[at[j]] - second > bar:
            decided[j] = True
            continue
        values[j] = -np.inf
        values[j, t] = row - row[at[j]]
        stop[j] = -(bar + 1.0)
    return values, stop, decided, (ts, ns)


def _pins(values: np.ndarray, stop: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, ...]:
    """What :func:`pin` decides by: each job's gains over stopping, best type and count, the jobs by margin, what
    those after each could gain, and the positions in that order up to which jobs may be pinned."""
    J, T, W = values.shape
    gain = values - stop[:, None, None]
    gain[:, :, 0] = -np.inf
    per_type = gain.max(axis=2)
    best_type = np.argmax(per_type, axis=1)
    rows = np.arange(J)
    best = per_type[rows, best_type]
    others = per_type.copy()
    others[rows, best_type] = -np.inf
    margin = best - np.maximum(others.max(axis=1), 0.0)
    upside = np.maximum(best, 0.0)
    at = np.argmax(gain[rows, best_type], axis=1)  # the smallest count worth the most
    order = np.argsort(-margin, kind="stable")
    after = np.cumsum(upside[order][::-1])[::-1]  # summed from the small end: no huge value cancelled away
    rest = np.concatenate([after[1:], [0.0]])  # what the jobs outside the first k could gain
    use = np.zeros((J, T))
    use[order, best_type[order]] = at[order]
    fits = (np.cumsum(use[order], axis=0) <= caps[None, :]).all(axis=1)
    ok = np.flatnonzero((margin[order] > PIN_MARGIN * rest) & (margin[order] > 0) & np.minimum.accumulate(fits))
    return gain, best_type, at, order, rest, ok


def pinned(values: np.ndarray, stop: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Which jobs :func:`pin` pins (no optimum moves them): what a due job's bonus need not outweigh (:mod:`.due`)."""
    _, _, _, order, _, ok = _pins(values, stop, caps)
    out = np.zeros(len(values), dtype=bool)
    if ok.size:
        out[order[: int(ok[-1]) + 1]] = True
    return out


def _solve(values: np.ndarray, stop: np.ndarray, caps: np.ndarray, deadline: Deadline, grid_work: float = typegrid.WORK,
           milp: bool = True) -> tuple[tuple[np.ndarray, np.ndarray], str]:  # fmt: skip
    """:func:`solve` on the value matrix: (type index, count) per job, and how (the caller values the answer by
    the tables as given, not these, which :func:`pin` may have shifted). ``grid_work``: the most cell updates the
    grid DP may take on (it runs to its end: a short time limit takes the search, which stops on time)."""
    J, T, W = values.shape
    if J == 0:
        return (np.zeros(0, dtype=int), np.zeros(0, dtype=int)), "dp"

    # Every job's own best: if that fits every type, it is the optimum.
    own = values.reshape(J, T * W).copy()
    own[:, ::W] = -np.inf
    at = np.argmax(own, axis=1)
    runs = own[np.arange(J), at] > stop  # ties: stop (leave nodes free)
    kind, count = np.divmod(at, W)
    if all(count[runs & (kind == k)].sum() <= caps[k] for k in range(T)):
        ts, ns = np.where(runs, kind, 0), np.where(runs, count, 0)
        return (ts, ns), "dp"

    grid = typegrid.work(caps, values, stop)
    if grid <= grid_work:
        # a large grid: the search may prove the optimum for much less (a loose bound fails fast)
        if grid > PROBE_ABOVE:
            with contextlib.suppress(TooManyStates):  # the bound is loose here: the grid answers
                return _by_search(values, stop, caps, deadline, min(typecore.STATE_LIMIT, int(grid * PROBE_STATES)))
        return typegrid.solve(values, stop, caps), "dp"
    return _by_search(values, stop, caps, deadline, milp=milp)


def _by_search(values: np.ndarray, stop: np.ndarray, caps: np.ndarray, deadline: Deadline, probe: int | None = None,
               milp: bool = True) -> tuple[tuple[np.ndarray, np.ndarray], str]:  # fmt: skip
    """Steps 2–4: prices, a first answer, the exact search of the core (the MILP where that grows too large).
    ``probe``: a search of at most this many states, and :class:`TooManyStates` rather than the MILP."""
    J, T, W = values.shape
    members = _copies(values, stop)
    rep = np.array([m[0] for m in members])
    price, share = prices(values[rep] - stop[rep, None, None], np.array([len(m) for m in members], dtype=float), caps)
    n = np.arange(W)
    reduced = values - price[None, :, None] * n[None, None, :]
    reduced[:, :, 0] = -np.inf
    upper = float(price @ caps + np.maximum(stop, reduced.reshape(J, -1).max(axis=1)).sum())
    best = _by_type(values, stop, caps, _apportion(members, share, values))
    slack = 1e-9 * max(1.0, abs(upper))
    how = "dp"
    if upper - best.value > slack:
        best, how = _exact(values, stop, caps, price, upper, best, slack, deadline, probe, milp)
    ts, ns = best.spell()
    return (ts, ns), how


def _exact(values: np.ndarray, stop: np.ndarray, caps: np.ndarray, price: np.ndarray, upper: float, best: Solution,
           slack: float, deadline: Deadline, probe: int | None = None, milp: bool = True) -> tuple[Solution, str]:
    """The optimum, from the bound down. For θ = UB − d, UB − d·GROW, … the core fixed at θ is small while θ
    is near UB, and its search either finds the optimum (θ at or below it: nothing is worth more than the θ before) or
    proves that nothing is worth θ — then a dive on that small core may raise the incumbent. Once θ would pass the
    incumbent, the search at its value. A search that grows past its limit hands its core to the MILP instead: the best
    solution there is the optimum if it is worth θ (else the MILP on the core at the incumbent's value). So does a
    search still running at half the time (``deadline``, by the caller's clock): the MILP has the rest (without a clock,
    the whole limit a try). ``probe``: every search of at most this many states, and :class:`TooManyStates`
    instead of the MILP."""
    searching = deadline.halfway() if milp else deadline
    step = (upper - best.value) / FIRST_STEP
    while True:
        theta = max(upper - step, best.value - slack)
        step *= GROW
        core = Core(values, stop, caps, price, upper, theta)
        try:
            found = core.search(theta, searching, probe) if core.root >= theta else None
            if found is not None:
                return (found if found.value > best.value else best), "dp"
            if theta <= best.value:  # nothing beats the incumbent
                return best, "dp"
            better = core.dive(best.value - slack, DIVE_WIDTH, searching)
        except TooManyStates:
            if probe is not None:
                raise
            break
        if better is not None and better.value > best.value + slack:
            best = better
    if not milp:
        return best, "dp (search limit)"
    found = best
    for tries, keep in ((2, core.keep), (1, None)):
        left = deadline.left()
        if tries == 1 and left <= 0:  # no time for the core at the incumbent's value: the best found stands
            break
        if keep is None:
            keep = Core(values, stop, caps, price, upper, best.value - slack).keep
        ts, ns, value, proven = _milp(values, stop, caps, keep, left / tries)  # the limit holds
        if proven and value >= theta:
            return Solution(value, lambda: (ts, ns)), "dp+milp"
        if value > found.value:
            found = Solution(value, lambda ts=ts, ns=ns: (ts, ns))
        theta = best.value - slack
    return found, "dp+milp (time limit)"  # the MILP ran out of time: its best, or the incumbent where that is better


def _worth(values: np.ndarray, stop: np.ndarray, ts: np.ndarray, ns: np.ndarray) -> float:
    return float(np.where(ns > 0, values[np.arange(len(ns)), ts, ns], stop).sum())


def value_matrix(tables: Sequence[dict[str, np.ndarray]], capacities: dict[str, int],
                 types: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``values[j, t, n]`` (−inf where not allowed or more nodes than the type has) and ``stop[j]``."""
    J = len(tables)
    width = max(max((len(tb) for job in tables for tb in job.values()), default=1), 1)
    values = np.full((J, len(types), width), -np.inf)
    stop = np.zeros(J)
    index = {t: k for k, t in enumerate(types)}
    for j, job in enumerate(tables):
        first = next(iter(job.values()), None)
        s0 = float(first[0]) if first is not None else 0.0
        if not math.isfinite(s0):
            raise ValueError(f"job {j}: its value at 0 nodes must be finite")
        stop[j] = s0
        for t, tb in job.items():
            k = index.get(t)
            if k is None:
                continue
            if abs(float(tb[0]) - s0) > 1e-9 * max(1.0, abs(s0)):
                raise ValueError(f"job {j}: tables disagree at 0 nodes ({tb[0]} on {t!r}, {s0} elsewhere)")
            upto = min(len(tb), capacities[t] + 1)
            values[j, k, 1:upto] = tb[1:upto]
    return values, stop


def _copies(values: np.ndarray, stop: np.ndarray) -> list[list[int]]:
    """Jobs with the same tables, grouped (copies of a model waiting to start are interchangeable)."""
    groups: dict[tuple[bytes, float], list[int]] = {}
    for j in range(len(values)):
        groups.setdefault((values[j].tobytes(), float(stop[j])), []).append(j)
    return list(groups.values())


def _apportion(members: list[list[int]], share: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A type per job: each group's copies divided among the types it can use as the prices share them (largest
    remainders; evenly where the prices give it no share)."""
    G, T = share.shape
    runs_on = np.isfinite(values[[m[0] for m in members], :, 1:]).any(axis=2)
    weights = np.where(runs_on, share, 0.0)
    weights = np.where(weights.sum(axis=1, keepdims=True) > 0, weights, runs_on + 1e-12)
    size = np.array([len(m) for m in members])
    expected = size[:, None] * weights / weights.sum(axis=1, keepdims=True)
    whole = np.floor(expected).astype(int)
    rank = np.argsort(np.argsort(-(expected - whole), axis=1, kind="stable"), axis=1)
    whole += rank < (size - whole.sum(axis=1))[:, None]
    pick = np.zeros(len(values), dtype=int)
    pick[np.concatenate(members)] = np.repeat(np.tile(np.arange(T), G), whole.ravel())
    return pick


def _by_type(values: np.ndarray, stop: np.ndarray, caps: np.ndarray, pick: np.ndarray) -> Solution:
    """Counts when job j may run on type ``pick[j]`` only: one exact knapsack per type."""
    J, T, _ = values.shape
    ts, ns = np.zeros(J, dtype=int), np.zeros(J, dtype=int)
    for k in range(T):
        jobs = np.flatnonzero(pick == k)
        if jobs.size:
            counts, _ = dp.solve([np.concatenate([[stop[j]], values[j, k, 1:]]) for j in jobs], int(caps[k]))
            ts[jobs], ns[jobs] = k, counts
    return Solution(_worth(values, stop, ts, ns), lambda: (ts, ns))


def warm() -> None:
    """Import what the exact MILP fallback (:func:`_milp`) needs now — SciPy's optimize and sparse modules — and not
    in the first decision that falls back to it, which would spend most of its time importing."""
    import scipy.optimize  # noqa: F401
    import scipy.sparse  # noqa: F401


def _milp(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, keep: np.ndarray,
          time_limit_s: float) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """The choices left, exactly: one integer per (group of identical jobs, type, count) kept — copies of one model
    waiting to start are interchangeable, and counting them instead of naming them spares the solver their
    symmetry — at most the group's size per group, capacity per type."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    J, T, W = V.shape
    ts = np.zeros(J, dtype=int)
    ns = np.zeros(J, dtype=int)
    groups: dict[tuple, list[int]] = {}
    for j in range(J):
        if keep[j].any():
            groups.setdefault((np.where(keep[j], V[j], -np.inf).tobytes(), float(stop[j])), []).append(j)
    members = list(groups.values())
    gg, kk, nn = [], [], []
    for g, mem in enumerate(members):
        k_, c_ = np.nonzero(keep[mem[0]])
        gg += [g] * len(k_)
        kk += k_.tolist()
        nn += c_.tolist()
    m = len(gg)
    if m == 0:
        return ts, ns, float(stop.sum()), True
    gg, kk, nn = np.array(gg), np.array(kk), np.array(nn)
    first = np.array([mem[0] for mem in members])
    gain = V[first[gg], kk, nn] - stop[first[gg]]
    size = np.array([len(mem) for mem in members], dtype=float)
    G = len(members)
    # Among equal optima prefer fewer nodes (leave them to the main workload), as the other solvers do.
    # the largest gain: a hugely negative choice (a costly move) must not swamp the tie-break
    scale = max(1.0, float(gain.max()))
    c = -(gain - 1e-9 * scale * nn)
    A = coo_matrix((np.concatenate([np.ones(m), nn.astype(float)]),
                    (np.concatenate([gg, G + kk]), np.concatenate([np.arange(m), np.arange(m)]))),
                   shape=(G + T, m)).tocsr()
    ub = np.concatenate([size, caps])
    with quiet_solver():  # HiGHS prints some messages to file descriptor 1 whatever it is told
        res = milp(c, integrality=np.ones(m), bounds=Bounds(0, size[gg]), constraints=LinearConstraint(A, -np.inf, ub),
                   options={"time_limit": max(0.01, time_limit_s), "mip_rel_gap": 1e-9})  # fmt: skip
    if res.x is None:
        return ts, ns, -np.inf, False
    take = np.rint(res.x).astype(int)
    queue = {g: list(mem) for g, mem in enumerate(members)}
    for i in np.flatnonzero(take > 0):
        for _ in range(take[i]):
            j = queue[gg[i]].pop()
            ts[j], ns[j] = kk[i], nn[i]
    rows_ = np.arange(J)
    return ts, ns, float(np.where(ns > 0, V[rows_, ts, ns], stop).sum()), res.status == 0


def solve_milp(tables: Sequence[dict[str, np.ndarray]], capacities: dict[str, int],
               time_limit_s: float = 1.0) -> tuple[list[Choice], float, bool]:
    """The whole problem as one MILP for HiGHS (no decomposition): the benchmark's reference. Returns the choices,
    the value and whether HiGHS proved it optimal."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    types = sorted(capacities)
    J = len(tables)
    entries = []
    stop = np.zeros(J)
    for j, job in enumerate(tables):
        first = next(iter(job.values()), None)
        stop[j] = float(first[0]) if first is not None else 0.0
        for k, t in enumerate(types):
            tb = job.get(t)
            if tb is None:
                continue
            for c in np.flatnonzero(np.isfinite(tb[1 : capacities[t] + 1])) + 1:
                entries.append((j, k, int(c), float(tb[c])))
    if not entries:
        return [Choice(None, 0)] * J, float(stop.sum()), True
    jj = np.array([e[0] for e in entries])
    kk = np.array([e[1] for e in entries])
    nn = np.array([e[2] for e in entries])
    gain = np.array([e[3] for e in entries]) - stop[jj]
    m = len(entries)
    # the largest gain: a hugely negative choice (a costly move) must not swamp the tie-break
    scale = max(1.0, float(gain.max()))
    A = coo_matrix((np.concatenate([np.ones(m), nn.astype(float)]),
                    (np.concatenate([jj, J + kk]), np.concatenate([np.arange(m), np.arange(m)]))),
                   shape=(J + len(types), m)).tocsr()
    ub = np.concatenate([np.ones(J), [capacities[t] for t in types]])
    with quiet_solver():
        res = milp(-(gain - 1e-9 * scale * nn), integrality=np.ones(m), bounds=Bounds(0, 1),
                   constraints=LinearConstraint(A, -np.inf, ub),
                   options={"time_limit": max(0.01, time_limit_s), "mip_rel_gap": 1e-9})
    choices = [Choice(None, 0)] * J
    value = float(stop.sum())
    if res.x is None:
        return choices, -np.inf, False
    for i in np.flatnonzero(res.x > 0.5):
        choices[jj[i]] = Choice(types[kk[i]], int(nn[i]))
        value += gain[i]
    return choices, value, res.status == 0


def _answer(types: list[str], ts: np.ndarray, ns: np.ndarray) -> list[Choice]:
    return [Choice(types[int(t)] if c > 0 else None, int(c)) for t, c in zip(ts, ns)]

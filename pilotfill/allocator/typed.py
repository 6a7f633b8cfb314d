"""Exact allocation across node types: one node price per type, reduced-cost fixing, a DP per type on the core.

With several kinds of node each job picks one type and a count on it (or
stops), and each type has its own capacity:

    max Σ_j v_j(t_j, n_j)   subject to   Σ_{j: t_j = t} n_j ≤ N_t   for every type t.

This generalises :mod:`.dp`'s core solver from one node price to one price
per type:

1. **Relax.** For prices λ_t ≥ 0 every job alone picks
   ``argmax_{t,n} v_j(t, n) − λ_t·n`` (or stops). The prices are found type by
   type (coordinate descent: each λ_t is the smallest price at which the jobs
   ask for no more nodes of t than there are, the others held), a few rounds;
   any prices give the bound ``UB(λ) = Σ_t λ_t·N_t + Σ_j max_{t,n}(v_j(t,n) − λ_t·n)``.
2. **Round.** Each job is given the type it prefers at those prices and each
   type's jobs are solved exactly by :func:`.dp.solve`: a feasible answer, ``LB``.
3. **Fix.** Every choice whose reduced cost exceeds ``UB − LB`` is in no
   optimum and is dropped (the argument of :mod:`.dp`, with a price per type).
4. **Solve the core.** When every job keeps choices on one type at most, the
   problem has fallen apart into one knapsack per type: :func:`.dp.solve` on
   each is the exact optimum. When some jobs still hesitate between types, the
   choices left are solved exactly as a small MILP (HiGHS, through SciPy).

:func:`solve_milp` is the same model solved by HiGHS without the decomposition
(one binary per job, type and count): the reference the benchmark compares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import dp
from .milp import quiet_solver

ROUNDS = 4
"""Coordinate-descent rounds over the node prices (each price found by bisection), before the subgradient steps."""
BISECTIONS = 40
DESCENT_STEPS = 150
"""Projected subgradient steps (Polyak's step length) after the coordinate rounds."""


class CoreTooLarge(ValueError):
    """Fixing left more than the MILP fallback should take on (the caller uses the full MILP or greedy)."""


@dataclass(frozen=True)
class Choice:
    """A job's answer: a type and a count (``node_type`` None and ``count`` 0: stopped)."""

    node_type: str | None
    count: int


def solve(tables: Sequence[dict[str, np.ndarray]], capacities: dict[str, int], time_limit_s: float = 1.0,
          hint: Sequence[str | None] | None = None) -> tuple[list[Choice], float, str]:  # fmt: skip
    """Exact optimum: ``tables[j][t][n]`` is job j's worth on type t at n nodes (−inf where not allowed; every
    table of a job has the same finite value at 0, stopped). ``hint``: a type per job to start from (where it
    runs now; None: no hint) — a better first answer fixes more. Returns the choices, the value and how the core
    was solved (``"dp"`` or ``"dp+milp"``)."""
    types = sorted(capacities)
    J, T = len(tables), len(types)
    if J == 0:
        return [], 0.0, "dp"
    width = max((len(tb) for job in tables for tb in job.values()), default=1)
    width = max(width, 1)
    V = np.full((J, T, width), -np.inf)
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
            V[j, k, 1:upto] = tb[1:upto]
    caps = np.array([capacities[t] for t in types], dtype=float)
    n = np.arange(width, dtype=float)

    # Every job's own best: if that fits every type, it is the optimum.
    choice_t, choice_n, best = _respond(V, stop, np.zeros(T), n)
    if all(choice_n[choice_t == k].sum() <= caps[k] for k in range(T)):
        return _answer(types, choice_t, choice_n), float(best.sum()), "dp"

    # A small machine (every type's nodes few, or the jobs torn between types few): the DP over how many nodes of
    # each type the hesitant jobs take is exact and cheaper than pricing.
    every = np.isfinite(V)
    every[:, :, 0] = False
    kinds = every.any(axis=2)
    grid = _grid(V, stop, caps, every, kinds, np.flatnonzero(kinds.sum(axis=1) > 1))
    if grid is not None:
        ts, ns, value = grid
        return _answer(types, ts, ns), value, "dp"
    hinted = None
    if hint is not None:
        index = {t: k for k, t in enumerate(types)}
        hinted = np.array([index.get(h, -1) if h is not None else -1 for h in hint])
    price = _prices(V, stop, caps, n)
    incumbent_t, incumbent_n, lower = _round(V, stop, caps, price, n, hinted)
    price, upper = _descend(V, stop, caps, n, price, lower)
    if upper - lower > 1e-9 * max(1.0, abs(upper)):
        t2, n2, low2 = _round(V, stop, caps, price, n, hinted)
        if low2 > lower:
            incumbent_t, incumbent_n, lower = t2, n2, low2

    # Reduced costs: what each choice costs against the job's best at these prices (≥ 0).
    _, _, best = _respond(V, stop, price, n)
    reduced = best[:, None, None] - (V - price[None, :, None] * n[None, None, :])
    gap = max(0.0, upper - lower)
    slack = 1e-9 * max(1.0, abs(upper), abs(lower))
    keep = np.isfinite(V) & (reduced <= gap + slack)
    keep[:, :, 0] = False
    rows = np.arange(J)
    on = incumbent_n > 0
    keep[rows[on], incumbent_t[on], incumbent_n[on]] = True  # the incumbent stays feasible in the core
    kinds = keep.any(axis=2)  # job × type: any count kept there
    hesitant = np.flatnonzero(kinds.sum(axis=1) > 1)
    if hesitant.size == 0:
        ts, ns, value = _per_type(V, stop, caps, keep, kinds)
        return _answer(types, ts, ns), value, "dp"
    grid = _grid(V, stop, caps, keep, kinds, hesitant)
    if grid is not None:
        ts, ns, value = grid
        return _answer(types, ts, ns), value, "dp"
    ts, ns, value, proven = _milp(V, stop, caps, keep, time_limit_s)
    if value < lower - slack:  # the MILP ran out of time with less than the incumbent
        return _answer(types, incumbent_t, incumbent_n), lower, "dp+milp (time limit)"
    return _answer(types, ts, ns), value, "dp+milp" if proven else "dp+milp (time limit)"


def _respond(V: np.ndarray, stop: np.ndarray, price: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each job's best (type index, count, reduced value) at ``price``; stopping is count 0 (type index 0)."""
    J, T, W = V.shape
    reduced = (V - price[None, :, None] * n[None, None, :]).reshape(J, T * W)
    flat = np.argmax(reduced, axis=1)
    value = reduced[np.arange(J), flat]
    stops = ~(value > stop)  # ties: stop (leave nodes free)
    t, k = np.divmod(flat, W)
    t = np.where(stops, 0, t)
    k = np.where(stops, 0, k)
    return t, k, np.where(stops, stop, value)


def _prices(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Node prices by coordinate descent: each type's the smallest at which the jobs want no more of it than exists."""
    J, T, W = V.shape
    price = np.zeros(T)
    gain = np.where(np.isfinite(V), V - stop[:, None, None], -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_node = np.where(n[None, None, 1:] > 0, gain[:, :, 1:] / n[None, None, 1:], -np.inf)
    top = np.nanmax(np.where(np.isfinite(per_node), per_node, -np.inf), axis=(0, 2)) if W > 1 else np.zeros(T)
    top = np.where(np.isfinite(top), np.maximum(top, 0.0), 0.0)
    for _ in range(ROUNDS):
        moved = 0.0
        for k in range(T):
            others = np.delete(np.arange(T), k)
            if others.size:
                sub = V[:, others, :] - price[others][None, :, None] * n[None, None, :]
                outside = np.maximum(stop, sub.reshape(J, -1).max(axis=1))
            else:
                outside = stop
            row = V[:, k, :]

            def demand(p: float) -> float:
                r = row - p * n[None, :]
                idx = np.argmax(r, axis=1)
                val = r[np.arange(J), idx]
                return float(np.where(val > outside, idx, 0).sum())

            if demand(0.0) <= caps[k]:
                new = 0.0
            else:
                lo, hi = 0.0, float(top[k]) + 1.0
                for _ in range(BISECTIONS):
                    mid = (lo + hi) / 2
                    if demand(mid) <= caps[k]:
                        hi = mid
                    else:
                        lo = mid
                    if hi - lo <= 1e-12 * max(1.0, hi):
                        break
                new = hi
            moved = max(moved, abs(new - price[k]) / max(1.0, new, price[k]))
            price[k] = new
        if moved < 1e-9:
            break
    return price


def _dual(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, n: np.ndarray, price: np.ndarray) -> tuple[float, np.ndarray]:
    """The Lagrangian bound at ``price`` and a subgradient (capacity minus what the jobs ask for)."""
    t, k, best = _respond(V, stop, price, n)
    demand = np.bincount(t, weights=k, minlength=len(caps))
    return float(price @ caps + best.sum()), caps - demand


def _descend(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, n: np.ndarray, price: np.ndarray, lower: float) -> tuple[np.ndarray, float]:
    """Tighten the bound from ``price`` by projected subgradient steps of Polyak's length toward the incumbent's value
    ``lower`` (coordinate descent stalls where jobs are torn between two types); the best prices seen."""
    best_price = price.copy()
    best, g = _dual(V, stop, caps, n, price)
    value = best
    for _ in range(DESCENT_STEPS):
        norm = float(g @ g)
        if norm == 0 or value - lower <= 1e-9 * max(1.0, abs(value)):
            break
        price = np.maximum(0.0, price - (value - lower) / norm * g)
        value, g = _dual(V, stop, caps, n, price)
        if value < best:
            best, best_price = value, price.copy()
    return best_price, best


def _round(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, price: np.ndarray, n: np.ndarray, hint: np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray, float]:  # fmt: skip
    """A feasible answer: a type per job, then each type's jobs solved exactly by the one-type DP.

    Types are handed out as a regret heuristic does for assignment problems: the jobs that lose most by not
    getting the type they like best at ``price`` choose first, each taking its best type that still has room
    for its best count there (``hint``: a type per job to try as well, e.g. where each runs now; −1: none).
    Then, once, jobs a full type cut short move to a type with nodes left where that pays.
    """
    J, T, W = V.shape
    reduced = V - price[None, :, None] * n[None, None, :]
    reduced[:, :, 0] = -np.inf
    per_type = reduced.max(axis=2)  # job × type: its best reduced value there
    size = reduced.argmax(axis=2)
    order_types = np.argsort(-per_type, axis=1)
    first = per_type[np.arange(J), order_types[:, 0]]
    second = per_type[np.arange(J), order_types[:, 1]] if T > 1 else np.full(J, -np.inf)
    with np.errstate(invalid="ignore"):  # −inf − −inf: a job that runs nowhere (never picked below)
        regret = np.where(np.isfinite(second), first - second, np.inf)
    wants = first > stop
    left = caps.astype(float).copy()
    pick = order_types[:, 0].copy()
    for j in np.argsort(-regret, kind="stable").tolist():
        if not wants[j]:
            continue
        for k in order_types[j].tolist():
            if not np.isfinite(per_type[j, k]) or per_type[j, k] <= stop[j]:
                break
            if size[j, k] <= left[k]:
                pick[j] = k
                left[k] -= size[j, k]
                break
    candidates = [_improve(V, stop, caps, pick)]
    if hint is not None:
        hinted = np.where(hint >= 0, hint, pick)
        candidates.append(_improve(V, stop, caps, hinted))
    return max(candidates, key=lambda c: c[2])


def _improve(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, pick: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Counts for the types ``pick`` gives (one knapsack per type), then one pass moving jobs onto nodes left."""
    J, T, W = V.shape
    pick = pick.copy()
    ts, ns = _solve_types(V, stop, caps, pick)
    rows = np.arange(J)
    used = np.bincount(ts[ns > 0], weights=ns[ns > 0], minlength=T)
    left = caps - used
    if (left > 0).any():
        now = np.where(ns > 0, V[rows, ts, ns], stop)
        moved = False
        for j in np.argsort(-(V.max(axis=(1, 2)) - now)).tolist():
            for k in np.argsort(-left).tolist():
                if (k == ts[j] and ns[j] > 0) or left[k] < 1:
                    continue
                upto = int(min(W - 1, left[k]))
                c = int(np.argmax(V[j, k, 1 : upto + 1])) + 1
                if V[j, k, c] > now[j] + 1e-12 * max(1.0, abs(now[j])):
                    if ns[j] > 0:
                        left[ts[j]] += ns[j]
                    pick[j], ts[j], ns[j], now[j] = k, k, c, V[j, k, c]
                    left[k] -= c
                    moved = True
                    break
        if moved:
            ts, ns = _solve_types(V, stop, caps, pick)
    value = float(np.where(ns > 0, V[rows, ts, ns], stop).sum())
    return ts, ns, value


def _solve_types(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, pick: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts when job j may run on type ``pick[j]`` only: one exact knapsack per type."""
    J, T, W = V.shape
    ts = np.zeros(J, dtype=int)
    ns = np.zeros(J, dtype=int)
    for k in range(T):
        members = np.flatnonzero(pick == k)
        if members.size == 0:
            continue
        tables = [np.concatenate([[stop[j]], V[j, k, 1:]]) for j in members]
        counts, _ = _knapsack(tables, int(caps[k]))
        for j, c in zip(members.tolist(), counts):
            ts[j], ns[j] = k, c
    return ts, ns


def _per_type(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, keep: np.ndarray, kinds: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, float]:  # fmt: skip
    """The core when every job keeps counts on one type at most: one exact knapsack per type."""
    J, T, W = V.shape
    ts = np.zeros(J, dtype=int)
    ns = np.zeros(J, dtype=int)
    total = 0.0
    alone = ~kinds.any(axis=1)
    total += float(stop[alone].sum())
    for k in range(T):
        members = np.flatnonzero(kinds[:, k])
        if members.size == 0:
            continue
        tables = [np.concatenate([[stop[j]], np.where(keep[j, k, 1:], V[j, k, 1:], -np.inf)]) for j in members]
        counts, value = _knapsack(tables, int(caps[k]))
        total += value
        for j, c in zip(members.tolist(), counts):
            ts[j], ns[j] = k, c
    return ts, ns, total


GRID_WORK = 5_000_000
"""Largest grid × choices the multi-dimensional DP over the hesitant jobs takes on (else the core goes to the MILP)."""


def _grid(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, keep: np.ndarray, kinds: np.ndarray, hesitant: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, float] | None:  # fmt: skip
    """The core when some jobs hesitate between types, exactly: the jobs kept on one type are one knapsack per type,
    summarised by its best value for every capacity; the hesitant ones go through a DP over how many nodes of each
    type they take together; the best split of each type between the two is the optimum. None when that grid is
    too large (the MILP then)."""
    J, T, W = V.shape
    sub = keep[hesitant]
    top = np.where(sub, np.arange(W)[None, None, :], 0).max(axis=2) if hesitant.size else np.zeros((0, T), dtype=int)
    dims = np.minimum(top.sum(axis=0), caps.astype(int)) + 1
    if int(np.prod(dims)) * int(sub.sum()) > GRID_WORK:
        return None
    firm_of = [np.flatnonzero(kinds[:, k] & (kinds.sum(axis=1) == 1)) for k in range(T)]
    choices = []  # per hesitant job: (type, count, gain over stopping)
    for j in hesitant.tolist():
        choices.append([(k, c, float(V[j, k, c] - stop[j])) for k, c in zip(*np.nonzero(keep[j]))])
    # The firm jobs of each type: their best value with at most c nodes, for every c.
    rows = []
    for k in range(T):
        tables = [np.concatenate([[stop[j]], np.where(keep[j, k, 1:], V[j, k, 1:], -np.inf)]) for j in firm_of[k]]
        rows.append(_row(tables, int(caps[k])))
    grid = np.zeros(tuple(dims))
    decisions = []
    for js in choices:
        new = grid.copy()
        pick = np.full(grid.shape, -1, dtype=np.int16)
        for i, (k, c, gain) in enumerate(js):
            if c >= dims[k]:
                continue
            dst = [slice(None)] * T
            src = [slice(None)] * T
            dst[k], src[k] = slice(c, None), slice(None, dims[k] - c)
            cand = grid[tuple(src)] + gain
            target = new[tuple(dst)]
            better = cand > target
            np.copyto(target, cand, where=better)  # views: written in place
            np.copyto(pick[tuple(dst)], i, where=better)
        grid = new
        decisions.append(pick)
    total = grid.copy()
    for k in range(T):
        rest = rows[k][int(caps[k]) - np.arange(dims[k])]  # the firm jobs get what the hesitant ones leave
        shape = [1] * T
        shape[k] = dims[k]
        total = total + rest.reshape(shape)
    at = list(np.unravel_index(int(np.argmax(total)), total.shape))
    ts = np.zeros(J, dtype=int)
    ns = np.zeros(J, dtype=int)
    used = np.array(at)
    for h in range(len(choices) - 1, -1, -1):
        i = int(decisions[h][tuple(at)])
        if i >= 0:
            k, c, _ = choices[h][i]
            j = int(hesitant[h])
            ts[j], ns[j] = k, c
            at[k] -= c
    for k in range(T):
        members = firm_of[k]
        if members.size == 0:
            continue
        tables = [np.concatenate([[stop[j]], np.where(keep[j, k, 1:], V[j, k, 1:], -np.inf)]) for j in members]
        counts, _ = _knapsack(tables, int(caps[k] - used[k]))
        for j, c in zip(members.tolist(), counts):
            ts[j], ns[j] = k, c
    rows_ = np.arange(J)
    return ts, ns, float(np.where(ns > 0, V[rows_, ts, ns], stop).sum())


SMALL_DP = 200_000
"""Below this many DP cell updates the plain DP answers a one-type knapsack faster than the core solver's pricing."""


def _knapsack(tables: list[np.ndarray], capacity: int) -> tuple[list[int], float]:
    """One type's knapsack, exactly: the plain DP when it is small, the core solver (:func:`.dp.solve`) otherwise."""
    if dp.work(tables, capacity) <= SMALL_DP:
        return dp.dense(tables, capacity)
    return dp.solve(tables, capacity)


def _row(tables: list[np.ndarray], capacity: int) -> np.ndarray:
    """The best total of ``tables`` with at most c nodes, for c = 0 … capacity (the DP's last row)."""
    row = np.zeros(capacity + 1)
    if not tables:
        return row
    row[:] = sum(float(t[0]) for t in tables)
    for t in tables:
        new = row.copy()
        for c in np.flatnonzero(np.isfinite(t[1:])) + 1:
            if c > capacity:
                break
            np.maximum(new[c:], row[: capacity + 1 - c] + (t[c] - t[0]), out=new[c:])
        row = new
    return row


def _milp(V: np.ndarray, stop: np.ndarray, caps: np.ndarray, keep: np.ndarray, time_limit_s: float) -> tuple[np.ndarray, np.ndarray, float, bool]:
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
    scale = max(1.0, float(np.abs(gain).max()))
    c = -(gain - 1e-9 * scale * nn)
    A = coo_matrix((np.concatenate([np.ones(m), nn.astype(float)]), (np.concatenate([gg, G + kk]), np.concatenate([np.arange(m), np.arange(m)]))),
                   shape=(G + T, m)).tocsr()  # fmt: skip
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


def solve_milp(tables: Sequence[dict[str, np.ndarray]], capacities: dict[str, int], time_limit_s: float = 1.0) -> tuple[list[Choice], float, bool]:
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
    scale = max(1.0, float(np.abs(gain).max()))
    A = coo_matrix((np.concatenate([np.ones(m), nn.astype(float)]), (np.concatenate([jj, J + kk]), np.concatenate([np.arange(m), np.arange(m)]))),
                   shape=(J + len(types), m)).tocsr()  # fmt: skip
    ub = np.concatenate([np.ones(J), [capacities[t] for t in types]])
    with quiet_solver():
        res = milp(-(gain - 1e-9 * scale * nn), integrality=np.ones(m), bounds=Bounds(0, 1), constraints=LinearConstraint(A, -np.inf, ub),
                   options={"time_limit": max(0.01, time_limit_s), "mip_rel_gap": 1e-9})  # fmt: skip
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

"""A node price per type for the typed solver: the Lagrangian dual of the type capacities, near its optimum, cheaply.

For prices λ ≥ 0 every job alone picks its best type and count at those prices, and

    UB(λ) = Σ_t λ_t·N_t + Σ_j max(0, max_{t,n} g_j(t, n) − λ_t·n)        (g: gain over stopping)

bounds the optimum from above. Any prices give a valid bound, so they decide only how fast :mod:`.typecore` is, not
whether it is right; but that is a lot: the smaller UB and the nearer the prices to a vertex where jobs tie, the more
choices reduced-cost fixing drops. The minimum of UB is the LP relaxation's value, a convex piecewise-linear
function of a few prices. Coordinate descent alone stalls on its ridges (jobs torn between two types: raising one
price alone sends them to the other); HiGHS finds the vertex exactly, but at an LP solve per decision. So:

1. **Smooth, then Newton.** Each job's max becomes a log-sum-exp at temperature τ: a smooth convex function whose
   gradient (capacity minus expected demand) and Hessian (a few × a few) are cheap. Newton steps with a line search,
   τ lowered tenfold per stage from a typical job's worth to a ten-thousandth of it, each stage started where the
   last one ended.
2. **Polish.** One round of exact coordinate steps (each price the smallest at which the jobs' own choices fit its
   type, the others held) moves the prices onto the vertex the smoothing approaches.

Rows stand for identical jobs (copies of a model waiting to start) with a weight: the work is per distinct job.
"""

from __future__ import annotations

import numpy as np

LOWEST = 1e-4
"""The last stage's temperature, as a share of a typical job's gain."""
STAGE_STEPS = 25
"""Newton steps at most per temperature."""
BISECTIONS = 30
"""Bisection steps of one exact coordinate step, from a bracket of ±0.1 % (relative precision far below what the
search needs)."""


def prices(gain: np.ndarray, weight: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prices per type near the LP optimum, and each row's share of each type at them (the smoothed choice: a first
    assignment to round). ``gain[g, t, n]``: row g's gain over stopping on n nodes of type t (−inf where not allowed;
    n = 0 is not read); ``weight[g]``: the identical jobs row g stands for; ``caps[t]``: nodes of type t."""
    G, T, W = gain.shape
    flat = gain.copy()
    flat[:, :, 0] = -np.inf
    flat = flat.reshape(G, T * W)
    counts = np.tile(np.arange(W, dtype=float), T)
    kind = np.repeat(np.arange(T), W)
    price = np.zeros(T)
    share = np.zeros((G, T))
    if G == 0 or not np.isfinite(flat).any():
        return price, share
    worth = np.maximum(flat.max(axis=1), 0.0)
    typical = float(weight @ worth) / float(weight.sum())
    if typical <= 0:
        return price, share
    tau = typical
    while True:
        price, probs = _newton(flat, weight, caps, counts, kind, price, tau)
        if tau <= LOWEST * typical:
            break
        tau /= 10
    share = probs.reshape(G, T, W).sum(axis=2)
    return _polish(flat, weight, caps, counts, kind, price), share


def _smoothed(flat, weight, caps, counts, kind, price, tau, derivatives: bool = True):
    """The smoothed bound at ``price`` and, with ``derivatives``, its gradient, Hessian and each row's choice
    probabilities (a trial point of the line search needs the value only)."""
    T = len(caps)
    z = (flat - price[kind] * counts) / tau
    top = np.maximum(z.max(axis=1), 0.0)  # stopping (gain 0) is a choice too
    e = np.exp(z - top[:, None])
    total = e.sum(axis=1) + np.exp(-top)
    value = float(price @ caps + tau * (weight @ (top + np.log(total))))
    if not derivatives:
        return value, None, None, None
    probs = e / total[:, None]
    weighted = probs * weight[:, None]
    by_type = (weighted * counts).reshape(len(weight), T, -1).sum(axis=2)  # expected nodes of each type, per row
    square = (weighted * (counts * counts)).sum(axis=0).reshape(T, -1).sum(axis=1)
    grad = caps - by_type.sum(axis=0)
    hess = (np.diag(square) - (by_type / weight[:, None]).T @ by_type) / tau
    return value, grad, hess, probs


def _newton(flat, weight, caps, counts, kind, price, tau):
    """Minimise the smoothed bound at temperature ``tau`` from ``price`` (prices held at 0 where the type has room)."""
    value, grad, hess, probs = _smoothed(flat, weight, caps, counts, kind, price, tau)
    for _ in range(STAGE_STEPS):
        free = ~((price <= 0) & (grad > 0))
        if not free.any():
            break
        h = hess[np.ix_(free, free)]
        step = np.zeros(len(price))
        try:
            step[free] = -np.linalg.solve(h + 1e-9 * max(float(np.trace(h)), 1e-300) * np.eye(len(h)), grad[free])
        except np.linalg.LinAlgError:
            break
        # a step so large its product overflows: the check below ends it
        with np.errstate(over="ignore", invalid="ignore"):
            decrease = -(grad @ step)
        if not np.isfinite(step).all() or decrease <= tau:  # the decrease left is below the smoothing's scale
            break
        scale = 1.0
        for _ in range(8):
            trial = np.maximum(0.0, price + scale * step)
            with np.errstate(over="ignore", invalid="ignore"):  # a trial far out overflows: no decrease, a shorter step
                tried = _smoothed(flat, weight, caps, counts, kind, trial, tau, derivatives=False)[0]
            if np.isfinite(tried) and tried < value:
                break
            scale /= 4
        else:
            break
        price = trial
        value, grad, hess, probs = _smoothed(flat, weight, caps, counts, kind, price, tau)
    return price, probs


def _polish(flat, weight, caps, counts, kind, price):
    """One round of exact coordinate steps: each type's price the smallest at which the rows' own best choices (the
    other prices held) ask for no more of its nodes than there are."""
    price = price.copy()
    for k in range(len(caps)):
        mine = kind == k
        others = flat[:, ~mine] - price[kind[~mine]] * counts[~mine]
        outside = np.maximum(others.max(axis=1), 0.0) if others.shape[1] else np.zeros(len(flat))
        row, n = flat[:, mine], counts[mine]

        def demand(p: float) -> float:
            r = row - p * n
            at = np.argmax(r, axis=1)
            return float(weight @ np.where(r[np.arange(len(r)), at] > outside, n[at], 0.0))

        if demand(0.0) <= caps[k]:
            price[k] = 0.0
            continue
        hi = max(price[k], 1e-12) * 1.001
        while demand(hi) > caps[k]:
            hi *= 2
        lo = 0.0 if demand(hi / 1.002) <= caps[k] else hi / 1.002
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            if demand(mid) <= caps[k]:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-10 * hi:
                break
        price[k] = hi
    return price

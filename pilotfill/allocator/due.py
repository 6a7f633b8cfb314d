"""Jobs that have waited past the bound run first: what keeps admission by worth from passing a slow model over for
ever.

Under admission by worth a decision weighs the waiting jobs that would add most, so a model slower than those that
keep arriving could wait for ever. The controller marks a job *due* once it has waited long enough, and keeps it due
until it ends, giving due jobs at most a share of the machine at once (``controller/waiting.py`` says how long and
how much). Here, pure: the answer is the objective's optimum among those that run the first due job (the oldest)
where it fits, and every other due job that fits beside the jobs it would not displace — each on the type and count
that serve the objective best. It is solved as the objective itself, by the same exact solvers, on tables where
running a due job earns a bonus just larger than running it could cost the others (:func:`bonus`); the problem keeps
its shape (the due jobs' minimums carved out of the capacity first made the typed search's cores much harder, and
chose their types worse). Tables in, choices out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import shares
from .typecore import Clock
from .typed import Choice


def losses(tables: Sequence[dict[str, np.ndarray]], n: int) -> np.ndarray:
    """The most each job can lose by giving up ``n`` nodes (or fewer) of the type it runs on: over every count it may
    hold, its worth there less the best worth at ``n`` fewer nodes or below (stopping included), never below 0. One
    array operation per type (a whole machine's decision weighs a thousand jobs)."""
    out = np.zeros(len(tables))
    by_type: dict[str, list[tuple[int, np.ndarray]]] = {}
    for j, job in enumerate(tables):
        for t, tb in job.items():
            if len(tb) > 1:
                by_type.setdefault(t, []).append((j, tb))
    for rows in by_type.values():
        width = max(len(tb) for _, tb in rows)
        m = np.full((len(rows), width), -np.inf)
        for k, (_, tb) in enumerate(rows):
            m[k, : len(tb)] = tb
        stop = m[:, :1]
        below = np.maximum.accumulate(m, axis=1)  # the best at each count or fewer (stopping, at 0, finite)
        fallback = np.full_like(m, -np.inf)
        fallback[:, n:] = below[:, : width - n]  # at n fewer nodes or below
        drop = np.where(np.isfinite(m), m - np.maximum(fallback, stop), -np.inf)[:, 1:]
        worst = drop.max(axis=1) if drop.shape[1] else np.zeros(len(rows))
        np.maximum.at(out, np.array([j for j, _ in rows]), np.maximum(worst, 0.0))
    return out


def _least(job: dict[str, np.ndarray]) -> dict[str, int]:
    """The least count a job may run on, per type it may run on at all."""
    out = {}
    for t, tb in job.items():
        allowed = np.flatnonzero(np.isfinite(tb[1:]))
        if allowed.size:
            out[t] = int(allowed[0]) + 1
    return out


def bonus(tables: Sequence[dict[str, np.ndarray]], due: Sequence[int],
          kept: Sequence[bool] | None = None) -> list[dict[str, np.ndarray]]:
    """``tables`` with the due jobs' (``due``: indices, the first the oldest) running counts raised by more than
    running one at its least count anywhere could cost the others: the most the jobs it would take those nodes from
    could lose (:func:`losses`: the largest of them, as many as the nodes it takes) and what it loses itself against
    stopping. One bonus B for all but the oldest, so that among answers that run as many due jobs, the one worth most
    wins; the oldest's also outweighs all of theirs, and displacing any of them. So every optimum runs the oldest where
    it fits, then as many due jobs as fit, then the most worth — beside the ``kept`` jobs, whose losses are not
    outweighed (a job being measured keeps its nodes until it reports: a move of it costs an exploring rate, some
    10¹³). Bonuses the size of the jobs' own gains leave the problem as hard as without them; bonuses larger than
    everything together made the typed search several times slower, and 10¹⁵ ones (outweighing a job being measured)
    left it nothing to pin (:func:`.typed.pin`)."""
    out = list(tables)
    if not due:
        return out
    keep = np.zeros(len(tables), dtype=bool) if kept is None else np.asarray(kept, dtype=bool)
    least = {j: _least(tables[j]) for j in due}
    lost = {n: np.where(keep, 0.0, losses(tables, n)) for n in {n for per in least.values() for n in per.values()}}

    def need(j: int) -> float:  # the others' losses count the other due jobs' growth, not their bonus
        most = 0.0
        for t, n in least[j].items():
            others = np.delete(lost[n], j)
            taken = float(np.sort(others)[-n:].sum()) if others.size else 0.0  # at most `n` jobs give up a node each
            most = max(most, taken + float(tables[j][t][0] - tables[j][t][n]))
        return max(most, 0.0) * (1 + 1e-6) + 1.0

    def raise_by(j: int, B: float) -> dict[str, np.ndarray]:
        return {t: np.concatenate([tb[:1], tb[1:] + B]) for t, tb in tables[j].items()}

    rest = list(due[1:])
    B = max((need(j) for j in rest), default=0.0)
    for j in rest:
        out[j] = raise_by(j, B)
    out[due[0]] = raise_by(due[0], need(due[0]) + 2 * B * len(rest))  # and displacing up to all of them, each losing B
    return out


def solve(tables: Sequence[dict[str, np.ndarray]], due: Sequence[int], capacities: dict[str, int],
          time_limit_s: float = 1.0, groups: Sequence[str] | None = None, kept: Sequence[bool] | None = None,
          clock: Clock | None = None, share_cost: float = shares.COST) -> tuple[list[Choice], float, str]:
    """Choices with the due jobs run first (:func:`bonus`; ``kept``: the jobs they do not displace), then the most total
    worth (``groups``: the share objective's, :func:`.shares.solve`). ``tables[j][t][n]`` as :func:`.typed.solve` takes
    them. Returns the choices, their total worth by ``tables`` (no bonus) and how it was solved. ``time_limit_s`` and
    ``clock``: each typed solve's (:func:`.typed.solve`). May raise :class:`.dp.TooLarge` (the caller's fallback)."""
    weighted = bonus(tables, due, kept)
    if groups is not None and len(set(groups)) > 1:
        choices, _, how = shares.solve(weighted, groups, capacities, time_limit_s, clock, share_cost, plain=tables)
    else:
        choices, how = shares.exact(weighted, {t: int(n) for t, n in capacities.items()}, time_limit_s, clock)
    value = shares.worth(tables, choices)
    return choices, value, "due-" + how

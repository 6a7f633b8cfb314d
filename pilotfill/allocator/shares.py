"""The share objective: every group (a campaign, a user, a model family) first gets what its own share of the
machine would give it; then the nodes no share uses go where they earn most.

Maximising total worth (BFTrainer's objective, :func:`.solve.allocate`'s default) gives every fast node to the
models with the most samples per second: on a typed machine a family whose models gain little from a V100 may
finish a few of its jobs in a week. A site sharing its idle nodes among users, or a user sweeping several models,
expects each group a share. The guarantee here is the *sharing incentive* (DRF, Gavel's isolated share): no group
does worse than it would on its own 1/G of every node type, G the groups with jobs in the decision.

Two stages, each exact with the solvers the samples objective uses (:func:`.dp.solve` on one type,
:func:`.typed.solve` across types):

1. **Shares.** Each type's nodes are split evenly among the groups whose jobs can use that type (the remainder one
   node each to groups in turn, starting at a different group for each type). Each group's jobs are allocated on
   its share alone, to their most total worth: that is what the group is guaranteed.
2. **The rest.** The nodes the groups leave unused go to all jobs at once, to the most total worth on top of stage
   1: a job given nodes in stage 1 may grow on that type, a job given none may start on any type. Stage 1's choices
   stand, so every group keeps at least its share's optimum, and no node a job would gain from is left idle.

The price is total worth, and it is bounded: the shares are cut from the largest fraction of the machine whose answer
keeps at least ``1 - cost`` of the samples objective's gain (``[controller] share_cost``, :data:`COST` by default), so
a group whose nodes earn little gets what that much of the samples buys, not its whole share (``cost`` 1: whole
shares, the sharing incentive above). ``bench_hetero`` and ``bench_replay`` print both objectives. Pure: tables in,
choices out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import dp, typed
from .typecore import Clock
from .typed import Choice


def split(capacities: dict[str, int], users: dict[str, set[str]]) -> dict[str, dict[str, int]]:
    """``{group: {type: nodes}}``: each type's nodes evenly among the groups that can use it (``users[type]``).
    The remainder goes one node each to groups in name order, from a different first group for each type (so one
    group does not take every type's extra node)."""
    out: dict[str, dict[str, int]] = {}
    for k, t in enumerate(sorted(capacities)):
        members = sorted(users.get(t, ()))
        if not members:
            continue
        whole, extra = divmod(int(capacities[t]), len(members))
        for i, g in enumerate(members):
            out.setdefault(g, {})[t] = whole + (1 if (i - k) % len(members) < extra else 0)
    return out


COST = 0.03
"""The most of a decision's samples optimum (its gain over stopping every job) the share objective gives up by
default: ``[controller] share_cost``; docs/sites.md says why this much."""
STEPS = 3
"""Halvings of the shared fraction tried after the whole machine's shares cost too much."""
SEARCH_S = 0.04
"""The most time (on the solve's ``clock``) the shares may take beyond the samples optimum: each fraction tried solves
every group's share, typed ones included, and a decision has a time target; past it the best answer found stands."""


def solve(
    tables: Sequence[dict[str, np.ndarray]],
    groups: Sequence[str],
    capacities: dict[str, int],
    time_limit_s: float = 1.0,
    clock: Clock | None = None,
    cost: float = COST,
    plain: Sequence[dict[str, np.ndarray]] | None = None,
) -> tuple[list[Choice], float, str]:
    """Choices under the share objective: ``tables[j][t][n]`` as :func:`.typed.solve` takes them (every table of a
    job the same finite value at 0: stopped), ``groups[j]`` job j's group. Returns the choices, their total worth
    and how it was solved. ``time_limit_s`` and ``clock``: each typed solve's (:func:`.typed.solve`). May raise
    :class:`.dp.TooLarge` (the caller's fallback).

    ``cost`` bounds the price: the answer's gain over stopping every job is at least ``1 - cost`` of the samples
    optimum's. The shares are cut from the largest fraction of the machine that keeps to it (the whole machine,
    else a half, a quarter, an eighth; none: the samples optimum), so where the groups' shares cost little every group
    gets its whole share, and where one group's nodes earn far more than another's the shares shrink to what the bound
    allows. The fractions are tried for :data:`SEARCH_S` on ``clock`` at most. ``cost`` 1: whole shares, whatever
    they cost (and however long they take).

    ``plain``: the jobs' own worth where ``tables`` add bonuses to it (:mod:`.due`): the price is measured on what
    the jobs earn, not on the bonuses, and an answer must earn every bonus the samples optimum earns, so a due job is
    never traded for samples."""
    J = len(tables)
    if J == 0:
        return [], 0.0, "share"
    users: dict[str, set[str]] = {}
    for job, g in zip(tables, groups):
        for t, tb in job.items():
            if t in capacities and np.isfinite(tb[1 : capacities[t] + 1]).any():
                users.setdefault(t, set()).add(g)
    if cost >= 1:
        whole, how = shared(tables, groups, capacities, users, 1.0, time_limit_s, clock)
        return whole, worth(tables, whole), label(how)
    best, best_how = exact(tables, capacities, time_limit_s, clock)
    plain = tables if plain is None else plain
    stopped = sum(float(next(iter(tb.values()))[0]) for tb in plain)
    own = worth(plain, best)
    floor = stopped + (1 - cost) * (own - stopped)
    promised = 0.0 if plain is tables else worth(tables, best) - own  # the bonuses the samples optimum earns
    deadline = clock() + SEARCH_S if clock is not None else None
    lo, hi = 0.0, 1.0  # the largest fraction known to keep to the bound, the smallest known not to
    for fraction in (1.0, *([None] * STEPS)):
        fraction = fraction if fraction is not None else (lo + hi) / 2
        answer = shared(tables, groups, capacities, users, fraction, time_limit_s, clock, deadline)
        if answer is None:
            break  # out of time: the best found stands
        picked, method = answer
        own = worth(plain, picked)
        # a due job dropped loses its bonus (at least 1: :func:`.due.bonus`), far beyond the rounding allowed for here
        kept = plain is tables or worth(tables, picked) - own >= promised - 1e-9 * abs(promised)
        if own >= floor and kept:
            lo, best, best_how = fraction, picked, method
            if fraction == 1.0:
                break
        else:
            hi = fraction
    return best, worth(tables, best), label(best_how) if lo == 1.0 else f"{label(best_how)} ({lo:g} shared)"


def shared(tables: Sequence[dict[str, np.ndarray]], groups: Sequence[str], capacities: dict[str, int],
           users: dict[str, set[str]], fraction: float, time_limit_s: float, clock: Clock | None,
           deadline: float | None = None) -> tuple[list[Choice], str] | None:  # fmt: skip
    """The two stages (the module docstring) with ``fraction`` of each type's nodes cut into shares; None where
    ``clock`` passed ``deadline`` before they were done."""
    J = len(tables)
    shares = split({t: int(fraction * n) for t, n in capacities.items()}, users)
    choices: list[Choice] = [Choice(None, 0)] * J
    how = set()
    for g in sorted(set(groups)):
        if deadline is not None and clock is not None and clock() > deadline:
            return None
        members = [j for j in range(J) if groups[j] == g]
        share = shares.get(g)
        if not share or not any(share.values()):
            continue  # none of its jobs can run on any type: they wait for the rest (stage 2 finds none either)
        picked, method = exact([tables[j] for j in members], share, left_of(time_limit_s, clock, deadline), clock)
        how.add(method)
        for j, c in zip(members, picked):
            choices[j] = c
    left = {t: int(capacities[t]) - sum(c.count for c in choices if c.node_type == t) for t in capacities}
    if any(n > 0 for n in left.values()):
        if deadline is not None and clock is not None and clock() > deadline:
            return None
        rest = [on_top(tables[j], choices[j], left) for j in range(J)]
        extra, method = exact(rest, left, left_of(time_limit_s, clock, deadline), clock)
        how.add(method)
        choices = [plus(c, e) for c, e in zip(choices, extra)]
    return choices, "+".join(sorted(how))


def left_of(time_limit_s: float, clock: Clock | None, deadline: float | None) -> float:
    """A typed solve's time limit within the search's ``deadline``
    (a few ms at least: it answers with the best found)."""
    if deadline is None or clock is None:
        return time_limit_s
    return min(time_limit_s, max(0.005, deadline - clock()))


def label(how: str) -> str:
    """How a share answer was solved, as the allocation's method says it."""
    return "share-" + how if how else "share"


def worth(tables: Sequence[dict[str, np.ndarray]], choices: Sequence[Choice]) -> float:
    """The total worth of ``choices`` by ``tables``."""
    return sum(
        float(tables[j][c.node_type][c.count]) if c.count else float(next(iter(tables[j].values()))[0])
        for j, c in enumerate(choices)
    )


def exact(
    tables: list[dict[str, np.ndarray]], capacities: dict[str, int], time_limit_s: float, clock: Clock | None = None
) -> tuple[list[Choice], str]:
    """The most total worth of ``tables`` on ``capacities`` (one type: the DP; several: the typed solver, its time
    limit read on ``clock``)."""
    kinds = [t for t, n in capacities.items() if n > 0]
    if len(kinds) == 1:
        t = kinds[0]
        cap = int(capacities[t])
        rows = [tb[t][: cap + 1] if t in tb else next(iter(tb.values()))[:1] for tb in tables]
        counts, _ = dp.solve(rows, cap)
        return [Choice(t, n) if n else Choice(None, 0) for n in counts], "dp"
    if not kinds:
        return [Choice(None, 0)] * len(tables), "dp"
    picked, _, method = typed.solve(tables, {t: capacities[t] for t in kinds}, time_limit_s, clock=clock)
    return picked, method.split(" ")[0]


def on_top(table: dict[str, np.ndarray], first: Choice, left: dict[str, int]) -> dict[str, np.ndarray]:
    """Job's worth in stage 2, by the nodes added to its stage-1 choice: on its type only where it has nodes (index
    0: what stage 1 gave it), on any type where it has none."""
    if first.count == 0:
        return {t: tb[: left[t] + 1] for t, tb in table.items() if t in left}
    tb = table[first.node_type]
    return {first.node_type: tb[first.count : first.count + left[first.node_type] + 1]}


def plus(first: Choice, extra: Choice) -> Choice:
    """A stage-1 choice with what stage 2 added on top of it."""
    if extra.count == 0:
        return first
    return Choice(extra.node_type, first.count + extra.count)

"""Jobs that have waited past the bound start first: what keeps admission by worth from passing a slow model over
for ever.

Under admission by worth a decision weighs the waiting jobs that would add most, so a model slower than those that
keep arriving could wait for ever. The controller marks a job *due* once it has waited long enough, and keeps it due
until it ends, giving due jobs at most a share of the machine at once (``controller/waiting.py`` says how long and
how much). Here, pure: the due jobs, in the order given (submission order), each get their minimum first — on the type
they run on, else on the type where that minimum is worth most — while it fits; then every job, the due ones growing
on their type, is allocated the rest exactly, by the objective's own solver, on top of that. What it costs the
samples objective is what those minimums would have earned elsewhere: bounded by the share the controller gives.
Tables in, choices out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import shares
from .typed import Choice


def minimum(table: np.ndarray) -> int | None:
    """The least positive count a table allows (None: none)."""
    allowed = np.flatnonzero(np.isfinite(table[1:]))
    return int(allowed[0]) + 1 if allowed.size else None


def place(tables: Sequence[dict[str, np.ndarray]], due: Sequence[int], running: Sequence[str | None], capacities: dict[str, int]) -> list[Choice]:
    """The first stage: each due job (``due``: indices, in order) at its minimum, where it fits — on the type it runs
    on (``running[j]``) if it can stay there, else on the type whose table values that minimum most (the first such
    type by name among equals); a due job that fits nowhere waits for the next decision."""
    left = {t: int(n) for t, n in capacities.items()}
    out = [Choice(None, 0)] * len(tables)
    for j in due:
        options = []
        for t, tb in tables[j].items():
            lo = minimum(tb)
            if lo is not None and lo <= left.get(t, 0):
                options.append((t != running[j], -float(tb[lo]), t, lo))
        if options:
            _, _, t, lo = min(options)
            out[j] = Choice(t, lo)
            left[t] -= lo
    return out


def solve(tables: Sequence[dict[str, np.ndarray]], due: Sequence[int], running: Sequence[str | None], capacities: dict[str, int],
          time_limit_s: float = 1.0, groups: Sequence[str] | None = None) -> tuple[list[Choice], float, str]:  # fmt: skip
    """Choices with the due jobs first (:func:`place`), then the most total worth of every job on what is left, on top
    (``groups``: the share objective's, each group its share of what is left first: :func:`.shares.solve`).
    ``tables[j][t][n]`` as :func:`.typed.solve` takes them. Returns the choices, their total worth and how it was
    solved. May raise :class:`.dp.TooLarge` (the caller's fallback)."""
    first = place(tables, due, running, capacities)
    left = {t: int(n) - sum(c.count for c in first if c.node_type == t) for t, n in capacities.items()}
    rest = [shares.on_top(tb, c, left) for tb, c in zip(tables, first)]
    if groups is not None and len(set(groups)) > 1:
        extra, _, how = shares.solve(rest, groups, left, time_limit_s)
    else:
        extra, how = shares.exact(rest, left, time_limit_s)
    choices = [shares.plus(c, e) for c, e in zip(first, extra)]
    value = sum(float(tables[j][c.node_type][c.count]) if c.count else float(next(iter(tables[j].values()))[0]) for j, c in enumerate(choices))
    return choices, value, "due-" + how

"""The typed problem on a small machine, exactly: a DP over how many nodes of every type the jobs take.

When few nodes are idle (tens of each type) and hundreds of jobs want them, the LP relaxation is loose — a job
of 8 nodes is worth its fraction there — so the bound-driven search of :mod:`.typecore` has little to prune, while
the grid of node counts per type is small: a few thousand cells, or some ten thousand with a few thousand choices.
Then the plain DP over that grid, one shifted maximum per job and choice, is exact and cheaper than pricing and
searching, and its cost is known before it starts (:func:`fits`).
"""

from __future__ import annotations

import math

import numpy as np

CELLS = 5_000
"""A grid (∏ (nodes of a type + 1)) this small the DP always takes on..."""
WORK = 30_000_000
"""...and a larger one while its cell updates (choices worth more than stopping × cells) are at most this many:
about half a decision's 100 ms at :data:`UPDATE_S`, where the typed replay's hardest decisions cost the pricing and
search more than the grid. (Past a few million updates :func:`.typed.solve` tries a short search first: where the
bound is tight it proves the optimum sooner.)"""


UPDATE_S = 1.8e-9
"""What a cell update is taken to cost, in seconds: a solve with a time limit of t seconds takes the grid on at most
t / this many updates."""


def fits(caps: np.ndarray, values: np.ndarray | None = None, stop: np.ndarray | None = None) -> bool:
    """Whether the grid of node counts per type is small enough for :func:`solve`: ``values``/``stop`` (as
    :func:`solve` takes them) count its work, for a grid above :data:`CELLS`."""
    if values is None or stop is None:
        return float(np.prod(caps + 1)) <= CELLS
    return work(caps, values, stop) <= WORK


def work(caps: np.ndarray, values: np.ndarray, stop: np.ndarray) -> float:
    """The cell updates :func:`solve` would make (0 for a grid of at most :data:`CELLS`, which it always takes on;
    infinite past :data:`WORK` where counting them is not worth it)."""
    cells = float(np.prod(caps + 1))
    if cells <= CELLS:
        return 0.0
    if cells > WORK:
        return math.inf
    return cells * int(_allowed(values - stop[:, None, None], caps).sum())


def _allowed(gain: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """The choices :func:`solve` visits for each cell: worth more than stopping (``gain`` over it), on at most a
    type's nodes (a choice worse than stopping never helps)."""
    W = gain.shape[2]
    return (gain > 0) & (np.arange(W) > 0) & (np.arange(W) < (caps + 1)[:, None])


def solve(values: np.ndarray, stop: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A type index and a count per job (count 0: stopped) maximising the total: ``values[j, t, n]`` is job j's worth
    on n nodes of type t (−inf where not allowed; n = 0 unused), ``stop[j]`` its worth stopped."""
    J, T, W = values.shape
    dims = tuple(int(c) + 1 for c in caps)
    gain = values - stop[:, None, None]
    allowed = _allowed(gain, np.asarray(caps, dtype=int))
    j_, t_, n_ = np.nonzero(allowed)
    cuts = np.searchsorted(j_, np.arange(J + 1))
    g_ = gain[j_, t_, n_].tolist()
    t_, n_ = t_.tolist(), n_.tolist()
    moves = [list(zip(t_[a:b], n_[a:b], g_[a:b])) for a, b in zip(cuts[:-1], cuts[1:])]  # per job: (type, count, gain)
    shift = {}
    for t in range(T):
        for n in range(1, dims[t]):
            to, frm = [slice(None)] * T, [slice(None)] * T
            to[t], frm[t] = slice(n, None), slice(None, dims[t] - n)
            shift[t, n] = tuple(to), tuple(frm)
    grid = np.full(dims, -np.inf)
    grid[(0,) * T] = 0.0  # exactly these nodes used
    grids = [grid]
    for j in range(J):
        if moves[j]:
            new = grid.copy()  # stopped
            for t, n, g in moves[j]:
                to, frm = shift[t, n]
                np.maximum(new[to], grid[frm] + g, out=new[to])
            grid = new
        grids.append(grid)
    # Back from the best cell: each job's choice is one that reaches it from the grid before it.
    cell = np.array(np.unravel_index(int(np.argmax(grid)), dims))
    types, counts = np.zeros(J, dtype=int), np.zeros(J, dtype=int)
    for j in range(J - 1, -1, -1):
        here = grids[j + 1][tuple(cell)]
        if grids[j][tuple(cell)] == here:
            continue  # stopped (on a tie too: the nodes stay free)
        for t, n, g in moves[j]:
            before = cell.copy()
            before[t] -= n
            if before[t] >= 0 and grids[j][tuple(before)] + g == here:
                types[j], counts[j], cell = t, n, before
                break
    return types, counts

"""The waiting jobs, described once per change of theirs, not once per decision.

On a saturated machine thousands of jobs wait, and every decision asks the
same three questions of each: is it admitted (by what starting it would add,
or in submission order: ``[controller] admission``, while the ``min_nodes`` of
those before it fit in the room), which others is it alike (the allocator
cannot tell them apart: weighed a few at a time), and what would a node earn
it (the most promising are weighed first)? A waiting job's answers change
only when the job does (the world says which: its status, nodes, spec or
progress) or when JPA's curves for it move (its profiler version).
:class:`WaitingJobs` keeps them in arrays in submission order and describes
again only those jobs (a worth only once a decision ranks the job); a
decision reads the arrays in a few array operations, whatever the length of
the queue. The pilots' question asks two more of each (would it gain from one
node alone, and what would a rescale of it cost), kept the same way.
``admit`` is the one rule of admission, shared with :meth:`.World.active_jobs`
(which admits in submission order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..lifecycle import JobStatus

if TYPE_CHECKING:
    from .world import Job, World

LIKE_NO_OTHER = -1
"""The kind of a waiting job the allocator can tell apart from every other
(it ran, has progress, or JPA measured it)."""
HOLDS_NODES = -2
"""The kind of an open job that is not running but holds nodes: weighed whenever admitted, as a running job."""
_UNMADE = object()
"""A job's traits not asked for yet (None is an answer: the allocator cannot use the job)."""
OVERDUE_S = 24 * 3600.0
"""Under admission by worth, a job that has waited this long is *due*: it runs first (the oldest due job before all
others), and keeps that until it ends (:mod:`..allocator.due`); docs/sites.md says why this long."""
DUE_SHARE = 1 / 16
"""The most of the nodes that could be had that due jobs' minimums take at once (the first due job always): what the
rule may cost the samples objective."""
VALUED_PER_PASS = 256
"""Waiting jobs valued at most in one admission: a campaign of thousands submitted at once is valued over a few passes
(those not valued yet are taken after the valued ones, in submission order), not in one."""


def admit(min_nodes: np.ndarray, room: int | None, limit: int, running: int, groups: list[str] | None = None,
          order: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Positions (in submission order) of the waiting jobs admitted to a decision, given each one's ``min_nodes``.

    What bounds them is the machine, not a number: with ``room`` (the nodes
    that could be had now), waiting jobs are admitted in ``order`` (positions:
    :func:`worth_order`; by default submission order) while their ``min_nodes``
    together fit in it — no more could start at once, and a job never
    overtakes one before it in that order that could run — and one whose
    ``min_nodes`` alone exceeds it takes no place, so a job nothing can place
    never blocks the rest. ``limit`` > 0 instead admits at most that many jobs
    in all, the ``running`` ones included (BFTrainer's setup: 10 at once).
    ``groups`` (the share objective: each job's group) admits besides the jobs that taking the groups in turns admits
    — each one's first in that order, then each one's second, … (:func:`in_turns`) —
    so that a group that submitted later, or whose jobs are worth less, is not left behind another's backlog,
    while the jobs the samples objective would weigh are still weighed
    (the share objective's price is bounded against them: :func:`..allocator.shares.solve`;
    with a ``limit``, in turns alone); the positions come back in submission order."""
    lo = np.asarray(min_nodes, dtype=np.int64)
    place = np.arange(len(lo)) if order is None else np.asarray(order, dtype=np.int64)
    if room is not None:
        place = place[lo[place] <= room]

    def taken(place: np.ndarray) -> np.ndarray:
        if limit:
            return place[: max(0, limit - running)]
        if room is None:
            return place
        return place[: int(np.searchsorted(np.cumsum(lo[place]), room, side="right"))]

    if groups is not None and len(place):
        turns = taken(place[in_turns([groups[i] for i in place.tolist()])])
        # a limit is a number of jobs: in turns alone
        return np.sort(turns) if limit else np.union1d(taken(place), turns)
    return np.sort(taken(place)) if order is not None else taken(place)


def worth_order(worth: np.ndarray, due: np.ndarray) -> np.ndarray:
    """The order admission by worth takes the waiting jobs in (positions; ``worth``: one row per job in submission
    order, :func:`most_promising`'s two columns, NaN where not valued yet): the ``due`` ones first, in submission
    order (they start first: no job is passed over for ever), then by worth — what a node would earn each, by the
    curve the allocator confirms, then by the one it explores — earlier submissions first among equals, and those not
    valued yet last, in submission order."""
    n = len(worth)
    at = np.arange(n)
    unknown = np.isnan(worth[:, 0])
    first = np.where(due, 0, np.where(unknown, 2, 1))
    key = np.where(first[:, None] == 1, worth, 0.0)  # overdue and unvalued jobs: submission order alone
    return at[np.lexsort((at, -key[:, 1], -key[:, 0], first))]


@dataclass(frozen=True)
class Admitted:
    """The waiting jobs admitted to one decision, in submission order, with their kinds and where they are among the
    queue's rows (:meth:`WaitingJobs.most_promising` reads their worth there)."""

    jobs: list[Job]
    kinds: np.ndarray
    rows: np.ndarray


class WaitingJobs:
    """The open jobs that are not running, each described when it changes (see the module docstring), as rows in
    submission order: a job joining or leaving the queue is one row inserted or deleted, not the queue sorted again.

    ``kind_of`` and ``worth_of`` say what a decision asks of a job (its kind: a number shared by the jobs alike, or
    :data:`LIKE_NO_OTHER`, :data:`HOLDS_NODES`; its worth per node, by the curve the allocator confirms and by the one
    it explores); ``traits_of`` what the pilots' question asks of it (:meth:`traits`); ``version`` what those rest
    on beyond the job itself (JPA's version of it, and on a machine with several kinds of node what the types say of
    it). A kind is made when the job changes; a worth and traits only when first asked (a campaign of a thousand jobs
    submitted at once is not valued in one pass), and kept until the job changes. Each row also keeps since when its
    job has waited (its submission, or its last stop): what admission by worth bounds (:data:`OVERDUE_S`)."""

    def __init__(
        self,
        kind_of: Callable[[Job], int],
        worth_of: Callable[[Job], tuple[float, float]],
        version: Callable[[Job], object],
        traits_of: Callable[[Job], tuple[bool, float] | None],
    ):
        self._kind_of = kind_of
        self._worth_of = worth_of
        self._version = version
        self._traits_of = traits_of
        # job -> [job, kind, worth or None, version, traits or _UNMADE, waiting since]
        self._entries: dict[str, list] = {}
        self._jobs: list[Job] = []  # the rows, in submission order
        self._seq = np.zeros(0, dtype=np.int64)
        self._lo = np.zeros(0, dtype=np.int64)
        self._kinds = np.zeros(0, dtype=np.int64)
        self._worth = np.zeros((0, 2))  # NaN: not valued yet
        self._since = np.zeros(0)

    def sync(self, world: World, changed: Iterable[str], recheck: bool, now: float = 0.0) -> None:
        """Take in the jobs ``changed`` since the last sync (the world's record, JPA's); ``recheck``: compare every
        row's version too (one lookup per waiting job, not a new description). ``now``: when a job that ran and
        stopped began waiting again (one never started has waited since its submission)."""
        entries = self._entries
        stale = set(changed)
        if recheck:
            version = self._version
            stale.update(job_id for job_id, entry in entries.items() if version(entry[0]) != entry[3])
        gone: list[int] = []  # the seqs of the rows to delete
        made: list[list] = []  # the rows to insert
        for job_id in stale:
            old = entries.pop(job_id, None)
            if old is not None:
                gone.append(old[0].seq)
            job = world.open.get(job_id)
            if job is None or job.status == JobStatus.RUNNING:
                continue
            since = old[5] if old is not None else job.submitted if not job.launches else now
            entry = entries[job_id] = [job, self._kind_of(job), None, self._version(job), _UNMADE, since]
            made.append(entry)
        if len(gone) + len(made) > 16 + len(entries) // 8:  # many at once (a campaign submitted, a wave of stops)
            self._rows(sorted(entries.values(), key=lambda entry: entry[0].seq))
        elif gone or made:
            self._delete(np.searchsorted(self._seq, np.array(sorted(gone), dtype=np.int64)))
            self._insert(sorted(made, key=lambda entry: entry[0].seq))

    @staticmethod
    def _worth_row(entry: list) -> tuple[float, float]:
        return entry[2] if entry[2] is not None else (math.nan, math.nan)

    def _rows(self, rows: list[list]) -> None:
        self._jobs = [entry[0] for entry in rows]
        self._seq = np.fromiter((job.seq for job in self._jobs), dtype=np.int64, count=len(rows))
        self._lo = np.fromiter((job.spec["min_nodes"] for job in self._jobs), dtype=np.int64, count=len(rows))
        self._kinds = np.fromiter((entry[1] for entry in rows), dtype=np.int64, count=len(rows))
        self._worth = np.array([self._worth_row(entry) for entry in rows], dtype=float).reshape(len(rows), 2)
        self._since = np.fromiter((entry[5] for entry in rows), dtype=float, count=len(rows))

    def _delete(self, at: np.ndarray) -> None:
        if at.size:
            for i in sorted(at.tolist(), reverse=True):
                del self._jobs[i]
            self._seq, self._lo, self._kinds = (
                np.delete(self._seq, at),
                np.delete(self._lo, at),
                np.delete(self._kinds, at),
            )
            self._worth = np.delete(self._worth, at, axis=0)
            self._since = np.delete(self._since, at)

    def _insert(self, rows: list[list]) -> None:
        if not rows:
            return
        seq = np.fromiter((entry[0].seq for entry in rows), dtype=np.int64, count=len(rows))
        at = np.searchsorted(self._seq, seq)
        for i, entry in sorted(zip(at.tolist(), rows), key=lambda x: (x[0], x[1][0].seq), reverse=True):
            self._jobs.insert(i, entry[0])
        self._seq = np.insert(self._seq, at, seq)
        self._lo = np.insert(self._lo, at, [entry[0].spec["min_nodes"] for entry in rows])
        self._kinds = np.insert(self._kinds, at, [entry[1] for entry in rows])
        self._worth = np.insert(
            self._worth,
            at,
            np.array([self._worth_row(entry) for entry in rows], dtype=float).reshape(len(rows), 2),
            axis=0,
        )
        self._since = np.insert(self._since, at, [entry[5] for entry in rows])

    def kind(self, job: Job) -> int | None:
        """``job``'s kind as of the last sync (None: not waiting)."""
        entry = self._entries.get(job.id)
        return entry[1] if entry is not None else None

    def traits(self, job: Job) -> tuple[bool, float] | None:
        """Whether ``job`` would gain from one node alone and what a rescale of it costs (its scale-up and scale-down
        seconds): ``traits_of``'s answer, made when first asked and kept until the job changes (None: the allocator
        cannot use the job). A job not waiting as of the last sync is asked anew."""
        entry = self._entries.get(job.id)
        if entry is None or entry[0] is not job:
            return self._traits_of(job)
        if entry[4] is _UNMADE:
            entry[4] = self._traits_of(job)
        return entry[4]

    def admitted(self, room: int | None, limit: int, running: int, by_group: bool = False, by_worth: bool = False,
                 due: Iterable[int] = ()) -> Admitted:  # fmt: skip
        """The waiting jobs :func:`admit` admits, with their kinds (``by_group``: the groups in turns). ``by_worth``:
        taken in the order :func:`worth_order` gives (the jobs whose seqs are ``due`` first, then by what a node would
        earn each), not in submission order; each job is valued the first time (:data:`VALUED_PER_PASS` at most)."""
        groups = [job.spec.get("group", "") for job in self._jobs] if by_group else None
        order = None
        if by_worth and len(self._jobs):
            self._value(np.flatnonzero(np.isnan(self._worth[:, 0]))[:VALUED_PER_PASS])
            order = worth_order(self._worth, np.isin(self._seq, np.fromiter(due, dtype=np.int64)))
        at = admit(self._lo, room, limit, running, groups, order)
        jobs = self._jobs
        return Admitted([jobs[i] for i in at.tolist()], self._kinds[at], at)

    def most_promising(self, admitted: Admitted, at: np.ndarray) -> np.ndarray:
        """Positions ``at`` among ``admitted`` (in submission order) reordered so that the jobs whose nodes would earn
        most come first (:func:`most_promising`), each valued the first time it is ranked."""
        rows = admitted.rows[at]
        self._value(rows[np.isnan(self._worth[rows, 0])])
        return most_promising(at, self._worth[rows])

    def _value(self, rows: np.ndarray) -> None:
        """Each of ``rows`` valued (``worth_of``), kept in its entry until its job changes."""
        worth = self._worth
        for row in rows.tolist():
            entry = self._entries[self._jobs[row].id]
            entry[2] = self._worth_of(entry[0])
            worth[row] = entry[2]

    def overdue(self, before: float) -> Iterator[Job]:
        """The waiting jobs that have waited since ``before`` or longer, in submission order."""
        jobs = self._jobs
        return (jobs[i] for i in np.flatnonzero(self._since <= before).tolist())


def in_turns(groups: list[str]) -> np.ndarray:
    """An order of ``groups``' positions that takes each group's first, then each group's second, and so on, keeping
    the given order within a group and among one turn: under the share objective a decision that weighs only the
    most promising waiting jobs weighs every group's most promising, not the fastest group's alone."""
    turn: dict[str, int] = {}
    rank = np.empty(len(groups), dtype=np.int64)
    for i, g in enumerate(groups):
        rank[i] = turn[g] = turn.get(g, -1) + 1
    return np.lexsort((np.arange(len(groups)), rank))


def most_promising(at: np.ndarray, worth: np.ndarray) -> np.ndarray:
    """Positions ``at`` (in submission order) reordered so that the jobs whose nodes would earn most come first (by the
    confirmed curve, then by the explored one: ``worth``'s two columns, one row per entry of ``at``), earlier
    submissions first among equals."""
    return at[np.lexsort((at, -worth[:, 1], -worth[:, 0]))]

"""The life cycles of jobs, pilots and nodes: their states as ``str`` enums and the moves each may make.

A state is a ``str`` (``JobStatus.RUNNING == "running"``), so the journal's rows, the protocol's messages and
old run directories are unchanged; what the enums add is that a move the table does not list is a bug that
raises :class:`IllegalMove` where it happens, instead of a world that quietly disagrees with itself later.
Modelled on dask's ``_TRANSITIONS_TABLE`` and torch elastic's ``WorkerState``.

Jobs::

    pending ──► running ──► finished | failed | cancelled
       ▲           │
       └───────────┘  (stopped: its nodes taken, a rank crashed, the controller restarted)

Pilots (ended and lost pilots leave memory)::

    queued ──► running ──► leaving ──► ended | lost
       ▲          │           │
       └──────────┴───────────┘  (the batch system requeued it)

Nodes: ``ready ──► leaving ──► gone`` (or ``ready ──► gone`` when taken at once); a node that
comes back is a new node.

The campaign's lease, as an agent reads it (:mod:`pilotfill.lease`): ``running ──► ended | gone``, or ``none``.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class PilotState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    LEAVING = "leaving"
    ENDED = "ended"
    LOST = "lost"


class NodeState(StrEnum):
    READY = "ready"
    LEAVING = "leaving"
    GONE = "gone"


class LeaseState(StrEnum):
    """The campaign's lease as a reader sees it; ``running`` and ``ended`` are what the lease file says."""

    RUNNING = "running"
    ENDED = "ended"  # ``pilotfill run`` marked it ended
    GONE = "gone"  # not renewed for the reader's deadline, by its own clock
    NONE = "none"  # never seen: a controller without ``pilotfill run``


class Removal(StrEnum):
    """Where ``remove_nodes`` takes nodes: out of the pool — ``leaving`` (gone within the grace) or ``gone`` — or
    only off their job (``dropped``: a rank crashed; the node stays ours, ready)."""

    LEAVING = "leaving"
    GONE = "gone"
    FROM_JOB = "dropped"


TERMINAL: tuple[JobStatus, ...] = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED)
LIVE_PILOT_STATES: tuple[PilotState, ...] = (PilotState.QUEUED, PilotState.RUNNING, PilotState.LEAVING)

_ENDS = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED}
JOB_MOVES: dict[JobStatus, frozenset[JobStatus]] = {
    # pending -> pending: requeued again (a recovery, a start that failed before it ran); running -> running: rescaled
    JobStatus.PENDING: frozenset({JobStatus.PENDING, JobStatus.RUNNING, *_ENDS}),
    JobStatus.RUNNING: frozenset({JobStatus.PENDING, JobStatus.RUNNING, *_ENDS}),
    JobStatus.FINISHED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}
_PILOT_ENDS = {PilotState.ENDED, PilotState.LOST}
PILOT_MOVES: dict[PilotState, frozenset[PilotState]] = {
    PilotState.QUEUED: frozenset({PilotState.RUNNING, PilotState.QUEUED, *_PILOT_ENDS}),
    # running -> running: its agent registered again (a new controller, a reconnect)
    PilotState.RUNNING: frozenset({PilotState.RUNNING, PilotState.LEAVING, PilotState.QUEUED, *_PILOT_ENDS}),
    # leaving -> running: a requeued pilot's new run registers; leaving -> leaving: told again
    PilotState.LEAVING: frozenset({PilotState.LEAVING, PilotState.QUEUED, PilotState.RUNNING, *_PILOT_ENDS}),
    PilotState.ENDED: frozenset(),
    PilotState.LOST: frozenset(),
}
NODE_MOVES: dict[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset({NodeState.LEAVING, NodeState.GONE}),
    NodeState.LEAVING: frozenset({NodeState.GONE}),
    NodeState.GONE: frozenset(),
}


class IllegalMove(RuntimeError):
    """A job, pilot or node was moved to a state its life cycle does not reach from where it is: a bug."""


def checked(table: dict, kind: str, name: str, old: str, new: str):
    """``new`` as its enum when ``old -> new`` is in ``table``; :class:`IllegalMove` naming the thing otherwise."""
    enum = type(next(iter(table)))
    try:
        to, at = enum(new), enum(old)
    except ValueError:
        raise IllegalMove(f"{kind} {name}: no state {new!r} (states: {', '.join(s.value for s in enum)})") from None
    if to not in table[at]:
        raise IllegalMove(f"{kind} {name}: {at.value} -> {to.value} is not a move its life cycle makes")
    return to


__all__ = [
    "IllegalMove",
    "JOB_MOVES",
    "JobStatus",
    "LIVE_PILOT_STATES",
    "LeaseState",
    "NODE_MOVES",
    "NodeState",
    "PILOT_MOVES",
    "PilotState",
    "Removal",
    "TERMINAL",
    "checked",
]

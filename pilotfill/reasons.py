"""Why a node leaves and why a job stops: named members, not free text.

A member's value is the very text the journal has always held in ``why`` (node events) or ``cause`` (``job.stopped``,
``job.resized``), so a journal written before these names existed reads the same; ``say`` fills in a member's
detail and ``of`` names the member a journal text came from (for readers: ``pilotfill top``, tests, a site's scripts).
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache


class _Reason(StrEnum):
    """A reason with an optional detail: ``{}`` in the value is where it goes, else it follows in brackets."""

    def say(self, detail: object = None) -> str:
        """The journal's text: the value, with ``detail`` in its place (or after it, in brackets)."""
        if "{}" in self.value:
            return self.value.format("" if detail is None else detail)
        return self.value if detail is None or detail == "" else f"{self.value} ({detail})"

    @classmethod
    def of(cls, text: str) -> _Reason | None:
        """The member whose :meth:`say` made ``text`` (None: a text no member makes)."""
        for member, pattern in _patterns(cls):
            if pattern.fullmatch(text):
                return member
        return None


@cache
def _patterns(cls: type[_Reason]) -> tuple[tuple[_Reason, re.Pattern[str]], ...]:
    # the most fixed text first: "pilot ended" before "pilot {}", "walltime ending: left at its commit" before
    # "walltime ending"
    out = []
    for member in sorted(cls, key=lambda m: -len(m.value.replace("{}", ""))):
        if "{}" in member.value:
            head, tail = member.value.split("{}", 1)
            out.append((member, re.compile(re.escape(head) + ".*" + re.escape(tail), re.DOTALL)))
        else:
            out.append((member, re.compile(re.escape(member.value) + r"( \(.*\))?", re.DOTALL)))
    return tuple(out)


class NodeWhy(_Reason):
    """Why nodes leave their job or the pool (``remove_nodes``; the journal's node events' ``why``)."""

    RELEASED = "released: no job needs it"
    """The allocator left it idle and no waiting job can use it: given back to the batch system."""
    LEAVING = "leaving"
    """The batch system told its pilot to go (SIGTERM, a preemption notice): gone within the grace."""
    PILOT_REQUEUED = "pilot {}"
    """The batch system put its pilot back in the queue (detail: the adapter's words, "requeued (preempted)")."""
    PILOT_ENDED = "pilot ended"
    """Its pilot's batch job ended (detail: how, in the adapter's words)."""
    PILOT_SILENT = "its pilot went silent"
    """No heartbeat from its pilot's agent within the deadline: lost."""
    TAKEN_OVER = "taken over by another pilot"
    """Another pilot registered it: the one that held it ended without telling us."""
    WALLTIME = "walltime ending"
    """Its pilot's walltime ends within the lead: it leaves as on a preemption notice, before the batch system acts."""
    WALLTIME_AT_COMMIT = "walltime ending: left at its commit"
    """Its job just committed and its pilot's drain is due within a commit interval: it leaves losing nothing."""
    RANK_CRASHED = "rank crashed"
    """Its rank ended on its own (detail: the exit code); the node stays ours, its job loses it."""
    RANK_NOT_ADOPTED = "its rank of {} did not outlive the controller"
    """A new controller kept the node's rank for its job (detail: the job), but the agent no longer runs it."""
    LOST_WITH_PREDECESSOR = "lost with the previous controller"
    """Its pilot was not heard again after a controller restart."""
    CONTROLLER_STOPPED = "controller stopped"
    """The campaign ended: every pilot goes."""


class StopCause(_Reason):
    """Why a running job stopped or shrank (``job.stopped``/``job.resized`` ``cause``). A stop resumes from the last
    commit; the nodes lost are named first."""

    ALLOCATION = "allocation"
    """The allocator gave its nodes to others: the objective gains (the event carries it)."""
    NODES_LEAVING = "{} leaving"
    """Its nodes (detail) were told to go."""
    NODES_GONE = "{} gone"
    """Its nodes (detail) ended or were taken without notice."""
    NODES_LOST = "{} lost"
    """Its nodes (detail) left it, some still ours (a rank crashed there)."""
    OTHER_TYPE = "moved to another node type"
    """The allocator moved it to another node type: a stop and a start there."""
    WHILE_FORMING = "{} while its ranks were forming the group"
    """It lost or gave up nodes (detail: how, or "shrunk") before its ranks had formed: a start on what it keeps."""
    SILENT = "its ranks were silent for {} s"
    """Its ranks neither reported nor printed for that long (detail): formed again from the last commit."""

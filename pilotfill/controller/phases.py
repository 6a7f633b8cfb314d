"""The decision's phases: what the controller's loop owes the next pass, as one explicit machine.

At scale (:data:`~pilotfill.controller.core.SIZE_APART_JOBS` open jobs or more) one decision is spread over
passes of the loop, so that no reply waits behind a whole-machine solve *and* hundreds of job changes *and* the
pilots' sizing. Which part the next pass does is the :class:`Phase`::

    READY ──decide (at scale)──► APPLY ──world unchanged──► OFFER ──► SIZE ──► READY
                                   │                          ▲        ▲
                                   └──world changed──► RETAKE ┴────────┘  (decided again, applied at once)

* ``READY``: nothing owed; a changed world is decided (at scale its answer is applied in the next pass; below it,
  at once, with the pilots sized on it), else the pilots' question is asked when the machine moved.
* ``APPLY``: a decision taken in the last pass, applied in this one, unless the world changed since: then
* ``RETAKE``: the decision is taken again and applied in the pass that takes it (it may wait for a burst of
  requests to be read, as any decision does).
* ``OFFER``: the nodes that decision's answer left free, offered to the waiting jobs it left out.
* ``SIZE``: the pilots sized on that answer (or asked anew if the world changed; the decision that change needs
  is then due at once).

Stopping drops whatever is owed (``READY``; nothing is decided while draining). Two markers are not phases,
because they outlive one: :attr:`Decision.due_at_once` (a decision owed to the next pass, whatever it reads) and
:attr:`Decision.question_owed` (the pilots' question put off by one pass of many requests). A burst of requests is
tracked apart, by :class:`Burst`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..lifecycle import IllegalMove


class Phase(StrEnum):
    READY = "ready"
    APPLY = "apply"
    RETAKE = "retake"
    OFFER = "offer"
    SIZE = "size"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.READY: frozenset({Phase.READY, Phase.APPLY}),
    Phase.APPLY: frozenset({Phase.READY, Phase.RETAKE, Phase.OFFER, Phase.SIZE}),
    Phase.RETAKE: frozenset({Phase.READY, Phase.RETAKE, Phase.OFFER, Phase.SIZE}),
    Phase.OFFER: frozenset({Phase.READY, Phase.SIZE}),
    Phase.SIZE: frozenset({Phase.READY}),
}
"""Every move the decision makes; any other is a bug (:class:`~pilotfill.lifecycle.IllegalMove`)."""


@dataclass
class Decision:
    """Where the decision is, with what each phase carries: ``decided`` (APPLY), ``offer`` and ``sizing`` (OFFER),
    ``sizing`` (SIZE)."""

    phase: Phase = Phase.READY
    decided: Any = None  # core.Decided: the answer APPLY applies
    offer: Any = None  # (problem, answer, jobs left out): the free nodes OFFER offers
    sizing: Any = None  # the Allocation SIZE sizes the pilots on (the offer's joined answer after an offer)
    due_at_once: bool = False  # a decision is owed to the next pass, at once (put off, or the sizing found the world changed)
    question_owed: bool = False  # the pilots' question, put off to the next pass after a pass of many requests

    def advance(self, to: Phase, decided: Any = None, offer: Any = None, sizing: Any = None) -> None:
        """Move to ``to`` with what it carries (what the old phase carried is dropped)."""
        if to not in TRANSITIONS[self.phase]:
            raise IllegalMove(f"decision: {self.phase.value} -> {to.value} is not a move the loop makes")
        self.phase, self.decided, self.offer, self.sizing = to, decided, offer, sizing

    def drop(self) -> None:
        """Stopping: nothing owed any more."""
        self.advance(Phase.READY)
        self.question_owed = False

    @property
    def owes_a_pass(self) -> bool:
        """Whether the next pass has part of a decision to do."""
        return self.phase not in (Phase.READY, Phase.RETAKE)


@dataclass
class Burst:
    """Requests and batch-system events read in a row: a decision waits while a burst is still being read."""

    more: bool = False  # the pass being stepped read a full batch: more requests wait
    handled: int = 0  # requests (and counted events) handled since the last step
    since: float | None = None  # when the decision began to wait for the burst

    def deferring(self, now: float, backlog: bool, limit_s: float) -> bool:
        """True while a burst is still being read, for at most ``limit_s``."""
        if not (self.more or backlog):
            return False
        if self.since is None:
            self.since = now
        return now - self.since < limit_s


__all__ = ["Burst", "Decision", "Phase", "TRANSITIONS"]

"""When the controller decides: one pure schedule that takes what happened and says what a pass does.

The loop's shell (:mod:`.core`) polls the batch system, the runtime and the pilots' liveness, tells the schedule
what it saw (:class:`Observed`), and does the one :class:`Action` the schedule returns. Everything that decides
*when* — whether the allocation is dirty and urgent, a burst of requests still being read, pilots still arriving, a
decision spread over passes at scale — lives here, with no I/O, and is tested as a table of events and actions.

At scale (:data:`SIZE_APART_JOBS` open jobs or more) one decision is spread over passes of the loop, so that no reply
waits behind a whole-machine solve *and* hundreds of job changes *and* the pilots' sizing. Which part the next pass
does is the :class:`Phase`::

    READY ──decide (at scale)──► APPLY ──world unchanged──► OFFER ──► SIZE ──► READY
                                   │                          ▲        ▲
                                   └──world changed──► RETAKE ┴────────┘

* ``READY``: nothing owed; a changed world is decided (at scale its answer is applied in the next pass; below it,
  at once, with the pilots sized on it), else the pilots' question is asked when the machine moved.
* ``APPLY``: a decision taken in the last pass, applied in this one, unless the world changed since: then
* ``RETAKE``: the decision is taken again and applied in the pass that takes it.
* ``OFFER``: the nodes that decision's answer left free, offered to the waiting jobs it left out.
* ``SIZE``: the pilots sized on that answer (or asked anew if the world changed; the decision that change needs is
  then due at once).

Two markers outlive a phase: ``due_at_once`` (a decision owed to the next pass, whatever it reads) and
``question_owed`` (the pilots' question put off by one pass of many requests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..lifecycle import IllegalMove

SETTLE_S = 2.0
"""Growth waits this long for the other pilots of one request to arrive, so a job grows once, not once per pilot."""
SETTLE_MAX_S = 10.0
"""…but never longer than this in a row."""
FLOOD_DEFER_S = 1.0
"""While requests keep arriving in full passes (a burst: a preemption of thousands of nodes), the decision waits for
the rest of the burst — one decision for all of it, not one per pass — but never longer than this."""
SIZE_APART_JOBS = 128
"""With at least this many open jobs, a decision is applied, its free nodes offered and the pilots sized in the loop's
next passes, not in its own: replies to the requests that arrived meanwhile go out between them."""
DECIDE_APART_MESSAGES = 16
"""With at least :data:`SIZE_APART_JOBS` open jobs, a decision due in a pass that handled this many requests is taken in
the next pass, which reads no request (:meth:`DecisionSchedule.solves_next`)."""


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
    decided: Any = None  # the answer APPLY applies (core.Decided)
    offer: Any = None  # (problem, answer, jobs left out): the free nodes OFFER offers
    sizing: Any = None  # the Allocation SIZE sizes the pilots on (the offer's joined answer after an offer)
    due_at_once: bool = False  # a decision is owed to the next pass, at once
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


class Do(StrEnum):
    """What a pass does, once the schedule has heard what it saw."""

    NOTHING = "nothing"
    DROP = "drop"  # stopping: whatever the pilots still owe is dropped
    DECIDE = "decide"  # ask the allocator and make its answer so (at scale: apply it in the next pass)
    APPLY = "apply"  # make the last pass's decision so
    OFFER = "offer"  # offer the nodes the last decision left free to the jobs it left out
    SIZE = "size"  # size the pilots on the last decision's answer (None: ask anew, the world changed)
    ASK = "ask"  # size the pilots: the main workload moved, or a kept node's time is up
    SETTLE = "settle"  # submit or release what the last sizing owes, in passes


@dataclass(frozen=True)
class Action:
    do: Do
    idle: int = 0  # the idle nodes to decide or size with
    carries: Any = None  # APPLY: the decision; OFFER: the offer; SIZE: the answer to size on (None: ask anew)


NOTHING = Action(Do.NOTHING)


@dataclass(frozen=True)
class Observed:
    """What the shell saw in this pass. ``arriving`` and ``pilots_due`` are asked only where the schedule needs them
    (each costs a look at the queued pilots; ``pilots_due`` says "true" once per back-off)."""

    idle: int | None  # the batch system's idle nodes (None: it did not answer)
    open_jobs: int
    backlog: bool = False  # batch-system events wait for the next passes
    draining: bool = False  # stopping: nothing is decided any more
    types_moved: bool = False  # a machine with several kinds of node: the idle nodes of a type changed
    pilots_owed: bool = False  # the last sizing owes submissions or releases
    arriving: Callable[[], bool] = field(default=lambda: False)  # pilots asked for moments ago are still arriving
    # a kept node's time is up, a back-off or a limit passed
    pilots_due: Callable[[], bool] = field(default=lambda: False)


class DecisionSchedule:
    """The controller's "when": events in (:meth:`changed`, :meth:`handled`, :meth:`step_begins`, …), one
    :class:`Action` out per pass (:meth:`next`), and what the shell did told back (:meth:`deciding`, …)."""

    def __init__(self) -> None:
        self.dirty = True  # something the allocation rests on changed: the next due pass decides
        self.urgent = False  # a job lost a node: decided without waiting for arriving pilots
        self.decision = Decision()
        self.burst = Burst()
        self.last_idle: int | None = None
        self._settle_since: float | None = None
        self._counting_events = True

    # ------------------------------------------------------------ events

    def changed(self, urgent: bool = False) -> None:
        """Something the allocation rests on changed (``urgent``: a job lost a node)."""
        self.dirty = True
        self.urgent = self.urgent or urgent

    def calm(self) -> None:
        """Nothing is urgent (a new controller's first decision waits for its pilots as any does)."""
        self.urgent = False

    def failed(self) -> None:
        """A pass failed: the same failing decision is not tried every tick; the next event decides."""
        self.dirty = False

    def handled(self, requests: int) -> None:
        """A pass read ``requests`` requests (a burst is counted, so that a decision waits for its rest)."""
        self.burst.handled += requests

    def step_begins(self, more: bool) -> None:
        """The loop steps: ``more`` requests wait (it read a full batch). Events it polls are counted as requests,
        unless a decision the last pass put off is due in this one whatever it polls."""
        self.burst.more = more
        self._counting_events = not self.decision.due_at_once

    def polled(self, events: int) -> None:
        """The pass handled ``events`` of the batch system's events."""
        if self._counting_events:
            self.burst.handled += events

    def step_ends(self) -> None:
        self.burst.handled = 0

    # ------------------------------------------------------------ the pass

    def next(self, now: float, seen: Observed) -> Action:
        """What this pass does."""
        decision = self.decision
        decision.due_at_once = False
        try:
            return self._next(now, seen, decision)
        finally:
            if seen.idle is not None:
                self.last_idle = seen.idle

    def _next(self, now: float, seen: Observed, decision: Decision) -> Action:
        if seen.draining:
            decision.drop()
            return Action(Do.DROP)
        if decision.phase == Phase.APPLY:
            decided = decision.decided
            if not self.dirty:
                return Action(Do.APPLY, carries=decided)
            decision.advance(Phase.RETAKE)  # something changed since it was taken: taken again, applied at once
            return self._decide_when_due(now, seen, seen.idle if seen.idle is not None else decided.idle)
        if decision.phase == Phase.OFFER:
            offer = decision.offer
            decision.advance(Phase.SIZE, sizing=decision.sizing)
            return NOTHING if self.dirty else Action(Do.OFFER, carries=offer)  # what changed is decided anew
        if decision.phase == Phase.SIZE:
            answer = decision.sizing
            decision.advance(Phase.READY)
            # its answer holds unless something changed: then asked anew, decided next
            decision.due_at_once = self.dirty
            return Action(Do.SIZE, self._idle(seen), None if self.dirty else answer)
        if self.dirty and (self.urgent or not self._settling(now, seen.arriving)):
            return self._decide_when_due(now, seen, seen.idle)
        moved = seen.idle is not None and seen.idle != self.last_idle
        if decision.question_owed or moved or seen.types_moved or seen.pilots_due():
            if decision.question_owed and self._deferring(now, seen):
                return NOTHING  # a wave of requests or batch-system events is still read: asked after it, as a decision
            if not decision.question_owed and self._puts_off(seen):
                # the pilots' question weighs the machine too: put off once, as a decision
                decision.question_owed = True
                return NOTHING
            decision.question_owed, self.burst.since = False, None
            return Action(Do.ASK, self._idle(seen))
        return Action(Do.SETTLE) if seen.pilots_owed else NOTHING

    def _decide_when_due(self, now: float, seen: Observed, idle: int | None) -> Action:
        """Decide now, unless a burst is still being read, or this pass read many requests at scale (the next, which
        reads none, decides)."""
        if self._deferring(now, seen):
            return NOTHING
        if self._puts_off(seen):
            self.decision.due_at_once = self.urgent = True
            return NOTHING
        return Action(Do.DECIDE, idle if idle is not None else self.last_idle or 0)

    def _idle(self, seen: Observed) -> int:
        return seen.idle if seen.idle is not None else self.last_idle or 0

    def _puts_off(self, seen: Observed) -> bool:
        return self.burst.handled >= DECIDE_APART_MESSAGES and seen.open_jobs >= SIZE_APART_JOBS

    def _deferring(self, now: float, seen: Observed) -> bool:
        return self.burst.deferring(now, seen.backlog, FLOOD_DEFER_S)

    def _settling(self, now: float, arriving: Callable[[], bool]) -> bool:
        """True while pilots asked for moments ago are still arriving (bounded in a row by SETTLE_MAX_S)."""
        if not arriving():
            self._settle_since = None
            return False
        if self._settle_since is None:
            self._settle_since = now
        return now - self._settle_since < SETTLE_MAX_S

    # ------------------------------------------------------------ what the shell did

    def deciding(self) -> None:
        """A decision is being taken: nothing is dirty, nothing waits any more."""
        self.dirty = self.urgent = False
        self._settle_since = self.burst.since = None

    def weigh_more(self) -> None:
        """The decision weighs more copies of a kind of job: the next pass decides again, at once."""
        self.dirty = self.urgent = self.decision.due_at_once = True

    def apply_later(self, late: bool, apart: bool, decided: Any) -> bool:
        """Whether a decision taken at scale is applied in the next pass (not when it is itself a retake)."""
        if late and apart and self.decision.phase != Phase.RETAKE:
            self.decision.advance(Phase.APPLY, decided=decided)
            return True
        return False

    def carried_out(self, apart: bool, offer: Any, answer: Any) -> None:
        """A decision's answer was applied: at scale, its free nodes are offered and the pilots sized in the next
        passes; below it, the shell sized them at once."""
        if apart and offer is not None:
            self.decision.advance(Phase.OFFER, offer=offer, sizing=answer)
        elif apart and answer is not None:
            self.decision.advance(Phase.SIZE, sizing=answer)
        else:
            self.decision.advance(Phase.READY)

    def offered(self, joined: Any) -> None:
        """The offer's answer, joined to the decision's: the pilots are sized on both."""
        if self.decision.phase == Phase.SIZE and self.decision.sizing is not None:
            self.decision.sizing = joined

    # ------------------------------------------------------------ what the loop asks

    @staticmethod
    def apart(open_jobs: int) -> bool:
        """Whether a decision is spread over passes: the machine has :data:`SIZE_APART_JOBS` open jobs or more."""
        return open_jobs >= SIZE_APART_JOBS

    def busy(self, backlog: bool, pilots_owed: bool, draining: bool) -> bool:
        """Step again without waiting: events wait, part of a decision is owed, or the pilots owe submissions."""
        decision = self.decision
        return (backlog or decision.owes_a_pass or decision.due_at_once or decision.question_owed
                or (pilots_owed and not draining))

    def solves_next(self, open_jobs: int, draining: bool, backlog: bool) -> bool:
        """Whether the next pass solves the whole machine at scale, and so reads no request: a pass is either the
        replies to a batch of requests or one solve, never both."""
        decision = self.decision
        if open_jobs < SIZE_APART_JOBS or draining or decision.phase == Phase.OFFER or backlog:
            return False
        return (decision.phase in (Phase.SIZE, Phase.APPLY) or decision.question_owed
                or (decision.due_at_once and self.dirty and self.urgent))


__all__ = ["Action", "Burst", "Decision", "DecisionSchedule", "Do", "Observed", "Phase", "TRANSITIONS"]

"""When the controller decides (controller/schedule.py): events in, one action out, as a table — no controller, no I/O."""

from __future__ import annotations

import pytest

from pilotfill.controller.schedule import (
    DECIDE_APART_MESSAGES,
    FLOOD_DEFER_S,
    SETTLE_MAX_S,
    SIZE_APART_JOBS,
    Action,
    DecisionSchedule,
    Do,
    Observed,
    Phase,
)

pytestmark = pytest.mark.unit

SMALL, LARGE = 4, SIZE_APART_JOBS


def seen(idle: int | None = 2, jobs: int = SMALL, **kw) -> Observed:
    return Observed(idle, jobs, **kw)


def clean() -> DecisionSchedule:
    s = DecisionSchedule()
    s.deciding()  # what a first decision leaves: nothing dirty
    s.last_idle = 2
    return s


def test_a_fresh_controller_decides_at_once():
    assert DecisionSchedule().next(0.0, seen()) == Action(Do.DECIDE, 2)


def test_nothing_changed_and_nothing_moved_is_nothing_to_do():
    assert clean().next(0.0, seen()) == Action(Do.NOTHING)


@pytest.mark.parametrize(
    "events, observed, action",
    [
        # (events before the pass, what the pass saw, what it does)
        (["changed"], seen(), Action(Do.DECIDE, 2)),
        (["changed"], seen(arriving=lambda: True), Action(Do.NOTHING)),  # pilots asked for moments ago are still arriving
        (["urgent"], seen(arriving=lambda: True), Action(Do.DECIDE, 2)),  # a job lost a node: no waiting
        (["changed"], seen(idle=None), Action(Do.DECIDE, 2)),  # the batch system did not answer: the last count
        ([], seen(idle=3), Action(Do.ASK, 3)),  # the main workload moved
        ([], seen(types_moved=True), Action(Do.ASK, 2)),
        ([], seen(pilots_due=lambda: True), Action(Do.ASK, 2)),  # a kept node's time is up
        ([], seen(pilots_owed=True), Action(Do.SETTLE)),
        (["changed"], seen(draining=True), Action(Do.DROP)),  # stopping: nothing is decided
        (["changed", "burst"], seen(), Action(Do.NOTHING)),  # a burst is still read: one decision for all of it
        (["changed", "backlog"], seen(backlog=True), Action(Do.NOTHING)),
    ],
)
def test_events_to_actions(events, observed, action):
    s = clean()
    for event in events:
        if event == "changed":
            s.changed()
        elif event == "urgent":
            s.changed(urgent=True)
        elif event == "burst":
            s.step_begins(more=True)
    assert s.next(0.0, observed) == action


def test_arriving_pilots_hold_a_decision_back_at_most_settle_max_s():
    s = clean()
    s.changed()
    assert s.next(0.0, seen(arriving=lambda: True)).do == Do.NOTHING
    assert s.next(SETTLE_MAX_S - 0.1, seen(arriving=lambda: True)).do == Do.NOTHING
    assert s.next(SETTLE_MAX_S, seen(arriving=lambda: True)).do == Do.DECIDE


def test_a_burst_holds_a_decision_back_at_most_flood_defer_s():
    s = clean()
    s.changed()
    s.step_begins(more=True)
    assert s.next(0.0, seen()).do == Do.NOTHING
    assert s.next(FLOOD_DEFER_S, seen()).do == Do.DECIDE


def test_the_pilots_due_are_asked_only_when_nothing_else_decides():
    asked = []
    s = clean()
    s.changed()
    s.next(0.0, seen(pilots_due=lambda: asked.append(1) or True))
    assert asked == []  # a decision sizes the pilots anyway: their "once" is not spent


def test_at_scale_a_decision_is_applied_offered_and_sized_in_the_passes_after():
    s = clean()
    s.changed()
    s.step_begins(more=False)
    assert s.next(0.0, seen(jobs=LARGE)) == Action(Do.DECIDE, 2)
    s.deciding()
    assert s.apply_later(late=True, apart=True, decided="decided")
    assert s.busy(False, False, False) and s.solves_next(LARGE, False, False)
    assert s.next(1.0, seen(jobs=LARGE)) == Action(Do.APPLY, carries="decided")
    s.carried_out(apart=True, offer="offer", answer="answer")
    assert s.decision.phase == Phase.OFFER and not s.solves_next(LARGE, False, False)
    assert s.next(2.0, seen(jobs=LARGE)) == Action(Do.OFFER, carries="offer")
    s.offered("joined")
    assert s.next(3.0, seen(jobs=LARGE)) == Action(Do.SIZE, 2, "joined")
    assert s.decision.phase == Phase.READY and not s.busy(False, False, False)


def test_at_scale_a_world_changed_before_the_answer_is_applied_is_decided_again_and_applied_at_once():
    s = clean()
    s.changed()
    s.next(0.0, seen(jobs=LARGE))
    s.deciding()
    s.apply_later(late=True, apart=True, decided=type("D", (), {"idle": 5})())
    s.changed()
    assert s.next(1.0, seen(idle=None, jobs=LARGE)) == Action(Do.DECIDE, 5)  # with the idle nodes it was taken with
    assert s.decision.phase == Phase.RETAKE and not s.apply_later(late=True, apart=True, decided="again")


def test_a_pass_of_many_requests_at_scale_puts_the_decision_off_to_the_next_which_reads_none():
    s = clean()
    s.changed()
    s.step_begins(more=False)
    s.handled(DECIDE_APART_MESSAGES)
    assert s.next(0.0, seen(jobs=LARGE)).do == Do.NOTHING
    assert s.busy(False, False, False) and s.solves_next(LARGE, False, False)
    s.step_ends()
    s.step_begins(more=False)
    s.polled(DECIDE_APART_MESSAGES)  # what the next pass polls is not counted: it decides
    assert s.next(0.0, seen(jobs=LARGE)).do == Do.DECIDE


def test_the_pilots_question_after_a_pass_of_many_requests_at_scale_is_put_off_once():
    s = clean()
    s.handled(DECIDE_APART_MESSAGES)
    assert s.next(0.0, seen(idle=7, jobs=LARGE)).do == Do.NOTHING and s.decision.question_owed
    s.step_ends()
    assert s.next(0.1, seen(idle=7, jobs=LARGE)) == Action(Do.ASK, 7) and not s.decision.question_owed


def test_a_failed_pass_does_not_retry_its_decision_every_tick():
    s = clean()
    s.changed()
    s.failed()
    assert s.next(0.0, seen()).do == Do.NOTHING

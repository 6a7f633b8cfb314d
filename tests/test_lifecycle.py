"""The life cycles of jobs, pilots and nodes, the decision's phases, and the world's check of its own indexes."""

from __future__ import annotations

import sqlite3

import pytest

from pilotfill.controller.schedule import TRANSITIONS, Burst, Decision, Phase
from pilotfill.controller.world import World
from pilotfill.lifecycle import JOB_MOVES, NODE_MOVES, PILOT_MOVES, IllegalMove, JobStatus, NodeState, PilotState
from pilotfill.schedulers.base import EndReason, EventKind, PilotEvent
from pilotfill.journal import Journal

pytestmark = pytest.mark.unit


def world(tmp_path) -> World:
    return World(Journal(tmp_path))


def spec() -> dict:
    return {"min_nodes": 1, "max_nodes": 2, "total_samples": 100}


def test_a_job_moves_only_as_its_life_cycle_says_and_a_wrong_move_changes_nothing(tmp_path):
    w = world(tmp_path)
    with w.journal.transaction():
        job = w.add_job("j1", "train", spec(), 0.0)
    assert job.status is JobStatus.PENDING and job.status == "pending"
    with w.journal.transaction():
        w.update_job(job, status="running", nodes=[])
    assert job.status is JobStatus.RUNNING and "j1" in w.running
    with w.journal.transaction():
        w.update_job(job, status=JobStatus.FINISHED, nodes=[])
    with pytest.raises(IllegalMove, match=r"job j1: finished -> running"):
        w.update_job(job, status="running")
    with pytest.raises(IllegalMove, match=r"no state 'done'"):
        w.update_job(job, status="done")
    assert job.status is JobStatus.FINISHED and "j1" not in w.open and "j1" not in w.running
    w.validate()


def test_every_state_has_a_row_in_its_table_and_ends_are_final():
    for table, enum in ((JOB_MOVES, JobStatus), (PILOT_MOVES, PilotState), (NODE_MOVES, NodeState)):
        assert set(table) == set(enum)
    assert all(not JOB_MOVES[s] for s in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED))
    assert not PILOT_MOVES[PilotState.ENDED] and not PILOT_MOVES[PilotState.LOST] and not NODE_MOVES[NodeState.GONE]


def test_pilots_and_nodes_are_checked_and_the_journal_keeps_plain_strings(tmp_path):
    w = world(tmp_path)
    with w.journal.transaction():
        pilot = w.add_pilot("p1", "101", 1, 0.0, 1)
        w.set_pilot(pilot, state="running")
        w.node_joins("n0", pilot, 1.0)
        w.set_node_state(w.nodes["n0"], "leaving", 2.0, deadline=7.0)
    with pytest.raises(IllegalMove, match=r"node n0: leaving -> ready"):
        w.set_node_state(w.nodes["n0"], "ready", 3.0)
    with pytest.raises(ValueError, match="end_pilot ends them"):
        w.set_pilot(pilot, state="ended")
    with w.journal.transaction():
        w.set_node_state(w.nodes["n0"], "gone", 3.0)
        w.end_pilot(pilot, "ended", 3.0)
    with pytest.raises(IllegalMove, match=r"pilot p1: ended -> running"):
        w.set_pilot(pilot, state="running")
    w.validate()
    db = sqlite3.connect(tmp_path / "state.sqlite")
    assert db.execute("SELECT state, typeof(state) FROM pilots").fetchall() == [("ended", "text")]
    assert db.execute("SELECT state, typeof(state) FROM nodes").fetchall() == [("gone", "text")]


def test_a_run_directory_written_with_strings_loads_as_states(tmp_path):
    w = world(tmp_path)
    with w.journal.transaction():
        job = w.add_job("j1", "train", spec(), 0.0)
        w.update_job(job, status="running", nodes=[])
        pilot = w.add_pilot("p1", "101", 1, 0.0, 1)
        w.set_pilot(pilot, state="running")
        w.node_joins("n0", pilot, 1.0)
    w.journal.close()
    again = World(Journal(tmp_path))
    again.load()
    assert again.jobs["j1"].status is JobStatus.RUNNING
    assert again.pilots["p1"].state is PilotState.RUNNING and again.nodes["n0"].state is NodeState.READY
    again.validate()


def test_validate_names_what_disagrees(tmp_path):
    w = world(tmp_path)
    with w.journal.transaction():
        job = w.add_job("j1", "train", spec(), 0.0)
        pilot = w.add_pilot("p1", "101", 1, 0.0, 1)
    w.validate()
    w.running["j1"] = job  # an index that lies: a pending job among the running ones
    with pytest.raises(AssertionError, match=r"job j1 \(pending\).*running index says True"):
        w.validate()
    del w.running["j1"]
    w.ready["n9"] = None  # a ready node nobody has
    with pytest.raises(AssertionError, match="ready index"):
        w.validate()
    del w.ready["n9"]
    w.queued.pop(pilot.id)
    with pytest.raises(AssertionError, match=r"pilot p1 \(queued\): queued index says False"):
        w.validate()


def test_the_decision_moves_through_its_phases_and_refuses_any_other_move():
    d = Decision()
    assert d.phase is Phase.READY and not d.owes_a_pass
    d.advance(Phase.APPLY, decided="answer")
    assert d.owes_a_pass and d.decided == "answer"
    d.advance(Phase.OFFER, offer=("problem", "answer", []), sizing="answer")
    d.advance(Phase.SIZE, sizing=d.sizing)
    assert d.sizing == "answer" and d.offer is None and d.decided is None
    with pytest.raises(IllegalMove, match="size -> apply"):
        d.advance(Phase.APPLY)
    d.advance(Phase.READY)
    d.advance(Phase.APPLY, decided="answer")
    d.advance(Phase.RETAKE)  # the world changed before it was applied
    assert not d.owes_a_pass  # a retake waits for a changed world, as any decision does
    d.question_owed = True
    d.drop()
    assert d.phase is Phase.READY and not d.question_owed
    assert all(Phase.READY in moves for moves in TRANSITIONS.values())  # stopping drops what is owed from anywhere


def test_a_burst_holds_the_decision_back_for_at_most_its_limit():
    b = Burst()
    assert not b.deferring(0.0, backlog=False, limit_s=1.0)
    b.more = True
    assert b.deferring(10.0, backlog=False, limit_s=1.0) and b.deferring(10.9, backlog=False, limit_s=1.0)
    assert not b.deferring(11.0, backlog=False, limit_s=1.0)


def test_batch_system_events_carry_their_reason_not_text_to_parse():
    requeued = PilotEvent(EventKind.ENDED, "p1", "101", detail="requeued (preempted)", reason=EndReason.REQUEUED)
    ended = PilotEvent(EventKind.ENDED, "p1", "101", detail="finished, requeued later by hand")
    assert requeued.reason is EndReason.REQUEUED and ended.reason is EndReason.OTHER
    assert EventKind("started") is EventKind.STARTED

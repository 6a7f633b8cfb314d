"""Why nodes leave and jobs stop (pilotfill/reasons.py): named members whose texts are the journal's, byte for byte,
and read back from a journal's text."""

from __future__ import annotations

import json

import pytest

from pilotfill.reasons import NodeWhy, StopCause

pytestmark = pytest.mark.unit

# (member, detail, the text the journal held before the members existed)
JOURNAL_TEXTS = [
    (NodeWhy.RELEASED, None, "released: no job needs it"),
    (NodeWhy.LEAVING, None, "leaving"),
    (NodeWhy.PILOT_REQUEUED, "requeued (preempted)", "pilot requeued (preempted)"),
    (NodeWhy.PILOT_ENDED, None, "pilot ended"),
    (NodeWhy.PILOT_ENDED, "finished, Exit_status 271", "pilot ended (finished, Exit_status 271)"),
    (NodeWhy.PILOT_SILENT, None, "its pilot went silent"),
    (NodeWhy.TAKEN_OVER, None, "taken over by another pilot"),
    (NodeWhy.WALLTIME, None, "walltime ending"),
    (NodeWhy.WALLTIME_AT_COMMIT, None, "walltime ending: left at its commit"),
    (NodeWhy.RANK_CRASHED, -9, "rank crashed (-9)"),
    (NodeWhy.RANK_NOT_ADOPTED, "j3", "its rank of j3 did not outlive the controller"),
    (NodeWhy.LOST_WITH_PREDECESSOR, None, "lost with the previous controller"),
    (NodeWhy.CONTROLLER_STOPPED, None, "controller stopped"),
    (StopCause.ALLOCATION, None, "allocation"),
    (StopCause.NODES_LEAVING, "vm[3]", "vm[3] leaving"),
    (StopCause.NODES_GONE, "vm-n1[2], vm-n1[3]", "vm-n1[2], vm-n1[3] gone"),
    (StopCause.NODES_LOST, "n4", "n4 lost"),
    (StopCause.OTHER_TYPE, None, "moved to another node type"),
    (StopCause.WHILE_FORMING, "vm[3] gone", "vm[3] gone while its ranks were forming the group"),
    (StopCause.WHILE_FORMING, "shrunk", "shrunk while its ranks were forming the group"),
    (StopCause.SILENT, "60", "its ranks were silent for 60 s"),
]


@pytest.mark.parametrize(("member", "detail", "text"), JOURNAL_TEXTS, ids=[t for _, _, t in JOURNAL_TEXTS])
def test_a_reason_says_what_the_journal_said_and_is_read_back_from_it(member, detail, text):
    assert member.say(detail) == text
    assert type(member).of(text) is member


def test_every_member_is_read_back_whatever_its_detail():
    for cls in (NodeWhy, StopCause):
        for member in cls:
            for detail in (None, "x", "a (b) gone", 7):
                said = member.say(detail)
                assert cls.of(said) is member, (member, detail, said)


def test_a_member_is_written_as_its_text_and_an_unknown_text_is_no_member():
    assert json.dumps({"why": NodeWhy.RELEASED, "cause": StopCause.ALLOCATION}) == json.dumps(
        {"why": "released: no job needs it", "cause": "allocation"}
    )
    assert NodeWhy.of("something else") is None and StopCause.of("") is None

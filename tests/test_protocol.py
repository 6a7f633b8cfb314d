"""The typed messages: one class per request type, checked on the way in, built by every sender, and the doc made from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pilotfill import protocol
from pilotfill.elastic.torch.store import STORE_BY_TYPE, StoreGet, StoreMultiGet, StoreNumKeys, StoreWait
from pilotfill.protocol import BY_TYPE, JobReport, JobResult, PilotHeartbeat, ProtocolError, RdzvPoll, parse

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def test_a_request_becomes_its_class_and_back():
    m = parse({"type": "job.report", "job_id": "j1", "host": "n0", "samples": 5.0, "seconds": 2, "pid": 7, "commit": True})
    assert isinstance(m, JobReport) and (m.samples, m.seconds, m.pid, m.first, m.commit) == (5.0, 2, 7, False, True)
    assert parse(m.to_dict()) == m
    assert "first" not in m.to_dict()  # optional fields at their default are not sent


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"type": "job.nope"}, "unknown message type 'job.nope'"),
        ({"type": "job.report", "job_id": "j1", "host": "n0", "seconds": 1.0}, "job.report: missing field 'samples'"),
        ({"type": "job.report", "job_id": "j1", "host": "n0", "samples": True, "seconds": 1.0}, "field 'samples' has the wrong type"),
        ({"type": "job.report", "job_id": "j1", "host": "n0", "samples": float("nan"), "seconds": 1.0}, "samples must be finite"),
        ({"type": "job.report", "job_id": "j1", "host": "n0", "samples": 1.0, "seconds": 0}, "seconds must be finite and > 0"),
        ({"type": "pilot.leaving", "pilot": "p1", "nodes": ["n0", ""], "deadline": 1.0}, "nodes must be non-empty strings"),
        ({"type": "pilot.register", "pilot": "p1", "nodes": [], "scheduler_id": "1", "pid": "12"}, "field 'pid' has the wrong type"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_type_and_field(message, error):
    with pytest.raises(ProtocolError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse(message)


def test_optional_fields_of_the_wrong_type_are_left_out_and_values_keep_their_type():
    hb = parse({"type": "pilot.heartbeat", "pilot": "p1", "wait_s": "soon", "exits": {"not": "a list"}})
    assert isinstance(hb, PilotHeartbeat) and hb.wait_s is None and hb.exits is None
    report = parse({"type": "job.report", "job_id": "j1", "host": "n0", "samples": 1.0, "seconds": 1.0, "commit": 1})
    assert report.commit is False  # only true commits: 1 is not True
    assert parse({"type": "job.result", "job_id": "j1", "value": True}) == JobResult("j1", True)  # an app may return True


def test_the_protocol_doc_is_made_from_the_classes():
    text = DOC.read_text()
    begin, end = text.index("<!-- table: begin -->\n") + len("<!-- table: begin -->\n"), text.index("<!-- table: end -->")
    assert text[begin:end] == protocol.table(), "docs/protocol.md is stale: python -m pilotfill.protocol makes its table"
    begin, end = text.index("<!-- spec: begin -->\n") + len("<!-- spec: begin -->\n"), text.index("<!-- spec: end -->")
    assert text[begin:end] == protocol.spec_table(), "docs/protocol.md's job spec is stale: python -m pilotfill.protocol makes it"
    begin, end = text.index("<!-- store: begin -->\n") + len("<!-- store: begin -->\n"), text.index("<!-- store: end -->")
    assert text[begin:end] == protocol.table(STORE_BY_TYPE), "docs/protocol.md's torch store table is stale: python -m pilotfill.protocol makes it"
    assert set(protocol.READ_ONLY) == {t for t, m in BY_TYPE.items() if m.READ_ONLY} == {"job.get", "job.status", "state.snapshot", "rdzv.join", "rdzv.poll"}


def test_every_sender_builds_its_request_from_a_class_and_the_wire_is_what_it_was():
    """No module of pilotfill writes a request as a raw dict: a field renamed in a class cannot leave a sender behind.
    What the classes send is what the senders' dicts were: the same keys in the same order, optional fields left out
    exactly when they were (a job.result of None still says so)."""
    import re

    root = Path(protocol.__file__).parent
    raw = [f"{path.relative_to(root)}:{n}" for path in root.rglob("*.py") if path.name != "protocol.py"
           for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"[\"']type[\"']: *[\"']", line)]  # fmt: skip
    assert not raw, f"requests built as raw dicts (use a class of pilotfill.protocol): {raw}"
    assert JobResult("j1", None).to_dict() == {"type": "job.result", "job_id": "j1", "value": None}
    assert list(RdzvPoll("j1", "n0", 3).to_dict()) == ["type", "job_id", "host", "round"]
    assert RdzvPoll("j1", "n0", 3, in_place=True).to_dict()["in_place"] is True
    assert list(StoreGet(5.0, "k").to_dict()) == ["type", "timeout_s", "key"]
    assert list(StoreMultiGet(5.0, ["k"]).to_dict()) == ["type", "timeout_s", "keys"]
    assert list(StoreWait(["k"], 5.0).to_dict()) == ["type", "keys", "timeout_s"]
    assert StoreNumKeys().to_dict() == {"type": "store.num_keys"}
    assert not set(STORE_BY_TYPE) & set(BY_TYPE) and all(t.startswith("store.") for t in STORE_BY_TYPE)  # the store's, not the controller's


def test_every_request_type_has_one_handler(tmp_path, write):
    from test_controller_core import Machine, linear

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 10.0)])
    assert set(m.ctl.handlers) == set(BY_TYPE)
    reply = m.ctl.handle({"type": "job.report", "job_id": "nope", "host": "n0", "samples": 1.0, "seconds": 1.0})
    assert reply == {"ok": False, "error": "no job 'nope'"}


def test_the_job_spec_names_every_key_the_code_reads_and_its_defaults_are_copies():
    """Every key read from a job spec anywhere in pilotfill is one of JobSpec's (a key read but never declared would
    be a field nobody documented or checked); a submission's defaults are its own, not shared between jobs."""
    import re

    declared = set(protocol.JobSpec.__annotations__)
    read = set()
    for path in (Path(protocol.__file__).parent).rglob("*.py"):
        read |= set(re.findall(r"spec(?:\[\"|\.get\(\")([a-z_]+)", path.read_text()))
    assert read and read <= declared, sorted(read - declared)
    a, b = (protocol.check_spec({"name": n, "entry": "m:f", "min_nodes": 1, "max_nodes": 1}) for n in "ab")
    a["args"].append(1)
    assert b["args"] == [] and protocol.SPEC_DEFAULTS["args"] == []
    assert set(protocol.SPEC_DEFAULTS) <= declared
    from pilotfill.executors.elastic import SPEC_KEYS

    assert SPEC_KEYS <= declared, "what elastic_app puts in a spec is declared"


def test_a_mistyped_key_of_a_job_spec_is_named_not_ignored():
    with pytest.raises(ProtocolError, match="job spec: unknown key 'total_sample'; did you mean total_samples"):
        protocol.check_spec({"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 2, "total_sample": 100})


def test_a_group_is_a_string_and_kept():
    spec = protocol.check_spec({"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 2, "group": "alice"})
    assert spec["group"] == "alice"
    with pytest.raises(ProtocolError, match="job spec: group must be a string"):
        protocol.check_spec({"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 2, "group": 7})

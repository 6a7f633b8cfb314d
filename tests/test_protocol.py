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


def test_every_request_type_has_its_own_reply_class_and_a_reply_reads_back_as_it_went():
    """Each request names its reply class (``REPLY``); the controller's are one per type. A reply read back
    (``Reply.parse``) is the reply that was sent; a refusal or a field of the wrong type is a ProtocolError naming it."""
    from pilotfill.protocol import JobSubmitReply, PilotHeartbeatReply, Reply

    for by_type in (BY_TYPE, STORE_BY_TYPE):
        for t, m in by_type.items():
            assert issubclass(m.REPLY, Reply) and m.REPLY is not Reply, t
    assert len({m.REPLY for m in BY_TYPE.values()}) == len(BY_TYPE)
    r = JobSubmitReply(job_id="j1", reused=True)
    assert JobSubmitReply.parse({"ok": True, **r.to_dict()}) == r and JobSubmitReply(job_id="j1").to_dict() == {"job_id": "j1"}
    with pytest.raises(ProtocolError, match="JobSubmitReply: field 'job_id' has the wrong type"):
        JobSubmitReply.parse({"ok": True, "job_id": 7})
    with pytest.raises(ProtocolError, match="refused: no job"):
        JobSubmitReply.parse({"ok": False, "error": "no job 'x'"})
    # The heartbeat's to_dict is written out (the hot path): it sends what the fields say, in the order sent before.
    for reply in (PilotHeartbeatReply(release=["n1"], commands=[], stop=False, register=False, incarnation=2, keep=[["n0", "j1"]]),
                  PilotHeartbeatReply(release=[], commands=[{"op": "stop"}], stop=True, register=False, incarnation=1),
                  PilotHeartbeatReply(register=True, stop=False, incarnation=3)):  # fmt: skip
        assert reply.to_dict() == protocol._sent(reply) and PilotHeartbeatReply.parse(reply.to_dict()) == reply
    assert list(PilotHeartbeatReply(register=True, stop=False, incarnation=3).to_dict()) == ["register", "stop", "incarnation"]


def test_the_rendezvous_book_answers_in_the_shape_and_order_of_its_reply_classes():
    """The torch runtime sends the book's answers as RdzvJoinReply / RdzvPollReply: every shape of them, key order
    included, survives the class."""
    from pilotfill.elastic.rendezvous import RendezvousBook
    from pilotfill.protocol import RdzvJoinReply, RdzvPollReply

    book = RendezvousBook()
    book.store = ("h", 5)
    book.expect("j", ["a", "b"], 0.0)
    answers = [(RdzvJoinReply, book.join("j", "a", -1, 1.0)), (RdzvJoinReply, book.join("j", "b", -1, 1.0)),
               (RdzvJoinReply, book.join("j", "c", -1, 1.0)), (RdzvJoinReply, book.join("nope", "a", -1, 1.0)),
               (RdzvPollReply, book.poll("j", "a", 0)), (RdzvPollReply, book.poll("nope", "a", 0)),
               (RdzvJoinReply, book.join("j", "a", -1, 2.0, in_place=True)), (RdzvPollReply, book.poll("j", "a", 1))]  # fmt: skip
    states = {d.get("state") for _, d in answers}
    assert {"wait", "closed", "ended"} <= states and any("same_hosts" not in d for c, d in answers if c is RdzvPollReply)
    for cls, answer in answers:
        assert list(cls(**answer).to_dict().items()) == list(answer.items()), answer


def _wire(reply: dict) -> str:
    import json

    return json.dumps(reply)


def test_each_handler_of_a_real_controller_replies_what_it_did_before_the_replies_were_typed(tmp_path, write):
    """The replies of an in-process controller, byte for byte as they were when the handlers returned dicts (recorded
    then): the typed replies changed nothing on the wire — keys, order, None sent where it was, optional fields
    left out where they were."""
    from test_controller_core import Machine, linear

    from pilotfill.protocol import PilotHeartbeatReply

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 10.0)])
    h = m.ctl.handle
    m.at(0)
    spec = {"name": "a", "entry": "pilotfill.replay:simulated", "min_nodes": 1, "max_nodes": 2,
            "curve": {"nodes": [0, 1, 2], "samples_per_s": [0, 10.0, 20.0]}, "key": "k1"}  # fmt: skip
    assert _wire(h({"type": "job.submit", "spec": spec, "rid": "r1"})) == '{"ok": true, "job_id": "j1"}'
    again = {"type": "job.submit", "spec": {"name": "a", "entry": "x:y", "min_nodes": 1, "max_nodes": 2, "key": "k1"}}
    assert _wire(h(again)) == '{"ok": true, "job_id": "j1", "reused": true}'
    m.at(60)
    m.at(120)
    pilot = sorted(m.ctl.world.pilots)[0]
    host = sorted(m.ctl.world.pilots[pilot].nodes)[0]
    m.ctl.launcher.launch(host, "j1", ["python", "-c", "1"], {"A": "1"})
    assert _wire(h({"type": "pilot.heartbeat", "pilot": pilot})) == (
        '{"ok": true, "release": [], "commands": [{"op": "start", "job": "j1", "host": "n0", "argv": ["python", "-c", '
        '"1"], "env": {"A": "1"}}], "stop": false, "register": false, "incarnation": 1}'
    )
    assert _wire(h({"type": "pilot.heartbeat", "pilot": pilot, "exits": []})) == (
        '{"ok": true, "release": [], "commands": [], "stop": false, "register": false, "incarnation": 1}'
    )
    assert _wire(h({"type": "pilot.heartbeat", "pilot": "nope"})) == (
        '{"ok": true, "register": true, "stop": false, "incarnation": 1}'
    )
    assert _wire(h({"type": "pilot.register", "pilot": "pnew", "nodes": [], "scheduler_id": "9", "pid": 1})) == '{"ok": true}'
    report = {"type": "job.report", "job_id": "j1", "host": host, "samples": 10.0, "seconds": 1.0}
    assert _wire(h({**report, "first": True})) == '{"ok": true, "progress": 1210.0}'
    assert _wire(h(report)) == '{"ok": true, "progress": 1220.0}'
    assert _wire(h({"type": "job.commit", "job_id": "j1"})) == '{"ok": true, "committed": 1220.0}'
    model = {"parameters": 1e6, "flops_per_sample": 6e6, "layers": 3, "batch_size": 32, "mix": {"linear": 1.0}}
    assert _wire(h({"type": "job.describe", "job_id": "j1", "model": model})) == '{"ok": true, "kept": true}'
    assert _wire(h({"type": "job.describe", "job_id": "j1", "model": {"parameters": 5.0}})) == '{"ok": true, "kept": false}'
    got = h({"type": "job.get", "job_id": "j1"})
    assert list(got) == ["ok", "job", "checkpoint"] and got["checkpoint"] == str(m.run_dir / "checkpoints" / "k1.pt")
    assert got["job"] == m.ctl.world.jobs["j1"].record() and got["job"]["result"] is None and got["job"]["progress"] == 1220.0
    assert _wire(h({"type": "job.status", "job_ids": ["j1", "nope"]})) == (
        '{"ok": true, "jobs": {"j1": {"id": "j1", "status": "running", "progress": 1220.0, "committed": 1220.0, '
        '"result": null, "error": null}}}'
    )
    snap = h({"type": "state.snapshot"})
    assert list(snap) == ["ok", "jobs", "pilots", "nodes", "counters", "events", "incarnation", "placement", "notices",
                          "node_seconds"]  # fmt: skip
    assert {k: snap[k] for k in ("jobs", "pilots", "nodes", "counters")} == m.ctl.world.snapshot()
    assert snap["events"] == m.ctl.journal.events(limit=50) and snap["events"][-1]["kind"] == "job.described"
    assert (snap["incarnation"], snap["placement"], snap["notices"]) == (1, {}, [])
    assert snap["node_seconds"] == {"held": 120.0, "used": 120.0} and snap["counters"]["pilots_submitted"] == 2
    assert _wire(h({"type": "job.cancel", "job_id": "j1"})) == '{"ok": true}'
    assert _wire(h(report)) == '{"ok": true, "progress": 1220.0}'  # after its end: what it had
    leaving = {"type": "pilot.leaving", "pilot": pilot, "nodes": [host], "deadline": m.now + 5}
    assert _wire(h(leaving)) == '{"ok": true}'
    assert h({"type": "job.get", "job_id": "nope"}) == {"ok": False, "error": "no job 'nope'"}
    rdzv = {"type": "rdzv.join", "job_id": "j1", "host": host, "last_round": -1}
    assert h(rdzv) == {"ok": False, "error": "rdzv.join: no torch job runs in this campaign"}
    # A heartbeat parked (a long poll) is answered later with the same typed reply, made then.
    m.ctl.wake = lambda pilot_id: None
    parked = h({"type": "pilot.heartbeat", "pilot": pilot, "wait_s": 5.0})
    later = parked.reply()
    assert isinstance(later, PilotHeartbeatReply) and later.to_dict() == {
        "release": [], "commands": [], "stop": False, "register": False, "incarnation": 1}  # fmt: skip


def test_a_parked_typed_reply_goes_out_as_the_others_do(tmp_path):
    """The transport sends a parked request's typed reply as its to_dict(), with ``ok``, like Controller.handle."""
    import threading
    import time

    from pilotfill.protocol import PilotHeartbeatReply
    from pilotfill.security import create_secret
    from pilotfill.transport import Client, Park, Server

    run_dir = tmp_path / "run"
    server = Server(run_dir, create_secret(run_dir))
    server.publish()
    typed = PilotHeartbeatReply(release=["n1"], commands=[], stop=False, register=False, incarnation=4, keep=[["n0", "j"]])
    got: list[dict] = []
    client = Client(run_dir, timeout_s=30)
    thread = threading.Thread(target=lambda: got.append(client.request({"type": "wait"}, attempt_s=30)))
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while not got and time.monotonic() < deadline:
            server.serve(lambda message: Park("a", 0.1, lambda: typed), 100)
        thread.join(5)
    finally:
        client.close()
        server.close()
    assert got == [{"ok": True, **typed.to_dict()}]

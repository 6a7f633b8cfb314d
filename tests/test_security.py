"""Authentication: garbage, a wrong key and replayed messages are dropped before any parsing."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
import zmq

from pilotfill import security, transport
from pilotfill.security import AuthError, Verifier, create_secret, load_secret, seal
from pilotfill.transport import Client, ControllerUnavailable, Server, dealer

pytestmark = pytest.mark.unit


def test_secret_is_private_and_stable(tmp_path):
    run = tmp_path / "run"
    key = create_secret(run)
    assert stat.S_IMODE((run / security.SECRET_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert create_secret(run) == key == load_secret(run)
    os.chmod(run / security.SECRET_FILE, 0o644)
    with pytest.raises(PermissionError, match="0600"):
        load_secret(run)


def test_verifier_order_of_checks():
    key, other = b"k" * 64, b"o" * 64
    v = Verifier(key)
    frames = seal(key, b'{"type": "state.snapshot"}')
    assert v.open(frames)[1] == b'{"type": "state.snapshot"}'
    with pytest.raises(AuthError, match="replayed"):
        v.open(frames)
    with pytest.raises(AuthError, match="bad signature"):
        v.open(seal(other, b"{}"))
    with pytest.raises(AuthError, match="malformed"):
        v.open([b"garbage"])
    tampered = seal(key, b'{"a": 1}')
    tampered[1] = tampered[1][:-2] + b"2}"
    with pytest.raises(AuthError, match="bad signature"):
        v.open(tampered)
    with pytest.raises(AuthError, match="stale"):
        v.open(seal(key, b"{}", now=time.time() - 3600))
    restarted = Verifier(key, not_before=time.time())
    with pytest.raises(AuthError, match="stale"):  # captured before a controller restart
        restarted.open(seal(key, b"{}", now=time.time() - 30))


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A Server whose handler records calls, and a count of JSON parses it made."""
    run = tmp_path / "run"
    key = create_secret(run)
    srv = Server(run, key)
    srv.publish()
    parsed = []
    real_loads = transport.json.loads

    def counting_loads(data, *a, **k):
        parsed.append(data)
        return real_loads(data, *a, **k)

    monkeypatch.setattr(transport.json, "loads", counting_loads)
    yield run, key, srv, parsed
    srv.close()


def pump(srv, handled, timeout_ms=300):
    srv.serve(lambda m: handled.append(m) or {"ok": True, "echo": m.get("n")}, timeout_ms)


def test_server_drops_bad_messages_before_parsing(server):
    run, key, srv, parsed = server
    raw = dealer(key, srv.endpoint)
    handled: list = []
    valid = seal(key, json.dumps({"type": "x", "n": 1}).encode())
    raw.send_multipart([b"not", b"even", b"close"])  # garbage
    raw.send_multipart(seal(b"w" * 64, json.dumps({"type": "x", "n": 2}).encode()))  # wrong key
    raw.send_multipart(valid)
    raw.send_multipart(valid)  # a replayed copy
    deadline = time.time() + 3
    while time.time() < deadline and srv.dropped + len(handled) < 4:
        pump(srv, handled)
    assert [m["n"] for m in handled] == [1]
    assert srv.dropped == 3
    assert len(parsed) == 1  # only the authentic, fresh message was ever deserialized
    raw.close(0)


def test_client_round_trip_and_rejects_unsigned_replies(server, tmp_path):
    run, key, srv, parsed = server
    client = Client(run, timeout_s=3)
    import threading

    handled: list = []
    t = threading.Thread(target=lambda: [pump(srv, handled) for _ in range(10)])
    t.start()
    assert client.request({"type": "x", "n": 7})["echo"] == 7
    t.join()
    # A "controller" with another key: the client never accepts its replies.
    impostor_dir = tmp_path / "impostor"
    impostor = Server(impostor_dir, create_secret(impostor_dir))
    (run / transport.ENDPOINT_FILE).write_text(json.dumps({"endpoint": impostor.endpoint}))
    t = threading.Thread(target=lambda: [impostor.serve(lambda m: {"ok": True}, 200) for _ in range(8)])
    t.start()
    with pytest.raises(ControllerUnavailable):
        Client(run, timeout_s=1).request({"type": "x"}, attempt_s=0.5)
    t.join()
    assert impostor.dropped >= 1
    impostor.close()


def test_serve_handles_a_bounded_batch_so_the_controller_steps_every_tick(server):
    """A flood of valid requests is served in batches: each call returns after at most max_batch, leaving the rest queued."""
    run, key, srv, parsed = server
    raw = dealer(key, srv.endpoint)
    for n in range(50):
        raw.send_multipart(seal(key, json.dumps({"type": "x", "n": n}).encode()))
    handled: list = []
    calls = []
    deadline = time.time() + 30
    while len(handled) < 50 and time.time() < deadline:
        calls.append(srv.serve(lambda m: handled.append(m) or {"ok": True}, 200, max_batch=8))
    assert sorted(m["n"] for m in handled) == list(range(50))
    assert max(calls) <= 8 and len([c for c in calls if c]) >= 7
    raw.close(0)


def test_a_message_for_one_controller_is_refused_by_the_next(tmp_path):
    """Keys are bound to the controller's incarnation: a capture replayed to its successor, however soon, is dropped."""
    run = tmp_path / "run"
    secret = create_secret(run)
    first = Server(run, secret, incarnation=1)
    message = seal(security.session_key(secret, 1), json.dumps({"type": "x"}).encode())
    first.close()
    second = Server(run, secret, incarnation=2, not_before=time.time() - 60)
    raw = dealer(secret, second.endpoint)
    raw.send_multipart(message)
    handled: list = []
    deadline = time.time() + 10
    while time.time() < deadline and not second.dropped:
        second.serve(lambda m: handled.append(m) or {"ok": True}, 200)
    assert second.dropped == 1 and handled == []
    raw.close(0)
    second.close()


def test_deeply_nested_and_oversized_requests_are_refused_not_fatal(server):
    run, key, srv, parsed = server
    raw = dealer(key, srv.endpoint)
    raw.send_multipart(seal(key, b"[" * 100_000 + b"]" * 100_000))
    raw.send_multipart(seal(key, json.dumps({"type": "x", "deep": json.loads("[" * 200 + "]" * 200)}).encode()))
    handled: list = []
    replies = []
    deadline = time.time() + 10
    while len(replies) < 2 and time.time() < deadline:
        srv.serve(lambda m: handled.append(m) or {"ok": True}, 100)
        while raw.poll(0):
            replies.append(json.loads(raw.recv_multipart()[1][24:]))
    assert handled == [] and [r["ok"] for r in replies] == [False, False]
    assert all("unparseable" in r["error"] for r in replies)

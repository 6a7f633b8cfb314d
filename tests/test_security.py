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


def test_a_client_waits_out_a_slow_handshake_on_one_connection(tmp_path):
    """A controller on a busy machine may take longer than a request's attempt to complete the handshake (its ZAP
    answers come between passes). Each retry used to open a new connection, whose handshake started again: nothing
    ever completed and the client gave up with the controller alive. Retries now go on the one connection."""
    import threading

    run = tmp_path / "run"
    secret = create_secret(run)
    key = transport.message_key(secret, transport.CONTROLLER, 3)
    ctx = zmq.Context()
    zap = ctx.socket(zmq.REP)
    zap.bind(transport.ZAP_ENDPOINT)
    router = transport.secure(ctx.socket(zmq.ROUTER), secret, server=True)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    (run / transport.ENDPOINT_FILE).write_text(json.dumps({"endpoint": f"tcp://127.0.0.1:{port}", "incarnation": 3}))
    handshakes: list[float] = []
    stop = threading.Event()

    def slow_server() -> None:  # every handshake is approved 1 s after it asked (attempts are 0.3 s)
        verify, waiting = Verifier(key), []
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            ready = dict(poller.poll(20))
            if zap in ready:
                waiting.append((time.monotonic(), zap.recv_multipart()))
                handshakes.append(waiting[-1][0])
            if waiting and time.monotonic() - waiting[0][0] >= 1.0:
                version, request_id = waiting.pop(0)[1][:2]
                zap.send_multipart([version, request_id, b"200", b"OK", b"", b""])
            if router in ready:
                identity, *frames = router.recv_multipart()
                nonce, payload = verify.open(frames)
                reply = json.dumps({"ok": True, "echo": json.loads(payload)["n"]}).encode()
                router.send_multipart([identity, *seal(key, reply, nonce=nonce)])

    thread = threading.Thread(target=slow_server, daemon=True)
    thread.start()
    try:
        assert Client(run, timeout_s=20).request({"type": "x", "n": 5}, attempt_s=0.3)["echo"] == 5
        assert len(handshakes) == 1, f"{len(handshakes)} connections for one request"
    finally:
        stop.set()
        thread.join(5)
        zap.close(0)
        router.close(0)
        ctx.term()

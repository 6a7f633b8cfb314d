"""The run's torch store: torch's Store semantics over the authenticated transport, bounded memory, strangers refused."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import zmq

from pilotfill.elastic.torch.store import Keys, StoreFull, StoreServer
from pilotfill.security import create_secret

pytestmark = pytest.mark.local


def test_keys_are_bounded_and_the_least_recently_used_rounds_go_first():
    keys = Keys(budget=100, max_value=40)
    keys.put("r1/a", b"x" * 30)
    keys.put("r2/a", b"y" * 30)
    keys.get("r1/a")  # r1 is used again: r2 is now the oldest
    keys.put("r3/a", b"z" * 30)
    assert keys.total <= 100 and set(keys.data) == {"r1/a", "r3/a"} and keys.evicted == 1
    with pytest.raises(StoreFull, match="over the torch store's limit"):
        keys.put("r4/a", b"w" * 41)
    assert keys.delete("r1/a") and not keys.delete("r1/a") and keys.total == len("r3/a") + 30


@pytest.fixture
def store(tmp_path, torch_runtime):
    """A store server on a thread, and a RunStore factory for it."""
    from pilotfill.elastic.run_store import RunStore

    run = tmp_path / "run"
    secret = create_secret(run)
    server = StoreServer(run, secret)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [server.serve(20) for _ in iter(stop.is_set, True)], daemon=True)
    thread.start()
    yield server, lambda timeout_s=30: RunStore(run, "127.0.0.1", server.port, timeout=timedelta(seconds=timeout_s))
    stop.set()
    thread.join(10)
    server.close()


def test_the_store_answers_as_torch_stores_do(store):
    from torch.distributed import PrefixStore

    server, connect = store
    s = connect()
    s.set("a/k", b"v")
    assert s.get("a/k") == b"v" and s.check(["a/k"]) and not s.check(["a/missing"])
    assert s.add("a/n", 3) == 3 and s.add("a/n", -1) == 2 and s.get("a/n") == b"2"
    assert s.compare_set("a/c", "", "one") == b"one"  # absent and expected empty: set
    assert s.compare_set("a/c", "nope", "two") == b"one"  # mismatch: unchanged
    assert s.compare_set("a/c", "one", "three") == b"three"
    s.append("a/l", "ab")
    s.append("a/l", b"cd")
    s.multi_set(["a/m1", "a/m2"], [b"1", "2"])
    assert s.multi_get(["a/l", "a/m1", "a/m2"]) == [b"abcd", b"1", b"2"]
    assert s.delete_key("a/k") and not s.delete_key("a/k") and s.num_keys() == 5
    prefixed = PrefixStore("round", s)  # as torch uses it
    prefixed.set("x", "y")
    assert s.get("round/x") == b"y"


def test_a_blocking_get_waits_at_the_store_and_a_wait_times_out(store):
    from torch.distributed import DistStoreError

    server, connect = store
    waiter, writer = connect(), connect()
    threading.Timer(0.5, lambda: writer.set("b/late", b"here")).start()
    assert waiter.get("b/late") == b"here"  # one request, parked until the key came
    with pytest.raises(DistStoreError, match="timed out after 1 s"):
        waiter.wait(["b/never"], timedelta(seconds=1))
    assert server.keys.data.keys() >= {"b/late"}


def test_a_stranger_cannot_use_the_store(store, tmp_path, monkeypatch):
    """A client with another run's secret, or with no CurveZMQ at all, is refused at the handshake; what it sends is
    never read, and the run's own clients are served as before."""
    from torch.distributed import DistStoreError

    from pilotfill.elastic import run_store
    from pilotfill.elastic.run_store import RunStore

    server, connect = store
    other = tmp_path / "other"
    create_secret(other)  # another run's secret
    monkeypatch.setattr(run_store, "RPC_S", 1.0)
    stranger = RunStore(other, "127.0.0.1", server.port, timeout=timedelta(seconds=1))
    with pytest.raises(DistStoreError, match="did not answer"):
        stranger.set("c/k", b"x")
    plain = zmq.Context.instance().socket(zmq.DEALER)  # no CurveZMQ at all
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(f"tcp://127.0.0.1:{server.port}")
    plain.send_multipart([b"x" * 32, b"y" * 1000], zmq.NOBLOCK)
    deadline = time.time() + 30
    while time.time() < deadline and server.server.refused < 2:
        time.sleep(0.05)
    plain.close(0)
    assert server.server.refused >= 2 and server.server.dropped >= 2
    assert "c/k" not in server.keys.data
    assert connect().check(["c/k"]) is False

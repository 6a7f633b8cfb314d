"""The run's torch store: a key-value store only the run's processes can use, on the controller's machine.

    python -m pilotfill.elastic.torch.store --run-dir RUN [--host ADDRESS] [--lease-deadline S]

Started once by the torch runtime (:mod:`pilotfill.elastic.torch`); it listens
on a random port and writes ``{"host", "port", "pid", "ticks"}`` to
``RUN/torch_store.json`` (mode 0600, atomically) for the runtime, which hands
it out in rendezvous replies. Rank 0's node holds nothing: when any node goes,
the store and every other round's keys stay. It dies with the controller that
started it — unless ``pilotfill run`` restarts that controller
(``--lease-deadline``): then it outlives it, the next controller adopts it
with every round's keys (the jobs' ranks train on), and it ends when the
campaign's lease is ended or not renewed for that long (:mod:`pilotfill.lease`).

What torch elastic and gloo need from a store (``set``, blocking ``get`` and
``wait``, ``add``, ``compare_set``, …) is served here over pilotfill's own
transport (:mod:`pilotfill.transport`): CurveZMQ with the run's keys, so a
peer without the run's secret is refused during the handshake — nothing it
sends is read — and every request is HMAC-signed with a key of this channel.
Ranks and agents reach it through
:class:`pilotfill.elastic.run_store.RunStore`, a ``torch.distributed.Store``: the agents' rendezvous handler
(:mod:`pilotfill.elastic.torch.rdzv`) and, in the workers, plain
``init_process_group()`` (``env://``, rebound by
:func:`pilotfill.elastic.torch.worker.bind_store`). Each round still works
under its own prefix, so rounds and jobs never see each other's keys.

Why not torch's ``TCPStore``: it has no authentication, and torch 2.13's
``list_keys()`` hands every key — every round's prefix, rank 0's gloo address
— to anyone who connects; a second user could join a live round's mesh, fill
the store's memory and stall rounds by holding connections.

Bounded: a value is at most :data:`MAX_VALUE_BYTES`; all keys and values
together at most :data:`MAX_TOTAL_BYTES` — past it the namespaces (rounds)
used least recently are dropped first, and a single write larger than the
budget is refused; an unauthenticated connection costs a refused handshake.

Not covered, as for torchrun, Horovod and NCCL: someone who can *sniff* the
cluster network sees gloo's own traffic between ranks (the store's is
encrypted); and denial of service by exhausting the machine itself (CPU,
file descriptors, the network).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...lease import LeaseWatch
from ...lifecycle import LeaseState
from ...procs import die_with_parent, start_ticks
from ...protocol import _NUMBER, Message, Reply, _field
from ...transport import Park, Server

PORT_FILE = "torch_store.json"
CHANNEL = "torch store"
MAX_VALUE_BYTES = 16 * 1024 * 1024
MAX_TOTAL_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
LOOPBACK = ("127.0.0.1", "localhost", "::1")


# ------------------------------------------------------------------ the replies


@dataclass(slots=True, kw_only=True)
class StoreOkReply(Reply):
    """ok"""


@dataclass(slots=True, kw_only=True)
class StoreWaitReply(Reply):
    """A wait's: nothing but ``ok`` once every key is set, else ``timeout`` and ``missing``."""

    timeout: bool = _field(bool, "a key was not set in time", False)
    missing: list | None = _field(list, "the keys not set then (at most 8) [str]", None)


@dataclass(slots=True, kw_only=True)
class StoreValuesReply(Reply):
    """A get's: the values once every key is set, else ``timeout`` and ``missing``."""

    values: list | None = _field(list, "the keys' values, in order [base64]", None)
    timeout: bool = _field(bool, "a key was not set in time", False)
    missing: list | None = _field(list, "the keys not set then (at most 8) [str]", None)


@dataclass(slots=True, kw_only=True)
class StoreAddReply(Reply):
    value: int = _field(int, "the key's new count")


@dataclass(slots=True, kw_only=True)
class StoreCompareSetReply(Reply):
    value: str = _field(str, "the key's value after (desired when it was swapped) [base64]")


@dataclass(slots=True, kw_only=True)
class StoreCheckReply(Reply):
    present: bool = _field(bool, "every key is set")


@dataclass(slots=True, kw_only=True)
class StoreDeleteReply(Reply):
    deleted: bool = _field(bool, "the key was there")


@dataclass(slots=True, kw_only=True)
class StoreNumKeysReply(Reply):
    count: int = _field(int, "the keys the store holds")


# ------------------------------------------------------------------ the requests


@dataclass(slots=True)
class StoreRequest(Message):
    """A request to this store (on its own channel), not to the controller: what
    :class:`pilotfill.elastic.run_store.RunStore` sends, built like the controller's (:mod:`pilotfill.protocol`; here,
    not there, so that only torch's agents and ranks load them). Values travel as base64 strings (:func:`encode`);
    the store checks a request's fields itself (:meth:`StoreServer._handle`)."""


@dataclass(slots=True)
class StoreSet(StoreRequest):
    TYPE: ClassVar[str] = "store.set"
    REPLY: ClassVar[type[Reply]] = StoreOkReply
    key: str = _field(str, "the key")
    value: str = _field(str, "its value [base64]")


@dataclass(slots=True)
class StoreGet(StoreRequest):
    TYPE: ClassVar[str] = "store.get"
    REPLY: ClassVar[type[Reply]] = StoreValuesReply
    timeout_s: float = _field(_NUMBER, "how long to wait for the key (a long poll)")
    key: str = _field(str, "the key")


@dataclass(slots=True)
class StoreMultiGet(StoreRequest):
    TYPE: ClassVar[str] = "store.multi_get"
    REPLY: ClassVar[type[Reply]] = StoreValuesReply
    timeout_s: float = _field(_NUMBER, "how long to wait for all of them (a long poll)")
    keys: list = _field(list, "the keys [str]")


@dataclass(slots=True)
class StoreWait(StoreRequest):
    TYPE: ClassVar[str] = "store.wait"
    REPLY: ClassVar[type[Reply]] = StoreWaitReply
    keys: list = _field(list, "the keys [str]")
    timeout_s: float = _field(_NUMBER, "how long to wait for all of them (a long poll)")


@dataclass(slots=True)
class StoreAdd(StoreRequest):
    TYPE: ClassVar[str] = "store.add"
    REPLY: ClassVar[type[Reply]] = StoreAddReply
    key: str = _field(str, "the key (absent: 0)")
    amount: int = _field(int, "what to add")


@dataclass(slots=True)
class StoreCompareSet(StoreRequest):
    TYPE: ClassVar[str] = "store.compare_set"
    REPLY: ClassVar[type[Reply]] = StoreCompareSetReply
    key: str = _field(str, "the key")
    expected: str = _field(str, "the value it must have [base64] (empty: absent)")
    desired: str = _field(str, "the value it gets then [base64]")


@dataclass(slots=True)
class StoreAppend(StoreRequest):
    TYPE: ClassVar[str] = "store.append"
    REPLY: ClassVar[type[Reply]] = StoreOkReply
    key: str = _field(str, "the key")
    value: str = _field(str, "what to append to its value [base64]")


@dataclass(slots=True)
class StoreMultiSet(StoreRequest):
    TYPE: ClassVar[str] = "store.multi_set"
    REPLY: ClassVar[type[Reply]] = StoreOkReply
    keys: list = _field(list, "the keys [str]")
    values: list = _field(list, "their values, in order [base64]")


@dataclass(slots=True)
class StoreCheck(StoreRequest):
    TYPE: ClassVar[str] = "store.check"
    REPLY: ClassVar[type[Reply]] = StoreCheckReply
    keys: list = _field(list, "the keys [str]")


@dataclass(slots=True)
class StoreDelete(StoreRequest):
    TYPE: ClassVar[str] = "store.delete"
    REPLY: ClassVar[type[Reply]] = StoreDeleteReply
    key: str = _field(str, "the key")


@dataclass(slots=True)
class StoreNumKeys(StoreRequest):
    TYPE: ClassVar[str] = "store.num_keys"
    REPLY: ClassVar[type[Reply]] = StoreNumKeysReply


STORE_BY_TYPE: dict[str, type[Message]] = {m.TYPE: m for m in StoreRequest.__subclasses__()}
"""Every request type of the store (its table in ``docs/protocol.md``)."""


# ------------------------------------------------------------------ the port file


def read_port_file(run_dir: Path) -> dict | None:
    """The store's ``{"host", "port", "pid"}``, or None before it has started."""
    try:
        info = json.loads((Path(run_dir) / PORT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("port"), int) else None


def write_port_file(run_dir: Path, info: dict) -> None:
    path = Path(run_dir) / PORT_FILE
    tmp = path.with_name(f".{PORT_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info))
    os.replace(tmp, path)


class StoreFull(ValueError):
    """A write larger than the store's whole budget."""


class Keys:
    """The store's keys and values, with the memory bound; no I/O.

    A key's namespace is its first path component (a round's prefix): when the
    total passes ``budget`` the namespaces used least recently go first, never
    the one being written.
    """

    def __init__(self, budget: int = MAX_TOTAL_BYTES, max_value: int = MAX_VALUE_BYTES):
        self.budget, self.max_value = budget, max_value
        self.data: dict[str, bytes] = {}
        self.total = 0
        self.namespaces: OrderedDict[str, set[str]] = OrderedDict()  # least recently used first
        self.evicted = 0

    @staticmethod
    def namespace(key: str) -> str:
        return key.split("/", 1)[0]

    def touch(self, key: str) -> None:
        ns = self.namespace(key)
        if ns in self.namespaces:
            self.namespaces.move_to_end(ns)

    def get(self, key: str) -> bytes | None:
        self.touch(key)
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        size = len(key) + len(value)
        if len(value) > self.max_value or size > self.budget:
            raise StoreFull(
                f"a value of {len(value):,} bytes is over the torch store's limit ({self.max_value:,} bytes)"
            )
        self.delete(key)
        ns = self.namespace(key)
        self.namespaces.setdefault(ns, set()).add(key)
        self.namespaces.move_to_end(ns)
        self.data[key] = value
        self.total += size
        while self.total > self.budget:
            oldest = next(iter(self.namespaces))
            if oldest == ns:
                break  # cannot happen: this write alone fits the budget
            for k in self.namespaces.pop(oldest):
                self.total -= len(k) + len(self.data.pop(k))
            self.evicted += 1

    def delete(self, key: str) -> bool:
        value = self.data.pop(key, None)
        if value is None:
            return False
        self.total -= len(key) + len(value)
        ns = self.namespace(key)
        keys = self.namespaces.get(ns)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.namespaces[ns]
        return True


class StoreServer:
    """The store's request handler on a :class:`~pilotfill.transport.Server` of the store's channel."""

    def __init__(self, run_dir: Path, secret: bytes, host: str = "127.0.0.1", keys: Keys | None = None):
        self.keys = keys or Keys()
        self.server = Server(run_dir, secret, host=host, channel=CHANNEL, max_message_bytes=MAX_MESSAGE_BYTES)
        self.port = int(self.server.endpoint.rsplit(":", 1)[1])
        self._waiting: dict[str, set[str]] = {}  # key -> parked waits for it
        self._waits: dict[str, tuple[list[str], bool]] = {}  # parked wait -> (its keys, whether it returns values)
        self._serial = 0
        self.stopping = False

    def serve(self, timeout_ms: int = 200) -> int:
        return self.server.serve(self.handle, timeout_ms, max_batch=1024)

    def close(self) -> None:
        self.server.close()

    # ------------------------------------------------------------ requests

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | Park:
        try:
            reply = self._handle(message)
            if reply is None:
                return {"ok": False, "error": f"unknown store request {message.get('type')!r}"}
            return reply if isinstance(reply, Park) else {"ok": True, **reply.to_dict()}
        except StoreFull as exc:
            return {"ok": False, "error": str(exc)}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"bad store request: {exc!r}"[:300]}

    def _handle(self, m: dict[str, Any]) -> Reply | Park | None:
        """The reply to one request of the store's (None: not a store request)."""
        op, keys = m.get("type"), self.keys
        if op == StoreSet.TYPE:
            self._set(_key(m["key"]), decode(m["value"]))
            return StoreOkReply()
        if op == StoreMultiSet.TYPE:
            for key, value in zip(m["keys"], m["values"], strict=True):
                self._set(_key(key), decode(value))
            return StoreOkReply()
        if op == StoreAdd.TYPE:
            key, amount = _key(m["key"]), m["amount"]
            if not isinstance(amount, int) or isinstance(amount, bool):
                raise TypeError("amount must be an integer")
            value = int(keys.get(key) or b"0") + amount
            self._set(key, str(value).encode())
            return StoreAddReply(value=value)
        if op == StoreCompareSet.TYPE:
            key, expected, desired = _key(m["key"]), decode(m["expected"]), decode(m["desired"])
            now = keys.get(key)
            if (now is None and not expected) or now == expected:
                self._set(key, desired)
                now = desired
            return StoreCompareSetReply(value=encode(now if now is not None else expected))
        if op == StoreAppend.TYPE:
            key = _key(m["key"])
            self._set(key, (keys.get(key) or b"") + decode(m["value"]))
            return StoreOkReply()
        if op in (StoreGet.TYPE, StoreWait.TYPE, StoreMultiGet.TYPE):
            wanted = [_key(m["key"])] if op == StoreGet.TYPE else [_key(k) for k in m["keys"]]
            return self._wait(wanted, op != StoreWait.TYPE, float(m["timeout_s"]))
        if op == StoreCheck.TYPE:
            return StoreCheckReply(present=all(keys.get(_key(k)) is not None for k in m["keys"]))
        if op == StoreDelete.TYPE:
            return StoreDeleteReply(deleted=keys.delete(_key(m["key"])))
        if op == StoreNumKeys.TYPE:
            return StoreNumKeysReply(count=len(keys.data))
        return None

    def _set(self, key: str, value: bytes) -> None:
        self.keys.put(key, value)
        for parked in self._waiting.pop(key, set()):
            wanted, _ = self._waits.get(parked, ((), False))
            if all(k in self.keys.data for k in wanted):
                self.server.wake(parked)
            else:
                for k in wanted:
                    if k not in self.keys.data:
                        self._waiting.setdefault(k, set()).add(parked)

    def _wait(self, wanted: list[str], values: bool, timeout_s: float) -> Reply | Park:
        if all(self.keys.get(k) is not None for k in wanted):
            return self._answer(wanted, values)
        self._serial += 1
        parked = f"wait-{self._serial}"
        self._waits[parked] = (wanted, values)
        for k in wanted:
            if k not in self.keys.data:
                self._waiting.setdefault(k, set()).add(parked)
        return Park(parked, max(0.0, timeout_s), lambda: self._done(parked))

    def _done(self, parked: str) -> Reply:
        """The reply to a parked wait, when it is woken or its time is up."""
        wanted, values = self._waits.pop(parked, ((), False))
        for k in wanted:
            waiters = self._waiting.get(k)
            if waiters is not None:
                waiters.discard(parked)
                if not waiters:
                    del self._waiting[k]
        if all(k in self.keys.data for k in wanted):
            return self._answer(wanted, values)
        missing = [k for k in wanted if k not in self.keys.data][:8]
        return (StoreValuesReply if values else StoreWaitReply)(timeout=True, missing=missing)

    def _answer(self, wanted: list[str], values: bool) -> Reply:
        return StoreValuesReply(values=[encode(self.keys.data[k]) for k in wanted]) if values else StoreWaitReply()


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > 4096:
        raise ValueError("a key is a non-empty string of at most 4096 characters")
    return key


def decode(text: Any) -> bytes:
    """A value as it travels (base64 in JSON) back to bytes."""
    if not isinstance(text, str):
        raise TypeError("values travel as base64 strings")
    return base64.b64decode(text.encode(), validate=True)


def encode(value: bytes) -> str:
    return base64.b64encode(value).decode()


# ------------------------------------------------------------------ the process


def main(argv: list[str] | None = None) -> int:
    from ...security import load_secret

    ap = argparse.ArgumentParser(prog="python -m pilotfill.elastic.torch.store")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--host", default="127.0.0.1", help="the address clients on the nodes connect to")
    ap.add_argument(
        "--lease-deadline",
        type=float,
        default=None,
        help=(
            "outlive the controller (a restarted one adopts the store); "
            "end once the campaign's lease is ended or unrenewed this long"
        ),
    )
    args = ap.parse_args(argv)
    campaign = None
    if args.lease_deadline is None:
        die_with_parent()
    else:
        campaign = LeaseWatch(args.run_dir, args.lease_deadline)
    store = StoreServer(
        args.run_dir, load_secret(args.run_dir), host="127.0.0.1" if args.host in LOOPBACK else "0.0.0.0"
    )

    def stop(signum, frame) -> None:
        store.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    write_port_file(
        args.run_dir, {"host": args.host, "port": store.port, "pid": os.getpid(), "ticks": start_ticks(os.getpid())}
    )
    print(f"torch store listening on port {store.port} (clients use {args.host})", flush=True)
    try:
        while not store.stopping:
            store.serve()
            if campaign is not None and campaign.state() in (LeaseState.ENDED, LeaseState.GONE):
                print(f"the campaign is over ({campaign.state()}): the torch store ends", flush=True)
                break
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

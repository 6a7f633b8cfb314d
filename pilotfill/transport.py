"""Authenticated request/reply over ZeroMQ between the controller and its clients.

The controller binds one ROUTER socket and writes its address to
``controller.json`` in the run directory; each client uses a DEALER socket,
signs every request (:mod:`pilotfill.security`), and accepts only a reply
signed with the same secret and bound to its request's nonce. A client that
gets no reply in time reconnects (re-reading ``controller.json``, since a
restarted controller listens elsewhere) and retries with a new nonce, so a
controller restart is invisible to clients apart from the delay.

Connections are CurveZMQ (:func:`secure`): the server checks every client's
key during the handshake (a ZAP handler served with the requests), so a peer
without the run's secret is disconnected before any message of its is read —
a flood of bulk from another user costs the server nothing but the refused
handshakes, and authenticated requests are answered as usual. What an
authenticated peer can make the server hold is bounded too: a message size,
a few messages queued per peer (``RCVHWM``), and the replies remembered for
retries (by count and bytes).

The same server and client carry the torch store's channel
(:mod:`pilotfill.elastic.torch.store`), with a key of its own.

Payloads are JSON objects; the message types are in :mod:`pilotfill.protocol`.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import zmq
from zmq.utils import z85

from .security import AuthError, Verifier, channel_key, curve_keys, load_secret, nonce_of, seal, session_key

if TYPE_CHECKING:
    from .protocol import Message

log = logging.getLogger(__name__)

ENDPOINT_FILE = "controller.json"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest request accepted (a shipped function with its arguments); larger senders are disconnected."""
MAX_DEPTH = 64
"""Deepest nesting of lists and objects accepted in a request."""
WARN_EVERY_S = 10.0
REMEMBERED_REPLIES = 4096
"""Replies kept by request id, so that a client's retry (its reply was lost or late) is not applied twice."""
REMEMBERED_REPLY_BYTES = 64 * 1024
REMEMBERED_TOTAL_BYTES = 16 * 1024 * 1024
"""All remembered replies together stay under this (the oldest are forgotten first)."""
QUEUED_PER_PEER = 16
"""Messages ZeroMQ queues from one peer before it stops reading that peer (TCP then pushes back on the sender)."""
HANDSHAKE_S = 10.0
"""A connection that has not completed its CurveZMQ handshake by then is closed (a peer that connects and idles)."""
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"pilotfill"
HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
CONTROLLER = "controller"
"""The controller's channel: messages signed with its incarnation's key (:func:`pilotfill.security.session_key`)."""


def secure(sock: zmq.Socket, secret: bytes, server: bool) -> zmq.Socket:
    """Make ``sock`` a CurveZMQ server or client of the run whose secret is ``secret``."""
    server_public, server_private = curve_keys(secret, "server")
    if server:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = server_public, server_private
        sock.zap_domain = ZAP_DOMAIN
    else:
        sock.curve_serverkey = server_public
        sock.curve_publickey, sock.curve_secretkey = curve_keys(secret, "client")
    return sock


def dealer(secret: bytes, endpoint: str, ctx: zmq.Context | None = None) -> zmq.Socket:
    """A DEALER connected to ``endpoint`` as a client of the run (what :class:`Client` uses;
    tests send raw frames with it)."""
    sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure(sock, secret, server=False)
    sock.connect(endpoint)
    return sock


def message_key(secret: bytes, channel: str, incarnation: int | None) -> bytes:
    """The key a channel's messages are signed with: the controller's per incarnation, any other per channel."""
    return session_key(secret, incarnation) if channel == CONTROLLER else channel_key(secret, channel)


class ControllerUnavailable(ConnectionError):
    """No authenticated reply from the controller within the deadline."""


class Interrupted(RuntimeError):
    """A request given up because its caller's ``interrupt`` said so."""


class RequestRefused(RuntimeError):
    """The controller answered, but refused the request (its reason is the message)."""


class Fields(Protocol):
    """A typed reply (:class:`pilotfill.protocol.Reply`): what it sends is its ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Park:
    """A handler's answer meaning "reply later": when :meth:`Server.wake` is called with ``key``, or after
    ``timeout_s``, whichever comes first, the client gets ``reply()`` (computed then: a typed reply, sent as its
    ``to_dict()`` like the controller's others, or the fields as a dict). A long poll: a pilot agent waits for
    commands without asking every second, and gets them the moment there are some."""

    key: str
    timeout_s: float
    reply: Callable[[], Fields | dict[str, Any]]


class Server:
    """The controller's end: receive, authenticate, parse, dispatch, reply."""

    def __init__(
        self,
        run_dir: Path,
        key: bytes,
        host: str = "127.0.0.1",
        not_before: float | None = None,
        incarnation: int | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        channel: str = CONTROLLER,
    ):
        self.run_dir = Path(run_dir)
        self.incarnation = incarnation
        self._key = message_key(key, channel, incarnation)
        self._verify = Verifier(self._key, not_before=time.time() if not_before is None else not_before)
        self._ctx = zmq.Context()  # its own: the ZAP handler below answers for this server's sockets only
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._client_key = z85.decode(curve_keys(key, "client")[0])
        self.socket = self._ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        secure(self.socket, key, server=True)
        # A peer that sends more than this in one message is disconnected before it is buffered in full.
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.socket.setsockopt(zmq.RCVHWM, QUEUED_PER_PEER)
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        self._monitor = self.socket.get_monitor_socket(HANDSHAKE_FAILURES)
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        # Bound to every interface: tell clients on other nodes this host's name.
        reachable = socket.getfqdn() if host in ("0.0.0.0", "*") else host
        self.endpoint = f"tcp://{reachable}:{port}"
        self.dropped = 0
        self.refused = 0
        """Connections refused at the handshake (no or a wrong key): nothing they sent was read."""
        self._poller = zmq.Poller()
        for sock in (self.socket, self._zap, self._monitor):
            self._poller.register(sock, zmq.POLLIN)
        self._answered: OrderedDict[str, bytes] = OrderedDict()
        self._answered_bytes = 0
        # key -> identity, nonce, rid, deadline, park
        self._parked: dict[str, tuple[bytes, bytes, Any, float, Park]] = {}
        self._grouping = False  # inside serve(): requests of one group are being handled
        self._woken: set[str] = set()  # keys woken during the group before their request was parked
        self._deadlines: list[tuple[float, int, str]] = []  # (deadline, serial, key), a heap: expiry is O(log n)
        self._serial = 0
        self._warned_at = 0.0
        self._dropped_since_warning = 0

    def publish(self, **extra: Any) -> None:
        """Tell clients where to connect (atomically: write, then rename)."""
        path = self.run_dir / ENDPOINT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"endpoint": self.endpoint, "pid": os.getpid(), "incarnation": self.incarnation, **extra})
        )
        tmp.chmod(0o600)
        tmp.replace(path)

    def serve(self, handler: Callable[[dict[str, Any]], dict[str, Any]], timeout_ms: int, max_batch: int = 256,
              together: Callable[[], AbstractContextManager] | None = None) -> int:  # fmt: skip
        """Handle what arrives within ``timeout_ms``, at most ``max_batch`` requests; return how many were handled.

        Bounded so that the caller's own work (heartbeat checks, allocation)
        runs every tick however many clients are talking. ``together``: a
        context the requests read at once are handled in (the controller's
        group commit); their replies are sent when it has ended, so that no
        reply goes out before what it answers is durable.
        """
        handled = 0
        self._expire_parked()
        if self._deadlines:
            timeout_ms = min(timeout_ms, max(0, int((self._deadlines[0][0] - time.monotonic()) * 1000) + 1))
        end = time.monotonic() + timeout_ms / 1000
        while True:  # handshakes (ZAP) and refusals are handled as they come; return with requests, or at the end
            ready = dict(self._poller.poll(max(0, int((end - time.monotonic()) * 1000))))
            if self._zap in ready:
                self._answer_zap()
            if self._monitor in ready:
                self._count_refusals()
            if self.socket in ready or time.monotonic() >= end:
                break
        if self.socket not in ready:
            self._expire_parked()
            return 0
        arrived = []
        while len(arrived) < max_batch:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            identity, body = frames[0], frames[1:]
            try:
                nonce, payload = self._verify.open(body)
            except AuthError as exc:
                self._dropped(exc)
                continue
            arrived.append((identity, nonce, payload))
        answers = []
        self._grouping, self._woken = True, set()
        try:
            with together() if together is not None else nullcontext():
                for identity, nonce, payload in arrived:
                    answers.append((identity, nonce, *self._dispatch(handler, payload)))
        finally:
            self._grouping = False
        for identity, nonce, request, reply in answers:
            if isinstance(reply, Park) and reply.key in self._woken:  # news came later in the same group: no wait
                self._send(identity, nonce, request.get("rid"), reply.reply())
            elif isinstance(reply, Park):
                old = self._parked.pop(reply.key, None)
                if old is not None:  # the same client asked again: its earlier wait is over
                    self._send(*old[:3], old[4].reply())
                deadline = time.monotonic() + reply.timeout_s
                self._parked[reply.key] = (identity, nonce, request.get("rid"), deadline, reply)
                self._serial += 1
                heapq.heappush(self._deadlines, (deadline, self._serial, reply.key))
            else:
                self.socket.send_multipart([identity, *seal(self._key, reply, nonce=nonce)])
            handled += 1
        return handled

    def _answer_zap(self) -> None:
        """Answer ZeroMQ's authentication requests: a CURVE client whose key is the run's, and nobody else."""
        while True:
            try:
                frames = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            version, request_id, _domain, _address, _identity, mechanism, *credentials = frames
            ok = mechanism == b"CURVE" and len(credentials) == 1 and credentials[0] == self._client_key
            if not ok:
                self._refused("a client key that is not the run's")
            self._zap.send_multipart(
                [version, request_id, b"200" if ok else b"400", b"OK" if ok else b"not a client of this run", b"", b""]
            )

    def _count_refusals(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] & (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self._refused("a failed handshake (no or a wrong key)")

    def _refused(self, why: str) -> None:
        self.refused += 1
        self._dropped(AuthError(f"connection refused: {why}"))

    def wake(self, key: str) -> bool:
        """Answer the request parked under ``key`` now (False if none waits). Within a group of requests handled
        together, a request of that group that asks to be parked under ``key`` is answered at once instead."""
        parked = self._parked.pop(key, None)
        if parked is None:
            if self._grouping:
                self._woken.add(key)
            return False
        self._send(*parked[:3], parked[4].reply())
        return True

    def _expire_parked(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, key = heapq.heappop(self._deadlines)
            parked = self._parked.get(key)
            if parked is not None and parked[3] == deadline:  # else answered already, or parked again since
                del self._parked[key]
                self._send(*parked[:3], parked[4].reply())

    def _send(self, identity: bytes, nonce: bytes, rid: Any, reply: Fields | dict[str, Any]) -> None:
        """Send a parked request's reply, made now."""
        body = json.dumps({"ok": True, **(reply if isinstance(reply, dict) else reply.to_dict())}).encode()
        if isinstance(rid, str) and len(body) <= REMEMBERED_REPLY_BYTES:
            self._remember(rid, body)
        self.socket.send_multipart([identity, *seal(self._key, body, nonce=nonce)])

    def _dispatch(
        self, handler: Callable[[dict[str, Any]], Any], payload: bytes
    ) -> tuple[dict[str, Any], bytes | Park]:
        """The request and the reply (JSON bytes, or a :class:`Park`) to one authentic payload."""
        try:
            request = json.loads(payload)
            if not isinstance(request, dict):
                raise ValueError("payload is not an object")
            if _depth(request) > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        except (ValueError, RecursionError) as exc:
            return {}, json.dumps({"ok": False, "error": f"unparseable request: {str(exc)[:200]}"}).encode()
        # left in: a handler may journal it (job.submit does, so a retry is never applied twice)
        rid = request.get("rid")
        if isinstance(rid, str) and rid in self._answered:
            return {"rid": rid}, self._answered[rid]  # a client's retry of a request already applied
        answer = handler(request)
        if isinstance(answer, Park):
            return {"rid": rid}, answer
        reply = json.dumps(answer).encode()
        if isinstance(rid, str) and len(reply) <= REMEMBERED_REPLY_BYTES:
            # big replies are reads: answering twice is harmless
            self._remember(rid, reply)
        return {"rid": rid}, reply

    def _remember(self, rid: str, reply: bytes) -> None:
        old = self._answered.pop(rid, None)
        self._answered_bytes += len(reply) - (len(old) if old is not None else 0)
        self._answered[rid] = reply
        while len(self._answered) > REMEMBERED_REPLIES or self._answered_bytes > REMEMBERED_TOTAL_BYTES:
            self._answered_bytes -= len(self._answered.popitem(last=False)[1])

    def _dropped(self, exc: AuthError) -> None:
        """Count a message (or connection) that failed authentication; warn at most once per WARN_EVERY_S (a flood must
        not fill the disk)."""
        self.dropped += 1
        self._dropped_since_warning += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            log.warning("dropped %d message(s) that failed authentication (last: %s)", self._dropped_since_warning, exc)
            self._warned_at, self._dropped_since_warning = now, 0

    def close(self) -> None:
        self.socket.disable_monitor()
        for sock in (self._monitor, self.socket, self._zap):
            sock.close(0)
        self._ctx.term()


def _depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (iteratively: a deep value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((v, level + 1) for v in item if isinstance(v, (list, dict)))
    return deepest


class Client:
    """A client of the controller of ``run_dir``; thread-unsafe, cheap to create."""

    def __init__(
        self,
        run_dir: Path | str,
        timeout_s: float = 10.0,
        key: bytes | None = None,
        endpoint: str | None = None,
        channel: str = CONTROLLER,
    ):
        """``endpoint``: a fixed address (the torch store's), instead of the controller's from ``controller.json``;
        ``channel``: whose key signs the messages."""
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self._secret = key or load_secret(self.run_dir)
        self._channel = channel
        self._fixed = endpoint
        self._key = message_key(self._secret, channel, None)
        self._verify = Verifier(self._key)
        self._ctx = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._endpoint: str | None = None
        self._incarnation: int | None = None  # the controller incarnation the key and connection are for
        self._interrupt: Callable[[], bool] | None = None

    def _connect(self) -> zmq.Socket | None:
        if self._fixed is not None:
            endpoint, incarnation = self._fixed, None
        else:
            try:
                info = json.loads((self.run_dir / ENDPOINT_FILE).read_text())
                endpoint, incarnation = str(info["endpoint"]), info.get("incarnation")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return None
        incarnation = incarnation if isinstance(incarnation, int) else None
        if self._socket is None or endpoint != self._endpoint or incarnation != self._incarnation:
            # another controller (a new address, or a new incarnation at the same one): a new connection, new keys,
            # and nothing sent to the one before is delivered to it
            self.close()
            self._key = message_key(self._secret, self._channel, incarnation)
            self._verify = Verifier(self._key)
            self._socket = dealer(self._secret, endpoint, self._ctx)
            self._endpoint, self._incarnation = endpoint, incarnation
        return self._socket

    def request(self, message: Message | dict[str, Any], timeout_s: float | None = None, attempt_s: float = 2.0,
                interrupt: Callable[[], bool] | None = None) -> dict[str, Any]:  # fmt: skip
        """Send ``message`` (a :class:`pilotfill.protocol.Message`: every sender in pilotfill builds one, the torch
        store's requests included; a dict goes as it is); return the reply's fields. Retries until ``timeout_s``.

        ``interrupt``: checked a few times a second while waiting; when it says
        so, :class:`Interrupted` is raised (an agent waiting on a long poll that
        just got SIGTERM).
        """
        self._interrupt = interrupt
        if hasattr(message, "to_dict"):
            message = message.to_dict()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        # One request id for every attempt: a retry after a lost reply is answered, not applied twice.
        payload = json.dumps({**message, "rid": secrets.token_hex(16)}).encode()
        # Every attempt goes on the same connection while the controller's address stays: one that is slow to answer
        # (a busy machine) may still be finishing the handshake, and a new connection would start it again, for ever.
        # A reply to any attempt answers.
        sent: set[bytes] = set()
        while True:
            sock = self._connect()
            if sock is not None:
                frames = seal(self._key, payload)
                sock.send_multipart(frames)
                sent.add(nonce_of(frames))
                reply = self._await(sock, sent, min(attempt_s, max(0.05, deadline - time.monotonic())))
                if reply is not None:
                    if not reply.get("ok", False):
                        raise RequestRefused(reply.get("error", "refused"))
                    return reply
            if time.monotonic() >= deadline:
                raise ControllerUnavailable(
                    f"no reply from the controller of {self.run_dir} to {message.get('type')!r}"
                )
            time.sleep(0.1)

    def _await(self, sock: zmq.Socket, nonces: set[bytes], wait_s: float) -> dict[str, Any] | None:
        """The reply to one of ``nonces`` (this request's attempts) within ``wait_s``; a late reply to an earlier
        request is dropped."""
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0:
            if self._interrupt is not None and self._interrupt():
                self.close()  # the reply still on its way answers nothing any more: drop it with the socket
                raise Interrupted("interrupted while waiting for the controller")
            if not sock.poll(int(min(left, 0.2) * 1000) + 1):
                continue
            frames = sock.recv_multipart()
            nonce = nonce_of(frames) if len(frames) == 2 else None
            if nonce is not None and nonce not in nonces:
                log.debug("dropped a late reply to an earlier request")
                continue
            try:
                _, payload = self._verify.open(frames, expect_nonce=nonce)
            except AuthError as exc:
                log.warning("dropped a reply that failed authentication: %s", exc)
                continue
            return json.loads(payload)
        return None

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None
            self._endpoint = None
            self._incarnation = None

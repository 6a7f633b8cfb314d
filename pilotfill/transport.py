"""Authenticated request/reply over ZeroMQ between the controller and its clients.

The controller binds one ROUTER socket and writes its address to
``controller.json`` in the run directory; each client uses a DEALER socket,
signs every request (:mod:`pilotfill.security`), and accepts only a reply
signed with the same secret and bound to its request's nonce. A client that
gets no reply in time reconnects (re-reading ``controller.json``, since a
restarted controller listens elsewhere) and retries with a new nonce, so a
controller restart is invisible to clients apart from the delay.

Payloads are JSON objects; the message types are in :mod:`pilotfill.protocol`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from .security import AuthError, Verifier, load_secret, nonce_of, seal

log = logging.getLogger(__name__)

ENDPOINT_FILE = "controller.json"


class ControllerUnavailable(ConnectionError):
    """No authenticated reply from the controller within the deadline."""


class RequestRefused(RuntimeError):
    """The controller answered, but refused the request (its reason is the message)."""


class Server:
    """The controller's end: receive, authenticate, parse, dispatch, reply."""

    def __init__(self, run_dir: Path, key: bytes, host: str = "127.0.0.1", not_before: float | None = None):
        self.run_dir = Path(run_dir)
        self._key = key
        self._verify = Verifier(key, not_before=time.time() if not_before is None else not_before)
        self._ctx = zmq.Context.instance()
        self.socket = self._ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        # Bound to every interface: tell clients on other nodes this host's name.
        reachable = socket.getfqdn() if host in ("0.0.0.0", "*") else host
        self.endpoint = f"tcp://{reachable}:{port}"
        self.dropped = 0

    def publish(self, **extra: Any) -> None:
        """Tell clients where to connect (atomically: write, then rename)."""
        path = self.run_dir / ENDPOINT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"endpoint": self.endpoint, "pid": os.getpid(), **extra}))
        tmp.chmod(0o600)
        tmp.replace(path)

    def serve(self, handler: Callable[[dict[str, Any]], dict[str, Any]], timeout_ms: int) -> int:
        """Handle the requests that arrive within ``timeout_ms``; return how many were handled."""
        handled = 0
        if not self.socket.poll(timeout_ms):
            return 0
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return handled
            identity, body = frames[0], frames[1:]
            try:
                nonce, payload = self._verify.open(body)
            except AuthError as exc:
                self.dropped += 1
                log.warning("dropped a message that failed authentication: %s", exc)
                continue
            try:
                request = json.loads(payload)
                if not isinstance(request, dict):
                    raise ValueError("payload is not an object")
            except ValueError as exc:
                reply: dict[str, Any] = {"ok": False, "error": f"unparseable request: {exc}"}
            else:
                reply = handler(request)
            self.socket.send_multipart([identity, *seal(self._key, json.dumps(reply).encode(), nonce=nonce)])
            handled += 1

    def close(self) -> None:
        self.socket.close(0)


class Client:
    """A client of the controller of ``run_dir``; thread-unsafe, cheap to create."""

    def __init__(self, run_dir: Path | str, timeout_s: float = 10.0, key: bytes | None = None):
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self._key = key or load_secret(self.run_dir)
        self._verify = Verifier(self._key)
        self._ctx = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._endpoint: str | None = None

    def _connect(self) -> zmq.Socket | None:
        try:
            info = json.loads((self.run_dir / ENDPOINT_FILE).read_text())
        except (OSError, ValueError):
            return None
        if self._socket is None or info["endpoint"] != self._endpoint:
            self.close()
            self._socket = self._ctx.socket(zmq.DEALER)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.connect(info["endpoint"])
            self._endpoint = info["endpoint"]
        return self._socket

    def request(self, message: dict[str, Any], timeout_s: float | None = None, attempt_s: float = 2.0) -> dict[str, Any]:
        """Send ``message``; return the reply's fields. Retries until ``timeout_s``."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        payload = json.dumps(message).encode()
        while True:
            sock = self._connect()
            if sock is not None:
                frames = seal(self._key, payload)
                sock.send_multipart(frames)
                reply = self._await(sock, nonce_of(frames), min(attempt_s, max(0.05, deadline - time.monotonic())))
                if reply is not None:
                    if not reply.get("ok", False):
                        raise RequestRefused(reply.get("error", "refused"))
                    return reply
                self.close()  # a lost request or a dead controller: start afresh
            if time.monotonic() >= deadline:
                raise ControllerUnavailable(f"no reply from the controller of {self.run_dir} to {message.get('type')!r}")
            time.sleep(0.1)

    def _await(self, sock: zmq.Socket, nonce: bytes, wait_s: float) -> dict[str, Any] | None:
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                return None
            frames = sock.recv_multipart()
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

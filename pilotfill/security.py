"""The per-run secret and message authentication (DESIGN, "Security").

Two layers, both keyed by the run's secret. The connection: CurveZMQ, with
the server's and the clients' key pairs derived from the secret
(:func:`curve_keys`) and every client's key checked by the server (ZAP) during
the handshake, so a peer without the secret never gets a message buffered —
whatever it sends ends at the handshake. The message: every message between
the controller and its clients is an envelope

    nonce (16 random bytes) | time (8 bytes, big-endian float, POSIX s) | payload

sent as two frames, ``MAC`` and ``envelope``, where MAC = HMAC-SHA256(secret,
envelope). The receiver checks, in this order and before looking at the
payload: the frame layout, the MAC (constant-time), that the time is recent
(and, for the controller, not older than its own start, so nothing captured
before a restart is accepted), and that the nonce was not seen within the
acceptance window. Only then is the payload (JSON) parsed. A reply reuses its
request's nonce, binding it to that request.

The secret lives in the run directory, created with mode 0600 by the first
controller; run directories are created 0700.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import time
from collections import OrderedDict
from pathlib import Path

SECRET_FILE = "secret.key"
NONCE_BYTES = 16
HEADER = struct.Struct(">16sd")
MAC_BYTES = 32
WINDOW_S = 120.0
"""A message older (or further in the future) than this is refused."""
CLOCK_SKEW_S = 5.0
"""Tolerated difference between the clocks of a client host and the controller's."""


class AuthError(Exception):
    """A message that failed authentication; carries why, never the payload."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable by the owner only."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o777 != 0o700:
        os.chmod(path, 0o700)
    return path


def create_secret(run_dir: Path) -> bytes:
    """Create the run's secret (mode 0600) if it does not exist; return it."""
    private_dir(run_dir)
    path = run_dir / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load_secret(run_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32).hex().encode())
    return load_secret(run_dir)


def load_secret(run_dir: Path) -> bytes:
    """Read the run's secret, refusing one that others could read."""
    path = Path(run_dir) / SECRET_FILE
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} is mode {mode:o}; it must be readable by its owner only (0600)")
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise PermissionError(f"{path} is too short to be a pilotfill secret")
    return key


def session_key(secret: bytes, incarnation: int | None) -> bytes:
    """The key messages to and from controller number ``incarnation`` are signed with.

    Derived from the run's secret, so that only holders of the secret can
    compute it, and different for every controller started on the run
    directory: a message captured from one controller is never accepted by the
    next, however soon after a restart it is replayed. ``None``: the secret itself.
    """
    if incarnation is None:
        return secret
    return (
        hmac.new(secret, f"pilotfill controller incarnation {int(incarnation)}".encode(), hashlib.sha256)
        .hexdigest()
        .encode()
    )


def channel_key(secret: bytes, channel: str) -> bytes:
    """The key of a channel other than the controller's (the torch store's): derived from the secret, so a message
    signed for one channel is never accepted on another."""
    return hmac.new(secret, f"pilotfill channel {channel}".encode(), hashlib.sha256).hexdigest().encode()


def curve_keys(secret: bytes, role: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` CurveZMQ keys (Z85) of ``role`` ("server" or "client") for the run: derived from the run's
    secret, so only its holders can complete a handshake with a server of the run, or act as its client."""
    import zmq
    from zmq.utils import z85

    private = z85.encode(hmac.new(secret, f"pilotfill curve {role}".encode(), hashlib.sha256).digest())
    return zmq.curve_public(private), private


def seal(key: bytes, payload: bytes, nonce: bytes | None = None, now: float | None = None) -> list[bytes]:
    """Frames [MAC, envelope] for ``payload``; a fresh nonce unless replying to one."""
    envelope = HEADER.pack(nonce or secrets.token_bytes(NONCE_BYTES), time.time() if now is None else now) + payload
    return [hmac.new(key, envelope, hashlib.sha256).digest(), envelope]


def nonce_of(frames: list[bytes]) -> bytes:
    return frames[1][:NONCE_BYTES]


class Verifier:
    """Checks frames from the network; remembers nonces for the acceptance window."""

    def __init__(self, key: bytes, not_before: float = 0.0, window_s: float = WINDOW_S):
        self._key = key
        self._not_before = not_before
        self._window = window_s
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def open(
        self, frames: list[bytes], expect_nonce: bytes | None = None, now: float | None = None
    ) -> tuple[bytes, bytes]:
        """(nonce, payload bytes) of an authentic, fresh message, else :class:`AuthError`."""
        if len(frames) != 2 or len(frames[0]) != MAC_BYTES or len(frames[1]) < HEADER.size:
            raise AuthError("malformed frames")
        mac, envelope = frames
        if not hmac.compare_digest(mac, hmac.new(self._key, envelope, hashlib.sha256).digest()):
            raise AuthError("bad signature")
        nonce, sent = HEADER.unpack_from(envelope)
        now = time.time() if now is None else now
        if not (now - self._window <= sent <= now + CLOCK_SKEW_S) or sent < self._not_before - CLOCK_SKEW_S:
            raise AuthError("stale or future timestamp")
        if expect_nonce is not None:
            if nonce != expect_nonce:
                raise AuthError("reply to another request")
        else:
            if nonce in self._seen:
                raise AuthError("replayed nonce")
            self._seen[nonce] = sent
            while self._seen and next(iter(self._seen.values())) < now - self._window - CLOCK_SKEW_S:
                self._seen.popitem(last=False)
        return nonce, envelope[HEADER.size :]

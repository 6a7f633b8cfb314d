"""Another local user, for the tests that attack a run as one: a child of the test that drops to ``nobody``.

The child is forked (not exec'd: the test's interpreter lives under a home
directory another user cannot read) and gives up root before it does anything
else — ``setgroups``, ``setgid``, ``setuid`` — so what it does, it does with
no more rights than any other user of the machine: it cannot read the run
directory, the secret or ``controller.json``; it knows an address only the way
anyone could (``/proc/net/tcp``, or a port scan), here handed to it.

    attack = as_other_user(flood, endpoint)     # runs at once, in the child
    ...                                         # meanwhile the test goes on
    result = attack.result(timeout_s=120)       # what the function returned (JSON), or its error re-raised

What the function imports must be imported before the fork (the other user
cannot read the interpreter's files); the test module's imports are.

The function gets a ``stop`` file descriptor first: readable (EOF) once the
test calls ``attack.stop()``, for attacks that hold on until told.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - imported lazily by getaddrinfo, from where the other user cannot read
import json
import os
import pwd
import select
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import IN_CI

OTHER = "nobody"


def other_uid() -> tuple[int, int]:
    """(uid, gid) of the other user; skips (fails in CI) where this process cannot become it."""
    try:
        entry = pwd.getpwnam(OTHER)
    except KeyError:
        entry = None
    if os.geteuid() != 0 or entry is None:
        why = "not root" if os.geteuid() != 0 else f"no user {OTHER!r}"
        if IN_CI:
            pytest.fail(f"CI runs as root with a user {OTHER!r}, to attack a run as another user ({why})")
        pytest.skip(f"cannot act as another local user here ({why})")
    return entry.pw_uid, entry.pw_gid


class Attack:
    def __init__(self, pid: int, out: int, stop: int):
        self.pid, self._out, self._stop = pid, out, stop

    def stop(self) -> None:
        if self._stop >= 0:
            os.close(self._stop)
            self._stop = -1

    def result(self, timeout_s: float) -> Any:
        """What the function returned; its exception's text raised as AssertionError; a hang killed and said."""
        data, deadline = b"", time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(self._out, 65536)
                if not chunk:
                    break
                data += chunk
            else:
                raise AssertionError(f"the other user's attack did not end within {timeout_s:.0f} s")
        finally:
            self.stop()
            os.close(self._out)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
        outcome = json.loads(data or b'{"error": "the attacker died without a word"}')
        if "error" in outcome:
            raise AssertionError(f"the other user's attack failed: {outcome['error']}")
        return outcome["result"]


def as_other_user(fn: Callable[..., Any], *args: Any) -> Attack:
    """Run ``fn(stop_fd, *args)`` in a child that is the other user; its JSON-able return value comes back."""
    uid, gid = other_uid()
    out_r, out_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the other user first, then attack; never return into pytest
        code = 0
        try:
            os.close(out_r)
            os.close(stop_w)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise RuntimeError("still root")
            outcome = {"result": fn(stop_r, *args)}
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            outcome, code = {"error": f"{type(exc).__name__}: {exc}"[:2000]}, 1
        try:
            os.write(out_w, json.dumps(outcome, default=str).encode())
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(stop_r)
    return Attack(pid, out_r, stop_w)


def stopped(stop_fd: int, wait_s: float = 0.0) -> bool:
    """In an attack: whether the test said stop (waiting up to ``wait_s`` for it)."""
    ready, _, _ = select.select([stop_fd], [], [], wait_s)
    return bool(ready)


def vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of ``pid`` (VmHWM), in MB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")

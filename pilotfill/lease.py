"""Whether the campaign that started a run is still there: a lease ``pilotfill run`` renews in the run directory.

A controller can die and be replaced: ``pilotfill run`` (its supervisor)
restarts it, and every pilot must wait for the new one. When ``pilotfill run``
itself is gone — SIGKILLed, its machine lost — nobody will restart a
controller, and a pilot that waits (it did for 600 s) holds nodes the main
workload wants. Pilot agents run on compute nodes and cannot see a process on
the login node; they can read the run directory, which every node shares. So
the supervisor renews a lease there every :data:`RENEW_S` (a counter, written
in place: a reader on NFS revalidates a file it reopens) and marks it ended
when it stops; an agent that cannot reach the controller ends its pilot when
the lease is ended or has not changed for the heartbeat deadline, as seen by
its own clock (no clock is compared across hosts).

What a supervised controller starts for its campaign on this machine (the
local cluster's pilot agents, the torch store) outlives the controller so
that the next one adopts it (:func:`restarted_if_it_dies`), and ends by the
same rule as an agent: when the lease is ended or no longer renewed.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from . import procs
from .lifecycle import LeaseState

LEASE_FILE = "supervisor.json"
RENEW_S = 1.0


class Lease:
    """The supervisor's side: ``start()`` renews the lease on a thread, ``end()`` marks it ended (the campaign is over
    or stopped: every agent still waiting for a controller may go)."""

    def __init__(self, run_dir: Path, renew_s: float = RENEW_S):
        self.path = Path(run_dir) / LEASE_FILE
        self.renew_s = renew_s
        self._beat = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._write(LeaseState.RUNNING)
        self._thread = threading.Thread(target=self._renew, name="pilotfill-lease", daemon=True)
        self._thread.start()

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._write(LeaseState.ENDED)

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            self._write(LeaseState.RUNNING)

    def _write(self, state: LeaseState) -> None:
        self._beat += 1
        text = json.dumps({"state": state, "beat": self._beat, "pid": os.getpid(), "host": socket.gethostname()}) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.write(fd, text.encode().ljust(128))
                os.ftruncate(fd, 128)
            finally:
                os.close(fd)
        except OSError:
            pass  # a full disk or a read-only run directory: the journal says so; agents then wait as without a lease


class LeaseWatch:
    """The agent's side: ``state()`` is ``"running"``, ``"ended"``, ``"gone"`` (no renewal for ``deadline_s`` by this
    process's clock) or ``"none"`` (no lease was ever seen: a controller without ``pilotfill run``)."""

    def __init__(self, run_dir: Path | str, deadline_s: float, clock=time.monotonic):
        self.path = Path(run_dir) / LEASE_FILE
        self.deadline_s = deadline_s
        self.clock = clock
        self._seen: str | None = None
        self._changed_at = clock()
        self._read_at = -1e18

    def state(self) -> LeaseState:
        now = self.clock()
        if now - self._read_at >= min(RENEW_S, self.deadline_s / 4):
            self._read_at = now
            try:
                text = self.path.read_text()
            except OSError:
                text = None
            if text is not None and text != self._seen:
                self._seen, self._changed_at = text, now
        if self._seen is None:
            return LeaseState.NONE
        try:
            if json.loads(self._seen).get("state") == LeaseState.ENDED:
                return LeaseState.ENDED
        except ValueError:
            pass  # a torn read: it changed, which is all we need
        return LeaseState.GONE if now - self._changed_at > self.deadline_s else LeaseState.RUNNING


def holder(run_dir: Path | str) -> tuple[int, int] | None:
    """The ``pilotfill run`` renewing the run's lease on this host now: its pid and kernel start time; None where there
    is no lease, it has ended, or its process is gone."""
    try:
        info = json.loads((Path(run_dir) / LEASE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(info, dict)
        or info.get("state") != LeaseState.RUNNING
        or info.get("host") != socket.gethostname()
        or not isinstance(info.get("pid"), int)
    ):
        return None
    ticks = procs.start_ticks(info["pid"])
    return (info["pid"], ticks) if ticks is not None else None


def restarted_if_it_dies(run_dir: Path | str) -> bool:
    """Whether this process (a controller) is the child of the ``pilotfill run`` that renews the run's lease: if it
    dies, a new controller starts on the run directory and adopts what this one left running."""
    found = holder(run_dir)
    return found is not None and found[0] == os.getppid()

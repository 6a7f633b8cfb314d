"""Child processes that cannot outlive the controller — unless a restarted controller adopts them.

Every process the controller starts (pilot agents of the local cluster,
training ranks) runs in its own session (so its whole group can be signalled)
and asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``),
so a controller killed with SIGKILL takes them along. As a second line, each
is recorded in the state with its kernel start time, and a new controller on
the same run directory kills whatever a predecessor left (checking the start
time, so a recycled pid is never hit).

The exception: a controller that ``pilotfill run`` restarts if it dies
(:func:`pilotfill.lease.restarted_if_it_dies`) starts what its campaign
needs across a restart — the local cluster's pilot agents, the torch store —
with ``outlive_parent``, and its successor takes them over as :class:`Adopted`
processes (:mod:`pilotfill.controller.recovery`). Those end themselves when
the campaign's lease is ended or no longer renewed (:mod:`pilotfill.lease`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


_forked_by = 0
"""The pid of the process that last forked here (set in the parent, just before the fork, and copied into the child)."""


def _note_forking_parent() -> None:
    global _forked_by
    _forked_by = os.getpid()


os.register_at_fork(before=_note_forking_parent)


def die_with_parent() -> None:  # runs in the child between fork and exec
    """SIGKILL when the parent dies. A parent that died between the fork and this call would never send it (the
    child is already someone else's): then the child goes now, as it would have a moment later."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if _forked_by and os.getppid() != _forked_by:
            os.kill(os.getpid(), signal.SIGKILL)


def become_subreaper() -> None:
    """Orphans below this process are re-parented to it, not to init: it can reap them and see them go (a pilot's
    agent and keeper must be the last of their batch job's session to exit, and init may reap late)."""
    if _libc is not None:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1)


def reap() -> list[tuple[int, int]]:
    """Wait for every child that has exited (zombies, orphans re-parented here included); (pid, status) of each."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def session_members(sid: int | None = None) -> list[int]:
    """Every process of session ``sid`` (default: this one's) but this process, zombies included: what a batch
    system's MOM counts when it decides whether a job's session has ended."""
    sid = os.getsid(0) if sid is None else sid
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(b")") + 2 :].split()[3]) == sid:
            out.append(int(entry))
    return out


def settle_session(timeout_s: float) -> list[int]:
    """Before the top process of a batch job exits: reap what it can, SIGKILL what is left of its session after
    ``timeout_s``, reap again; returns the members still there (none, unless someone else's child lingers).

    Only a session's leader settles it: a batch job's top process leads the session MOM made for it, but a process
    that does not (an agent run in a test, or from someone's shell) shares its session with the shell, ``make`` and
    whatever started it, which are not ours to kill."""
    if os.getsid(0) != os.getpid():
        return []
    end = time.monotonic() + timeout_s
    killed = False
    while True:
        reap()
        members = session_members()
        if not members:
            return []
        if time.monotonic() >= end:
            if killed:
                return members
            for pid in members:
                kill_pid(pid)
            killed, end = True, time.monotonic() + 1.0
        time.sleep(0.02)


LOG_LIMIT_BYTES = 64 * 1024 * 1024
"""A process's log keeps at most about this much of its latest output (and as much again in ``LOG.1``): a rank that
prints a gigabyte fills no disk."""


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    log_path: str | None = None,
    cwd: str | None = None,
    log_limit_bytes: int | None = None,
    outlive_parent: bool = False,
) -> subprocess.Popen:
    """Start ``argv`` in a new session, dying with this process; output to ``log_path`` — through a pipe this process
    reads when ``log_limit_bytes`` caps it (the log then rotates: ``LOG.1`` holds the previous part).

    ``outlive_parent``: the process does not die with this one (a restarted controller adopts it); it must end itself
    when nobody will (the campaign's lease)."""
    capped = bool(log_path) and log_limit_bytes is not None
    out = subprocess.PIPE if capped else open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=None if outlive_parent else die_with_parent,
        )
    finally:
        if log_path and not capped:
            out.close()
    if capped:
        threading.Thread(
            target=pump_log, args=(proc.stdout, str(log_path), int(log_limit_bytes)), name="pilotfill-log", daemon=True
        ).start()
    return proc


def pump_log(pipe, path: str, limit: int = LOG_LIMIT_BYTES) -> None:
    """Copy a child's output to ``path``; past ``limit`` bytes the file becomes ``path.1`` and a new one starts."""
    log = open(path, "ab")
    try:
        written = log.tell()
        while True:
            chunk = pipe.read1(1 << 16)
            if not chunk:
                return
            if written + len(chunk) > limit and written:
                log.close()
                os.replace(path, path + ".1")
                log, written = open(path, "ab"), 0
            log.write(chunk)
            log.flush()
            written += len(chunk)
    except OSError:
        return  # a full disk: the child's output is dropped, not the child
    finally:
        log.close()
        pipe.close()


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


UNKNOWN_EXIT = 255
"""The exit status :class:`Adopted` gives for a process it saw go: not its child, it cannot know the real one."""


class Adopted:
    """A process this one did not start (a predecessor controller's), watched as a ``Popen`` is: by pid and kernel start
    time, so a recycled pid is never taken for it. Its exit status is not ours to read: :data:`UNKNOWN_EXIT`."""

    def __init__(self, pid: int, ticks: int | None):
        self.pid, self.ticks = pid, ticks
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not alive(self.pid, self.ticks):
            self.returncode = UNKNOWN_EXIT
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        return code


def alive(pid: int, ticks: int | None = None) -> bool:
    """True if ``pid`` runs (and, when given, is the process that started at ``ticks``)."""
    now = start_ticks(pid)
    if now is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().split(b") ", 1)[1][:1] == b"Z":
                return False
    except OSError:
        return False
    return ticks is None or now == ticks


def kill_group(pid: int, ticks: int | None = None, grace_s: float = 0.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL the group after ``grace_s``.

    The group is killed even when its leader has already gone, so that no
    grandchild survives; ``ticks`` guards against a recycled pid.
    """
    if ticks is not None and start_ticks(pid) not in (None, ticks):
        return  # the pid now belongs to someone else
    if grace_s > 0:
        signal_group(pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and alive(pid, ticks):
            time.sleep(0.05)
    signal_group(pid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group, if it is still there (gone or not ours: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_pid(pid: int, sig: int) -> None:
    """Send ``sig`` to one process (not its group), if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_pid(pid: int) -> None:
    """SIGKILL one process (not its group), if it is still there."""
    signal_pid(pid, signal.SIGKILL)


def descendants(pids: Iterable[int]) -> list[int]:
    """Every live process below ``pids`` (children, theirs, …) by the kernel's parent links: what a process started,
    in whatever session or group it put itself, as long as nothing in between has exited."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    seen = set(pids)
    todo = list(seen)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def with_environment(**wanted: str) -> list[int]:
    """Live processes (other than this one) whose environment has all of ``wanted``."""
    return list(environments(**wanted))


def environments(**wanted: str) -> dict[int, dict[str, str]]:
    """Live processes (other than this one) whose environment has all of ``wanted``, with their environments."""
    needles = [f"{k}={v}".encode() for k, v in wanted.items()]
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(n in env for n in needles) and alive(int(entry)):
            pairs = (item.decode(errors="replace").partition("=") for item in env if b"=" in item)
            found[int(entry)] = {k: v for k, _, v in pairs}
    return found

"""Starting a job's processes on a node — through that node's pilot agent, never from the controller.

:class:`NodeLauncher` is what a runtime asks for: launch ``argv`` for a job on a
host, terminate it, and tell which ended. The controller's implementation
forwards these to the pilot agent of the host; :class:`LocalLauncher` is what
that agent runs on its own node, and what tests and the local virtual cluster
use directly (every "host" is this machine, the process just carries
``PILOTFILL_HOST``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from .. import procs

TERMINATE_GRACE_S = 3.0
"""SIGTERM first; the whole process group gets SIGKILL this long after."""


@dataclass(frozen=True)
class ProcessExit:
    """A launched process ended. ``requested``: :meth:`NodeLauncher.terminate` asked for it."""

    host: str
    job_id: str
    returncode: int
    requested: bool


class NodeLauncher(ABC):
    @abstractmethod
    def launch(self, host: str, job_id: str, argv: list[str], env: dict[str, str]) -> None:
        """Start ``argv`` on ``host`` (through that node's pilot agent); ``env`` is added to the agent's environment."""

    @abstractmethod
    def terminate(self, host: str, job_id: str) -> None:
        """End ``job_id``'s processes on ``host``: SIGTERM, SIGKILL after a grace. Returns at once."""

    @abstractmethod
    def exits(self) -> list[ProcessExit]:
        """Processes that ended since the last call."""


@dataclass
class _Running:
    proc: subprocess.Popen
    ticks: int | None
    requested: bool = False


class LocalLauncher(NodeLauncher):
    """Runs each process here, in its own session (so its whole group can be signalled), dying with us.

    ``log_dir``: each process's output goes to ``<job>.<host>.log`` there (else nowhere).
    """

    def __init__(
        self,
        log_dir: Path | str | None = None,
        grace_s: float = TERMINATE_GRACE_S,
        base_env: dict[str, str] | None = None,
    ):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.grace_s = grace_s
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._running: dict[tuple[str, str], _Running] = {}
        self._ended: list[ProcessExit] = []
        self._lock = threading.Lock()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, host: str, job_id: str) -> Path:
        """Where ``job_id``'s process on ``host`` writes its output (``os.devnull`` without a ``log_dir``)."""
        return self.log_dir / f"{job_id}.{host}.log" if self.log_dir is not None else Path(os.devnull)

    def launch(self, host: str, job_id: str, argv: list[str], env: dict[str, str]) -> None:
        if (host, job_id) in self._running:
            self.terminate(host, job_id)
            self._reap(host, job_id, wait=True)
        log = str(self.log_path(host, job_id)) if self.log_dir is not None else None
        proc = procs.spawn(
            argv,
            env={**self.base_env, **env, "PILOTFILL_HOST": host},
            log_path=log,
            log_limit_bytes=procs.LOG_LIMIT_BYTES,
        )
        with self._lock:
            self._running[(host, job_id)] = _Running(proc, procs.start_ticks(proc.pid))

    def terminate(self, host: str, job_id: str) -> None:
        with self._lock:
            run = self._running.get((host, job_id))
            if run is None or run.requested:
                return
            run.requested = True
        procs.signal_group(run.proc.pid, signal.SIGTERM)
        timer = threading.Timer(self.grace_s, self._kill_if_running, args=(run,))
        timer.daemon = True
        timer.start()

    def exits(self) -> list[ProcessExit]:
        for host, job_id in list(self._running):
            self._reap(host, job_id)
        with self._lock:
            out, self._ended = self._ended, []
        return out

    def pid(self, host: str, job_id: str) -> int | None:
        """The launched process's pid (its process group), while it runs."""
        run = self._running.get((host, job_id))
        return run.proc.pid if run is not None and run.proc.poll() is None else None

    def running(self) -> list[tuple[str, str]]:
        """(host, job_id) of every launched process not yet reported as ended."""
        return list(self._running)

    def close(self) -> None:
        """End everything now (SIGTERM, then SIGKILL after the grace) and wait for it."""
        for host, job_id in list(self._running):
            self.terminate(host, job_id)
        for host, job_id in list(self._running):
            self._reap(host, job_id, wait=True)

    def _reap(self, host: str, job_id: str, wait: bool = False) -> None:
        run = self._running.get((host, job_id))
        if run is None:
            return
        if wait:
            try:
                run.proc.wait(self.grace_s + 5.0)
            except subprocess.TimeoutExpired:
                self._kill_group(run)
                run.proc.wait()
        if run.proc.poll() is None:
            return
        # The leader is gone; nothing of its group may outlive it (workers, forkservers).
        procs.kill_group(run.proc.pid)
        with self._lock:
            if self._running.get((host, job_id)) is run:
                del self._running[(host, job_id)]
                self._ended.append(ProcessExit(host, job_id, run.proc.returncode, run.requested))

    @staticmethod
    def _kill_group(run: _Running) -> None:
        procs.kill_group(run.proc.pid)

    @staticmethod
    def _kill_if_running(run: _Running) -> None:
        # Once the leader is reaped, _reap has already killed its group (and its pid may be reused).
        if run.proc.poll() is None:
            procs.kill_group(run.proc.pid)

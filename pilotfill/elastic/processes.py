"""The simple runtime: every rank is a plain process running the job's function on its host.

It has no collective communication — each rank works and reports on its own —
which is enough to prove the controller, pilots and durable state with real
processes, and is the shape Elastic Horovod fills in next. On the local
cluster "running on host X" means a process on this machine with
``PILOTFILL_HOST=X``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import procs
from .base import RankExit, Runtime

STOP_GRACE_S = 3.0


class ProcessRuntime(Runtime):
    def __init__(self, run_dir: Path, on_spawn: Callable[[subprocess.Popen, str, str], None] | None = None):
        self.run_dir = Path(run_dir)
        self._on_spawn = on_spawn or (lambda p, job, host: None)
        self._ranks: dict[str, dict[str, subprocess.Popen]] = {}
        self._stopping: list[tuple[str, str, subprocess.Popen, float]] = []  # job, host, process, SIGKILL deadline
        self._specs: dict[str, dict[str, Any]] = {}
        (self.run_dir / "logs").mkdir(exist_ok=True)

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        self._specs[job_id] = spec
        self._ranks.setdefault(job_id, {})
        self.resize(job_id, hosts)

    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        ranks = self._ranks.setdefault(job_id, {})
        for host in [h for h in ranks if h not in hosts]:
            self._terminate(job_id, host, ranks.pop(host))
        for host in hosts:
            if host not in ranks:
                ranks[host] = self._spawn(job_id, host, rank=len(ranks), size=len(hosts))

    def stop(self, job_id: str) -> None:
        for host, proc in self._ranks.pop(job_id, {}).items():
            self._terminate(job_id, host, proc)

    def hosts(self, job_id: str) -> list[str]:
        return list(self._ranks.get(job_id, {}))

    def poll(self) -> list[RankExit]:
        out: list[RankExit] = []
        for job_id, ranks in self._ranks.items():
            for host, proc in list(ranks.items()):
                if proc.poll() is not None:
                    del ranks[host]
                    out.append(RankExit(job_id, host, proc.returncode, requested=False))
        now = time.monotonic()
        still = []
        for job_id, host, proc, deadline in self._stopping:
            if proc.poll() is not None:
                out.append(RankExit(job_id, host, proc.returncode, requested=True))
            elif now >= deadline:
                procs.kill_group(proc.pid)
                still.append((job_id, host, proc, now + 1.0))
            else:
                still.append((job_id, host, proc, deadline))
        self._stopping = still
        return out

    def close(self) -> None:
        for job_id in list(self._ranks):
            self.stop(job_id)
        for _, _, proc, _ in self._stopping:
            procs.kill_group(proc.pid)
            proc.wait()
        self._stopping = []

    def _spawn(self, job_id: str, host: str, rank: int, size: int) -> subprocess.Popen:
        env = {
            **os.environ,
            "PILOTFILL_RUN_DIR": str(self.run_dir),
            "PILOTFILL_JOB_ID": job_id,
            "PILOTFILL_HOST": host,
            "PILOTFILL_RANK": str(rank),
            "PILOTFILL_SIZE": str(size),
        }
        log = self.run_dir / "logs" / f"{job_id}.{host}.log"
        proc = procs.spawn([sys.executable, "-m", "pilotfill.elastic.rank"], env=env, log_path=str(log))
        self._on_spawn(proc, job_id, host)
        return proc

    def _terminate(self, job_id: str, host: str, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._stopping.append((job_id, host, proc, time.monotonic() + STOP_GRACE_S))

"""Slurm: pilots in a low-priority, preemptible partition, sized by a node range.

* idle nodes: ``sinfo -N -h -p PARTITION -t idle -o %N`` (nodes in no job);
* pilots: ``sbatch --parsable -p PARTITION -N MIN-MAX --time=MAX --time-min=MIN``
  with a job script of our own (Parsl's Slurm template writes a fixed
  ``--nodes``/``--time``; a pilot wants whatever is idle, as long as it fits);
* status: ``squeue -h -j IDS -o "%i|%T|%N"`` (a job no longer listed has ended);
* giving nodes back: ``scontrol update JobId=ID NodeList=KEPT`` — Slurm shrinks
  a running job in place; the batch host (first node) holds the job script,
  so it is released only by ending the pilot (``scancel``);
* preemption: the partition's ``PreemptMode`` with ``GraceTime`` sends the job
  SIGTERM first, which the agent inside turns into ``pilot.leaving``.

Every command goes through :func:`pilotfill.schedulers.commands.run` (timeout,
retries with backoff, errors naming the command and its output).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import PilotConfig, SlurmConfig
from .base import BatchScheduler, PilotEvent, agent_command
from .commands import SchedulerCommandError, run

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}

SCRIPT = """#!/bin/bash
#SBATCH --job-name=pf-{pilot}
# A pilotfill pilot: the agent registers this job's nodes with the controller,
# heartbeats, and turns the preemption SIGTERM into "nodes leaving".
{agent}
"""


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``node[1-3,5]``) with ``scontrol show hostnames``."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    out = run(["scontrol", "show", "hostnames", nodelist], timeout_s=30, retries=2).stdout
    return [h for h in out.split() if h]


def nodes_of_this_job() -> list[str]:
    """Inside a pilot: the nodes Slurm gave this job."""
    return hostnames(os.environ["SLURM_JOB_NODELIST"])


def id_of_this_job() -> str:
    return os.environ["SLURM_JOB_ID"]


@dataclass
class _Pilot:
    id: str
    job_id: str
    nodes: list[str] = field(default_factory=list)
    running: bool = False


@dataclass
class SlurmScheduler(BatchScheduler):
    config: SlurmConfig
    pilots: PilotConfig
    run_dir: Path
    name: str = "slurm"
    _pilots: dict[str, _Pilot] = field(default_factory=dict)
    _last_poll: float = 0.0
    _idle_cache: tuple[float, int] = (0.0, 0)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        (self.run_dir / "pilots").mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def _run(self, argv: list[str], **kw):
        # One retry inside the call; the controller backs off between failing calls.
        return run(argv, timeout_s=self.config.command_timeout_s, **{"retries": 1, **kw})

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        now = time.monotonic()
        if now - self._idle_cache[0] < min(self.config.poll_s, 1.0):
            return self._idle_cache[1]
        out = self._run(["sinfo", "-N", "-h", "-p", self.config.partition, "-t", "idle", "-o", "%N"]).stdout
        idle = len({line.strip() for line in out.splitlines() if line.strip()})
        self._idle_cache = (now, idle)
        return idle

    def submit_pilot(self, pilot_id: str, nodes: int) -> str:
        hi = max(self.config.min_nodes, min(nodes, self.config.max_nodes))
        lo = min(self.config.min_nodes, hi)
        script = self.run_dir / "pilots" / f"{pilot_id}.sh"
        python = self.config.python or sys.executable
        script.write_text(SCRIPT.format(pilot=pilot_id, agent=agent_command(self.run_dir, pilot_id, "slurm", self.pilots.heartbeat_s, self.pilots.grace_s, python)))
        script.chmod(0o700)
        argv = [
            "sbatch", "--parsable", "-p", self.config.partition, "-N", f"{lo}-{hi}",
            "--time", self.config.time_max, "--time-min", self.config.time_min,
            "--job-name", f"pf-{pilot_id}", "--output", str(self.run_dir / "logs" / f"pilot-{pilot_id}.out"),
            "--chdir", str(self.run_dir),
        ]  # fmt: skip
        if self.config.account:
            argv += ["--account", self.config.account]
        if self.config.qos:
            argv += ["--qos", self.config.qos]
        argv += [*self.config.extra_args, str(script)]
        out = self._run(argv, retries=0).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SchedulerCommandError(argv, "printed no job id", 0, out)
        self._pilots[pilot_id] = _Pilot(pilot_id, job_id)
        self._idle_cache = (0.0, 0)
        return job_id

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        pilot = self._pilots.get(pilot_id)
        if pilot is None:
            return list(nodes)
        if not pilot.nodes:
            self._refresh(force=True)
        keep = [n for n in pilot.nodes if n not in nodes]
        if not keep:
            self.cancel(pilot_id)
            return list(nodes)
        batch_host = pilot.nodes[0]
        if batch_host not in keep:
            keep.insert(0, batch_host)  # the job script runs there: only ending the pilot frees it
        given = [n for n in pilot.nodes if n not in keep]
        if not given:
            return []
        self._run(["scontrol", "update", f"JobId={pilot.job_id}", f"NodeList={','.join(keep)}"], retries=1)
        pilot.nodes = keep
        self._idle_cache = (0.0, 0)
        return given

    def cancel(self, pilot_id: str) -> None:
        pilot = self._pilots.get(pilot_id)
        if pilot is not None:
            self._run(["scancel", pilot.job_id], retries=1)

    def poll(self, now: float) -> list[PilotEvent]:
        if not self._pilots or now - self._last_poll < self.config.poll_s:
            return []
        self._last_poll = now
        return self._refresh()

    def close(self) -> None:
        ids = [p.job_id for p in self._pilots.values()]
        if ids:
            try:
                self._run(["scancel", *ids], retries=1)
            except SchedulerCommandError:
                pass
        self._pilots.clear()

    # ------------------------------------------------------------ helpers

    def _refresh(self, force: bool = False) -> list[PilotEvent]:
        ids = [p.job_id for p in self._pilots.values()]
        if not ids:
            return []
        result = self._run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%N|%L"], final_codes=(1,))
        if result.returncode == 1 and "Invalid job id" not in result.stderr:
            raise SchedulerCommandError(["squeue", "-j", ",".join(ids)], "exited 1", 1, result.stderr)
        out = result.stdout
        seen: dict[str, tuple[str, str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4:
                seen[parts[0]] = (parts[1], parts[2], parts[3])
        events = []
        for pilot in list(self._pilots.values()):
            state, nodelist, left = seen.get(pilot.job_id, ("GONE", "", ""))
            if state == "RUNNING" and not pilot.running:
                pilot.running, pilot.nodes = True, hostnames(nodelist)
                deadline = time.time() + _seconds(left) if _seconds(left) is not None else None
                events.append(PilotEvent("started", pilot.id, pilot.job_id, tuple(pilot.nodes), deadline=deadline))
            elif state not in ACTIVE:
                del self._pilots[pilot.id]
                events.append(PilotEvent("ended", pilot.id, pilot.job_id, tuple(pilot.nodes), detail=state.lower()))
            elif state in ("PENDING", "REQUEUED") and pilot.running:
                pilot.running, pilot.nodes = False, []
                events.append(PilotEvent("ended", pilot.id, pilot.job_id, (), detail="requeued"))
        return events


def _seconds(time_left: str) -> float | None:
    """squeue's %L (``1-02:03:04``, ``29:51``; ``UNLIMITED``/``NOT_SET`` -> None)."""
    from ..config import parse_duration

    try:
        return float(parse_duration(time_left))
    except ValueError:
        return None


def sbatch_available() -> bool:
    """True when the Slurm client commands are installed and answer."""
    try:
        return subprocess.run(["sinfo", "--version"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False

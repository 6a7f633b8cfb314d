"""OpenPBS / PBS Pro: pilots as rerunnable jobs with shrink-to-fit walltime in a preemptible queue.

What the commands print and do is taken from a real OpenPBS 23.06 (the
recordings in ``shared/data/openpbs``), not from the manual alone:

* ``pbsnodes -av -F json`` lists every vnode; on a multi-vnode host the
  natural vnode (``vm``) has ``ncpus`` 0 and is not a node. A vnode is idle
  when its state is ``free``; our running pilots' vnodes show ``job-busy``.
* A ``select`` larger than the machine is accepted and queued forever, so a
  pilot never asks for more vnodes than exist, nor than are idle now.
* ``qstat`` of a job that is gone exits 153 and still prints a JSON document.
* ``pbs_release_nodes`` frees only vnodes on sister hosts; one on the primary
  execution host (the first host of ``exec_host``) is refused with exit 162.
* Preemption with ``preempt_order = R`` requeues the pilot: the same job id
  goes back to ``Q`` and later runs again with ``run_count`` + 1. To the
  controller that is one run ending and, later, a new one starting (its agent
  registers again).

Every command goes through :func:`commands.run` (timeout, retries, errors
naming the command and PBS's message).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import PbsConfig, PilotConfig
from .base import BatchScheduler, PilotEvent, agent_command
from .commands import SchedulerCommandError, run

log = logging.getLogger("pilotfill.schedulers.pbs")

UNKNOWN_JOB = 153  # PBSE_UNKJOBID: "qstat: Unknown Job Id 99.vm", with an empty JSON document
FINISHED_JOB = 35  # PBSE_HISTJOBID: a finished job under job history, asked for without -x
PRIMARY_HOST = 162  # "Can't free 'vm[2]' since it's on a primary execution host"
MIN_GT_MAX_WALLTIME = 59  # qsub: "min_walltime" can not be greater than "max_walltime"
UNKNOWN_QUEUE = 170  # qsub: Unknown queue
UNUSABLE_STATES = ("down", "offline", "unknown", "stale", "unresolvable", "maintenance")
QSTAT_BATCH = 200  # job ids per qstat call: long enough to be cheap, short enough for any argv limit


# ---------------------------------------------------------------- parsing (pure; tested on the recordings)


@dataclass(frozen=True)
class Vnode:
    name: str
    host: str
    state: str
    resources: dict[str, Any]
    jobs: tuple[str, ...]

    def usable(self, chunk: dict[str, int]) -> bool:
        """Could hold one chunk of a pilot: real cpus (not a natural vnode), the chunk's counts, not down."""
        if any(s in self.state for s in UNUSABLE_STATES):
            return False
        ncpus = _number(self.resources.get("ncpus"))
        if ncpus is None or ncpus < 1:
            return False
        return all((_number(self.resources.get(k)) or 0) >= v for k, v in chunk.items())

    @property
    def free(self) -> bool:
        return self.state == "free" and not self.jobs


@dataclass(frozen=True)
class JobStatus:
    id: str
    state: str  # PBS job_state: Q, R, E, F, H, W, S, …
    run_count: int
    vnodes: tuple[str, ...]
    chunk_hosts: tuple[str, ...]  # exec_host: the host of each chunk, in exec_vnode's order
    comment: str = ""
    exit_status: int | None = None
    walltime_left_s: float | None = None  # Resource_List.walltime (shrunk to fit) minus resources_used.walltime


def load_document(text: str) -> dict[str, Any]:
    """The JSON document a PBS command printed (``strict=False``: PBS does not escape control characters)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON document in the output")
    doc, _ = json.JSONDecoder(strict=False).raw_decode(text[start:])
    if not isinstance(doc, dict):
        raise ValueError("the JSON document is not an object")
    return doc


def parse_exec_vnode(text: str) -> list[str]:
    """``(vm[0]:ncpus=1)+(vm[1]:ncpus=1)`` -> ``["vm[0]", "vm[1]"]`` (a chunk may span ``(a:ncpus=1+b:ncpus=1)``)."""
    names: list[str] = []
    for chunk in re.findall(r"\(([^)]*)\)", text) or [text]:
        for part in chunk.split("+"):
            name = part.split(":", 1)[0].strip()
            if name and name not in names:
                names.append(name)
    return names


def parse_exec_host(text: str) -> list[str]:
    """``vm/0+vm/1*2`` -> ``["vm", "vm"]``: the host of each chunk; the first is the primary execution host."""
    return [part.split("/", 1)[0].strip() for part in text.split("+") if part.strip()]


def parse_pbsnodes(doc: dict[str, Any]) -> dict[str, Vnode]:
    """``pbsnodes -av -F json`` -> vnodes by name."""
    out = {}
    for name, v in (doc.get("nodes") or {}).items():
        res = v.get("resources_available") or {}
        jobs = tuple(str(j).split("/", 1)[0] for j in v.get("jobs") or ())
        out[name] = Vnode(name, str(res.get("host") or v.get("Mom") or name), str(v.get("state", "")), dict(res), jobs)
    return out


def parse_jobs(doc: dict[str, Any]) -> dict[str, JobStatus]:
    """``qstat -f -F json`` -> job status by id."""
    out = {}
    for jid, j in (doc.get("Jobs") or {}).items():
        exit_status = j.get("Exit_status")
        out[jid] = JobStatus(
            jid, str(j.get("job_state", "")), int(j.get("run_count") or 0), tuple(parse_exec_vnode(j.get("exec_vnode") or "")),
            tuple(parse_exec_host(j.get("exec_host") or "")), str(j.get("comment") or ""), int(exit_status) if exit_status is not None else None,
            _walltime_left(j),
        )  # fmt: skip
    return out


def _walltime_left(job: dict[str, Any]) -> float | None:
    """Seconds the job may still run: its (shrink-to-fit) walltime minus the walltime it has used."""
    from ..config import parse_duration

    try:
        limit = parse_duration(str((job.get("Resource_List") or {})["walltime"]))
        used = parse_duration(str((job.get("resources_used") or {}).get("walltime", "00:00:00")))
    except (KeyError, ValueError):
        return None
    return float(max(0, limit - used))


def parse_job_id(stdout: str) -> str:
    """The id ``qsub`` printed (``0.vm``; on a real site ``123456.polaris-pbs-01``)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines or not re.fullmatch(r"\d+(\[\d*\])?\.\S+", lines[-1]):
        raise ValueError(f"no job id in {stdout!r}")
    return lines[-1]


def parse_chunk(chunk: str) -> dict[str, int]:
    """The counted resources of a select chunk: ``ncpus=64:ngpus=4`` -> ``{"ncpus": 64, "ngpus": 4}``."""
    out = {}
    for part in chunk.split(":"):
        key, _, value = part.partition("=")
        if value.isdigit():
            out[key.strip()] = int(value)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(str(value))
    except ValueError:
        return None


def idle_vnodes(vnodes: dict[str, Vnode], chunk: dict[str, int]) -> list[str]:
    """Vnodes a pilot chunk could start on now."""
    return [v.name for v in vnodes.values() if v.free and v.usable(chunk)]


def placeable(names: list[str], vnodes: dict[str, Vnode], place: str) -> int:
    """How many chunks of one job ``names`` can take under ``place``: scatter wants a host per chunk, pack one host."""
    arrangement = place.split(":", 1)[0]
    per_host: dict[str, int] = {}
    for n in names:
        per_host[vnodes[n].host] = per_host.get(vnodes[n].host, 0) + 1
    if arrangement == "scatter":
        return len(per_host)
    if arrangement == "pack":
        return max(per_host.values(), default=0)
    return len(names)


def vnode_hosts(status: JobStatus, vnodes: dict[str, Vnode]) -> dict[str, str]:
    """Each of the job's vnodes -> its host: from exec_host (chunk i of exec_vnode is on host i), else pbsnodes."""
    hosts = {n: vnodes[n].host for n in status.vnodes if n in vnodes}
    if len(status.chunk_hosts) == len(status.vnodes):
        hosts.update(zip(status.vnodes, status.chunk_hosts))
    return hosts


# ---------------------------------------------------------------- inside a pilot


def id_of_this_job() -> str:
    """This pilot's PBS job id (the agent runs inside the job)."""
    jid = os.environ.get("PBS_JOBID", "")
    if not jid:
        raise RuntimeError("PBS_JOBID is not set: not inside a PBS job")
    return jid


def nodes_of_this_job(timeout_s: float = 30.0) -> list[str]:
    """The vnodes this job holds, from ``qstat -f -F json $PBS_JOBID``'s ``exec_vnode``."""
    jid = id_of_this_job()
    argv = ["qstat", "-f", "-F", "json", jid]
    result = run(argv, timeout_s=timeout_s, final_codes=(UNKNOWN_JOB,))
    try:
        status = parse_jobs(load_document(result.stdout)).get(jid)
    except ValueError as exc:
        raise SchedulerCommandError(argv, f"printed what we cannot parse ({exc})", result.returncode, result.stdout) from None
    if status is None or not status.vnodes:
        raise SchedulerCommandError(argv, "shows no exec_vnode for this job", result.returncode, result.stderr + result.stdout)
    return list(status.vnodes)


# ---------------------------------------------------------------- the adapter


@dataclass
class _Pilot:
    id: str
    job: str
    requested: int
    nodes: list[str] = field(default_factory=list)  # vnodes of the current run (empty while queued)
    hosts: dict[str, str] = field(default_factory=dict)  # vnode -> host, current run
    primary: str | None = None  # first host of exec_host, current run: PBS never releases its vnodes
    runs_seen: int = 0  # run_count of the last run reported as started
    running: bool = False  # a "started" has been reported and no "ended" since
    state: str = "Q"  # job_state at the last qstat (a held pilot waits for nothing)
    deleted: bool = False  # qdel sent: it takes nothing more, though its end is reported by poll
    ended: bool = False


class PbsScheduler(BatchScheduler):
    """Pilots on OpenPBS / PBS Pro; see the module docstring for what PBS does."""

    name = "pbs"

    def __init__(
        self, config: PbsConfig, pilots: PilotConfig, run_dir: Path, *, retries: int = 2, backoff_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ):
        self.config, self.pilot_config = config, pilots
        self.run_dir = Path(run_dir).resolve()
        self.retries, self.backoff_s, self.clock = retries, backoff_s, clock
        self.chunk = parse_chunk(config.chunk)
        self._pilots: dict[str, _Pilot] = {}
        self._vnodes: dict[str, Vnode] = {}
        self._vnodes_at: float | None = None
        self._polled_at: float | None = None
        self._events: list[PilotEvent] = []
        (self.run_dir / "pilots").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        """Free usable vnodes, less those our queued pilots are about to take (cached for ``poll_s``)."""
        vnodes = self._pbsnodes(max_age=self.config.poll_s)
        return self._idle(vnodes)

    def submit_pilot(self, pilot_id: str, nodes: int) -> str:
        vnodes = self._pbsnodes(max_age=0.0)
        usable = placeable([v.name for v in vnodes.values() if v.usable(self.chunk)], vnodes, self.config.place)
        count = min(nodes, self.config.nodes_per_pilot, usable, self._idle(vnodes))
        if count < 1:
            raise SchedulerCommandError(["qsub"], f"not submitted: {nodes} node(s) wanted, {self._idle(vnodes)} idle of {usable} usable vnode(s)")
        script = self.run_dir / "pilots" / f"{pilot_id}.sh"
        python = self.config.python or sys.executable
        agent = agent_command(self.run_dir, pilot_id, "pbs", self.pilot_config.heartbeat_s, self.pilot_config.grace_s, python=python)
        script.write_text(
            "#!/bin/sh\n"
            f"# pilotfill pilot {pilot_id}: the agent reads this job's vnodes from qstat (exec_vnode) and registers them.\n"
            "# A requeued run's output is not delivered; the agent reports through the controller.\n"
            f"{agent}\n"
        )
        script.chmod(0o700)
        argv = [
            "qsub", "-q", self.config.queue, "-N", f"pf-{pilot_id}", "-r", "y",
            "-l", f"select={count}:{self.config.chunk}", "-l", f"place={self.config.place}",
            "-l", f"min_walltime={self.config.min_walltime},max_walltime={self.config.max_walltime}",
            *(["-A", self.config.account] if self.config.account else []), *self.config.extra_args,
            "-o", str(self.run_dir / "logs" / f"pilot-{pilot_id}.out"), "-j", "oe", str(script),
        ]  # fmt: skip
        # No retry: a qsub that timed out may have queued the job, and a second one would queue it twice.
        # The pilot manager tries again on a later tick, with a new pilot id.
        result = self._run(argv, retries=0, final_codes=(MIN_GT_MAX_WALLTIME, UNKNOWN_QUEUE))
        if result.returncode != 0:
            raise SchedulerCommandError(argv, f"exited {result.returncode}", result.returncode, result.stderr + result.stdout)
        try:
            job = parse_job_id(result.stdout)
        except ValueError:
            raise SchedulerCommandError(argv, "printed no job id", 0, result.stdout + result.stderr) from None
        self._pilots[pilot_id] = _Pilot(pilot_id, job, count)
        self._vnodes_at = None  # the next idle count must see this pilot
        log.info("pilot %s is PBS job %s: %d x %s in %s", pilot_id, job, count, self.config.chunk, self.config.queue)
        return job

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        """Give back vnodes on sister hosts; the primary host's stay until the whole pilot goes (then ``qdel``)."""
        pilot = self._pilots.get(pilot_id)
        if pilot is not None and not pilot.ended and not set(nodes) <= set(pilot.nodes):
            self._refresh([pilot])  # its agent may have registered before our last poll saw it start
        if pilot is None or pilot.ended:
            return list(nodes)  # not ours any more
        not_held = [n for n in nodes if n not in pilot.nodes]
        wanted = [n for n in nodes if n in pilot.nodes]
        if not wanted:
            return not_held
        if set(wanted) == set(pilot.nodes):
            self.cancel(pilot_id)
            return list(nodes)
        primary = pilot.primary
        sisters = [n for n in wanted if primary is not None and pilot.hosts.get(n) not in (None, primary)]
        kept = [n for n in wanted if n not in sisters]
        if kept:
            log.info("pilot %s keeps %s: on its primary execution host %s, which PBS cannot release", pilot_id, kept, primary)
        if not sisters:
            return not_held
        argv = ["pbs_release_nodes", "-j", pilot.job, *sisters]
        try:
            result = self._run(argv, final_codes=(PRIMARY_HOST,))
        except SchedulerCommandError:
            # A retried release may have worked the first time: trust what the job holds now.
            status = self._qstat([pilot.job]).get(pilot.job)
            gone = [n for n in sisters if status is None or n not in status.vnodes]
            if not gone:
                raise
        else:
            if result.returncode == PRIMARY_HOST:  # an answer, not a failure: the pilot keeps them all
                log.warning("pilot %s: PBS refused to release %s: %s", pilot_id, sisters, (result.stderr or result.stdout).strip())
                return not_held
            gone = sisters
        pilot.nodes = [n for n in pilot.nodes if n not in gone]
        self._vnodes_at = None
        return not_held + gone

    def cancel(self, pilot_id: str) -> None:
        pilot = self._pilots.get(pilot_id)
        if pilot is not None and not pilot.ended:
            self._run(["qdel", pilot.job], final_codes=(UNKNOWN_JOB,))  # already gone is fine
            pilot.deleted = True
            self._vnodes_at = None

    def poll(self, now: float) -> list[PilotEvent]:
        """Started/ended events from ``qstat``, asked at most every ``poll_s`` seconds."""
        if self._polled_at is None or now - self._polled_at >= self.config.poll_s:
            self._polled_at = now
            self._refresh([p for p in self._pilots.values() if not p.ended])
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        """qdel every pilot still queued or running."""
        jobs = [p.job for p in self._pilots.values() if not p.ended]
        for i in range(0, len(jobs), QSTAT_BATCH):
            self._run(["qdel", *jobs[i : i + QSTAT_BATCH]], final_codes=(UNKNOWN_JOB,))
        self._pilots.clear()

    # ------------------------------------------------------------ helpers

    def _refresh(self, pilots: list[_Pilot]) -> None:
        """Ask qstat about ``pilots`` now; what changed waits in ``_events`` for the next poll."""
        if not pilots:
            return
        statuses = self._qstat([p.job for p in pilots])
        for pilot in pilots:
            self._events += self._changes(pilot, statuses.get(pilot.job))
        self._pilots = {k: p for k, p in self._pilots.items() if not p.ended}

    def _changes(self, pilot: _Pilot, status: JobStatus | None) -> list[PilotEvent]:
        """The events between what we last reported and the job's status now."""
        events = []
        pilot.state = status.state if status is not None else "gone"
        gone = status is None or status.state in ("F", "X")
        requeued = status is not None and status.state in ("Q", "H", "W", "T")
        rerun = status is not None and status.state == "R" and status.run_count > pilot.runs_seen
        if pilot.running and (gone or requeued or rerun):
            why = "gone" if status is None else f"finished, Exit_status {status.exit_status}" if gone else "requeued (preempted)"
            events.append(PilotEvent("ended", pilot.id, pilot.job, tuple(pilot.nodes), detail=why))
            pilot.running, pilot.nodes, pilot.hosts, pilot.primary = False, [], {}, None
        if status is not None and status.state == "R" and not pilot.running and status.vnodes:
            pilot.running, pilot.runs_seen = True, status.run_count
            pilot.nodes = list(status.vnodes)
            pilot.hosts = vnode_hosts(status, self._vnodes)
            if len(pilot.hosts) < len(pilot.nodes):
                pilot.hosts = vnode_hosts(status, self._pbsnodes(max_age=self.config.poll_s))
            pilot.primary = status.chunk_hosts[0] if status.chunk_hosts else pilot.hosts.get(pilot.nodes[0])
            deadline = time.time() + status.walltime_left_s if status.walltime_left_s is not None else None
            events.append(PilotEvent("started", pilot.id, pilot.job, tuple(pilot.nodes), deadline=deadline, detail=f"run {status.run_count}"))
        if gone:
            if not events and not pilot.running:
                events.append(PilotEvent("ended", pilot.id, pilot.job, detail="gone before it ran" if status is None else "finished before it ran"))
            pilot.ended = True
        return events

    def _idle(self, vnodes: dict[str, Vnode]) -> int:
        """Chunks a new pilot could get now: idle vnodes (as ``place`` allows) less what our waiting pilots will take."""
        on_vnodes = {j for v in vnodes.values() for j in v.jobs}
        waiting = sum(p.requested for p in self._pilots.values() if p.state == "Q" and not (p.deleted or p.ended) and p.job not in on_vnodes)
        return max(0, placeable(idle_vnodes(vnodes, self.chunk), vnodes, self.config.place) - waiting)

    def _pbsnodes(self, max_age: float) -> dict[str, Vnode]:
        if self._vnodes_at is not None and self.clock() - self._vnodes_at < max_age:
            return self._vnodes
        argv = ["pbsnodes", "-av", "-F", "json"]
        result = self._run(argv)
        try:
            self._vnodes = parse_pbsnodes(load_document(result.stdout))
        except ValueError as exc:
            raise SchedulerCommandError(argv, f"printed what we cannot parse ({exc})", 0, result.stdout) from None
        self._vnodes_at = self.clock()
        return self._vnodes

    def _qstat(self, jobs: Sequence[str]) -> dict[str, JobStatus]:
        """Status of ``jobs``; a job that is gone (153) or finished (35, or F with -x) is simply absent or F."""
        out: dict[str, JobStatus] = {}
        for i in range(0, len(jobs), QSTAT_BATCH):
            batch = list(jobs[i : i + QSTAT_BATCH])
            argv = ["qstat", "-x", "-f", "-F", "json", *batch]
            result = self._run(argv, final_codes=(UNKNOWN_JOB, FINISHED_JOB))
            try:
                out.update(parse_jobs(load_document(result.stdout)))
            except ValueError as exc:
                if result.returncode == 0:
                    raise SchedulerCommandError(argv, f"printed what we cannot parse ({exc})", 0, result.stdout + result.stderr) from None
                # An unknown job and no document: never take the others for gone, ask one by one.
                if len(batch) > 1:
                    for job in batch:
                        out.update(self._qstat([job]))
        return out

    def _run(self, argv: Sequence[str], retries: int | None = None, final_codes: Sequence[int] = ()):
        retries = self.retries if retries is None else retries
        return run(argv, timeout_s=self.config.command_timeout_s, retries=retries, backoff_s=self.backoff_s, final_codes=final_codes)

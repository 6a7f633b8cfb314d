"""OpenPBS / PBS Pro: pilots as rerunnable jobs with shrink-to-fit walltime in a preemptible queue.

What the commands print and do is taken from a real OpenPBS 23.06.06 run as a normal user with the server's
defaults (``shared/data/openpbs/real-23.06.06``), its recheck on two MOM hosts (``real-23.06.06-recheck``) and an
earlier capture (``shared/data/openpbs``), not from the manual alone: docs/sites.md ("What the PBS adapter relies
on") lists what they showed, each with what this adapter does about it.

Every command goes through :func:`commands.run` (timeout, retries, errors naming the command and PBS's message).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..config import Config, NodeTypeConfig, PilotConfig, check_range, check_walltime, section
from .base import (
    BatchScheduler,
    EndReason,
    EventKind,
    NodeAccess,
    NothingIdle,
    OnSpawn,
    PilotEvent,
    PilotRefused,
    RemoteNodes,
    SchedulerConfigError,
    agent_argv,
    host_of,
)
from .commands import Result, SchedulerCommandError, run

log = logging.getLogger("pilotfill.schedulers.pbs")

UNKNOWN_JOB = 153  # PBSE_UNKJOBID: "qstat: Unknown Job Id 99.vm", with an empty JSON document
FINISHED_JOB = 35  # PBSE_HISTJOBID: a finished job under job history, asked for without -x (qstat, qdel)
SYSTEM_ERROR = 162  # PBSE_SYSTEM: pbs_release_nodes refused (primary host, vnode not in the job, …): read the message
BAD_STATE = 168  # PBSE_BADSTATE: "Request invalid for state of job", e.g. sister MOMs still joining
MIN_GT_MAX_WALLTIME = 59  # qsub: "min_walltime" can not be greater than "max_walltime"
UNKNOWN_QUEUE = 170  # qsub: Unknown queue
POLICY_CODES = (38, 39, 198)  # PBSE_ENTLIMCT, PBSE_ENTLIMRESC, PBSE_MAXQUED: a queue or server limit
UNKNOWN_RESOURCE = 187  # qsub: Unknown resource Resource_List.nosuchres (recheck (g))
NEVER_CODES = {
    UNKNOWN_RESOURCE: "pbs.chunk / pbs.extra_args",
    UNKNOWN_QUEUE: "pbs.queue",
    MIN_GT_MAX_WALLTIME: "pbs.min_walltime / pbs.max_walltime",
}
POLICY_MESSAGE = re.compile(r"would exceed .*limit|Maximum number of jobs .*already in", re.IGNORECASE)
PRIMARY_HOST_MESSAGE = "primary execution host"
UNUSABLE_STATES = ("down", "offline", "unknown", "stale", "unresolvable", "maintenance")
QUEUED_STATES = ("Q", "H", "W", "T")
QSTAT_BATCH = 200  # job ids per qstat/qdel call: long enough to be cheap, short enough for any argv limit
RUNNING_SUBSTATE = 42
RERUN_SUBSTATES = range(60, 64)  # JOB_SUBSTATE_RERUN*: requeued, still exiting
BAD_STATE_RETRY_S = (0.5, 1.0, 1.0, 1.5)  # 168 right after a start, until the sister MOMs have joined (docs/sites.md)


# ---------------------------------------------------------------- parsing (pure; tested on the recordings)


@dataclass(frozen=True)
class Vnode:
    name: str
    host: str
    state: str
    resources: dict[str, Any]
    jobs: tuple[str, ...]

    def usable(self, chunk: dict[str, int | str]) -> bool:
        """Could hold one chunk of a pilot: real cpus (not a natural vnode), the chunk's counts and named resources
        (a string resource equal), not down."""
        if any(s in self.state for s in UNUSABLE_STATES):
            return False
        ncpus = _number(self.resources.get("ncpus"))
        if ncpus is None or ncpus < 1:
            return False
        for k, v in chunk.items():
            if isinstance(v, str):
                if str(self.resources.get(k, "")) != v:
                    return False
            elif (_number(self.resources.get(k)) or 0) < v:
                return False
        return True

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
    substate: int | None = None
    name: str = ""
    queue: str = ""
    nodect: int = 0

    @property
    def running(self) -> bool:
        """Running and staying: R, not exiting (a requeued job shows R with substate 60 until it has exited)."""
        return self.state == "R" and (self.substate is None or self.substate < 50)

    @property
    def rerunning(self) -> bool:
        """Requeued by preemption and still exiting: its vnodes are the main job's already."""
        return self.state == "R" and self.substate in RERUN_SUBSTATES

    @property
    def finished(self) -> bool:
        return self.state in ("F", "X")


@dataclass(frozen=True)
class Queue:
    name: str
    priority: int | None
    queued: int


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
    """``qstat -f -F json`` -> job status by id (only attributes a normal user sees)."""
    out = {}
    for jid, j in (doc.get("Jobs") or {}).items():
        exit_status, substate = j.get("Exit_status"), j.get("substate")
        resources = j.get("Resource_List") or {}
        out[jid] = JobStatus(
            jid,
            str(j.get("job_state", "")),
            int(j.get("run_count") or 0),
            tuple(parse_exec_vnode(j.get("exec_vnode") or "")),
            tuple(parse_exec_host(j.get("exec_host") or "")),
            str(j.get("comment") or ""),
            int(exit_status) if exit_status is not None else None,
            _walltime_left(j),
            int(substate) if substate is not None else None,
            str(j.get("Job_Name") or ""),
            str(j.get("queue") or ""),
            int(_number(resources.get("nodect")) or 0),
        )
    return out


def parse_qstat_errors(stderr: str) -> tuple[set[str], set[str]]:
    """qstat's per-job errors: (ids it does not know, ids that have finished under job history)."""
    unknown = set(re.findall(r"Unknown Job Id (\S+)", stderr))
    finished = set(re.findall(r"qstat: (\S+) Job has finished", stderr)) | set(
        re.findall(r"Job has finished (\S+)", stderr)
    )
    return unknown, finished


def parse_queues(doc: dict[str, Any]) -> dict[str, Queue]:
    """``qstat -Q -f -F json`` -> queues with their priority and queued-job count (``state_count``)."""
    out = {}
    for name, q in (doc.get("Queue") or {}).items():
        match = re.search(r"Queued:(\d+)", str(q.get("state_count") or ""))
        priority = _number(q.get("Priority"))
        out[name] = Queue(name, int(priority) if priority is not None else None, int(match.group(1)) if match else 0)
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


def parse_resources(chunk: str) -> dict[str, int | str]:
    """Every resource of a select chunk, counts and names: ``ngpus=4:gpu_type=a100`` -> ``{"ngpus": 4, "gpu_type":
    "a100"}``."""
    out: dict[str, int | str] = {}
    for part in chunk.split(":"):
        key, _, value = part.partition("=")
        if key.strip() and value.strip():
            out[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return out


def is_policy_refusal(returncode: int | None, output: str) -> bool:
    """qsub refused by a queue or server limit (max_queued, queued_jobs_threshold, …), not by a failure."""
    return returncode in POLICY_CODES or bool(POLICY_MESSAGE.search(output))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(str(value))
    except ValueError:
        return None


def idle_vnodes(vnodes: dict[str, Vnode], chunk: dict[str, int | str]) -> list[str]:
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


def whole_hosts(wanted: Sequence[str], held: Sequence[str], hosts: dict[str, str]) -> list[str]:
    """The vnodes of ``wanted`` whose host has no other vnode in ``held``:
    PBS can use a released vnode only with its whole host."""
    wanted_set = set(wanted)
    by_host: dict[str | None, list[str]] = {}
    for n in held:
        by_host.setdefault(hosts.get(n), []).append(n)
    return [n for n in wanted if n in held and all(m in wanted_set for m in by_host[hosts.get(n)])]


def main_job_demand(main: Sequence[JobStatus], free: int, promised: int, preemptible: int) -> int:
    """Free vnodes queued main-workload jobs will take next: each that fits in what is free plus what our pilots
    hold, in order, served first from vnodes already promised to it (a preempted pilot's), then from free ones."""
    taken = 0
    for job in main:
        need = job.nodect or len(job.vnodes) or 1
        if need > free - taken + promised + preemptible:
            continue  # waits for a drain: the holes before it are what pilots are for
        from_promised = min(need, promised)
        promised -= from_promised
        from_free = min(need - from_promised, free - taken)
        taken += from_free
        preemptible -= need - from_promised - from_free
    return taken


# ---------------------------------------------------------------- inside a pilot


class PbsNodes(RemoteNodes):
    """Inside a pilot: its vnodes from ``qstat``, a process on a sister host through ``pbs_tmrsh`` (PBS's TM remote
    shell: a task of the pilot's job under that host's MOM). ``pbs_tmrsh`` forwards no signal, so a process there is
    ended by running the agent's ``--end-on`` there too."""

    def id_of_this_job(self) -> str:
        """This pilot's PBS job id (the agent runs inside the job)."""
        jid = os.environ.get("PBS_JOBID", "")
        if not jid:
            raise RuntimeError("PBS_JOBID is not set: not inside a PBS job")
        return jid

    def nodes_of_this_job(self, timeout_s: float = 30.0) -> list[str]:
        """The vnodes this job holds, from ``qstat -f -F json $PBS_JOBID``'s ``exec_vnode``
        (no -x: history may be off)."""
        jid = self.id_of_this_job()
        argv = ["qstat", "-f", "-F", "json", jid]
        result = run(argv, timeout_s=timeout_s, final_codes=(UNKNOWN_JOB,))
        try:
            status = parse_jobs(load_document(result.stdout)).get(jid)
        except ValueError as exc:
            raise SchedulerCommandError(
                argv, f"printed what we cannot parse ({exc})", result.returncode, result.stdout
            ) from None
        if status is None or not status.vnodes:
            raise SchedulerCommandError(
                argv, "shows no exec_vnode for this job", result.returncode, result.stderr + result.stdout
            )
        return list(status.vnodes)

    def run_on(self, node: str, argv: list[str], env: dict[str, str], log_path: Path) -> list[str]:
        # Under a keeper: the last of its MOM task's session to exit, the command's output in the run's log.
        keeper = [self.python, "-m", "pilotfill.pilots.keeper", "--log", str(log_path), "--"]
        return ["pbs_tmrsh", host_of(node), *keeper, *self.with_env(node, argv, env)]

    def end_on(self, node: str, argv: list[str]) -> list[str] | None:
        return ["pbs_tmrsh", host_of(node), *argv]


# ---------------------------------------------------------------- the adapter


@dataclass
class _Pilot:
    id: str
    job: str
    requested: int
    node_type: str | None = None
    nodes: list[str] = field(default_factory=list)  # vnodes of the current run (empty while queued)
    hosts: dict[str, str] = field(default_factory=dict)  # vnode -> host, current run
    primary: str | None = None  # first host of exec_host, current run: PBS never releases its vnodes
    run: int = 0  # run_count of the last run reported as started
    running: bool = False  # a "started" has been reported and no "ended" since
    state: str = "Q"  # job_state at the last qstat
    rerunning: bool = False  # requeued, still exiting (R, substate 60)
    missing: int = 0  # consecutive qstat answers that did not know the job
    deleted: bool = False  # qdel sent: it takes nothing more, though its end is reported by poll
    deleted_run: int = 0  # run_count when it was deleted: a later run is PBS running it again (a lost qdel)
    ended: bool = False


@dataclass
class _Answer:
    """What ``qstat`` said about some jobs."""

    statuses: dict[str, JobStatus]
    unknown: set[str]
    finished: set[str]


@dataclass(frozen=True)
class PbsConfig:
    """Pilots as OpenPBS / PBS Pro jobs with shrink-to-fit walltime: the ``[pbs]`` section."""

    queue: str = "scavenger"
    account: str = ""
    min_walltime: str = "00:10:00"
    max_walltime: str = "02:00:00"
    nodes_per_pilot: int = 1  # select=N; only sister hosts can be released, so small pilots shed nodes best
    chunk: str = "ncpus=1"  # resources of one select chunk (one node), e.g. "ncpus=64:ngpus=4"
    place: str = "vscatter"
    poll_s: float = 5.0
    command_timeout_s: float = 30.0
    extra_args: tuple[str, ...] = ()
    python: str = ""


class PbsScheduler(BatchScheduler):
    """Pilots on OpenPBS / PBS Pro; see the module docstring for what PBS does."""

    name = "pbs"
    title: ClassVar[str] = "PBS"
    selects: ClassVar[tuple[str, ...]] = ("select", "queue")
    node_access: ClassVar[type[NodeAccess]] = PbsNodes
    config_class: ClassVar[type] = PbsConfig
    bounds: ClassVar[dict[str, tuple[float, float, str]]] = {
        "pbs.poll_s": (0.05, 600.0, "qstat is asked this often"),
        "pbs.command_timeout_s": (1.0, 3600.0, "a PBS command taking longer is an error"),
    }

    @classmethod
    def parse_section(cls, raw: Any, name: str, where: Callable[[str], str], lead_s: float) -> PbsConfig:
        """``[pbs]``: a walltime range whose longest outlasts a pilot's drain."""
        pbs = section(PbsConfig, raw, name, where, cls.bounds)
        check_range(pbs.min_walltime, pbs.max_walltime, "pbs.min_walltime", "pbs.max_walltime", where)
        check_walltime(pbs.max_walltime, "pbs.max_walltime", lead_s, where)
        return pbs

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, on_spawn: OnSpawn) -> PbsScheduler:
        return cls(config.pbs, config.pilots, run_dir, node_types=config.node_types)

    def __init__(
        self,
        config: PbsConfig,
        pilots: PilotConfig,
        run_dir: Path,
        *,
        retries: int = 2,
        backoff_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        node_types: tuple[NodeTypeConfig, ...] = (),
    ):
        self.config, self.pilot_config = config, pilots
        self.node_types = node_types
        self._type_chunks = {t.name: {**parse_resources(config.chunk), **parse_resources(t.select)} for t in node_types}
        self.run_dir = Path(run_dir).resolve()
        self.retries, self.backoff_s, self.clock, self.sleep = retries, backoff_s, clock, sleep
        self.chunk = parse_chunk(config.chunk)
        self._pilots: dict[str, _Pilot] = {}
        self._jobs: dict[str, str] = {}  # every job id submitted or adopted -> pilot id: close() deletes them all
        self._finished: set[str] = set()  # job ids PBS said have finished (35, F): nothing to delete
        # job id of a preempted pilot still exiting -> its vnodes (the main job's next)
        self._exiting: dict[str, list[str]] = {}
        self._vnodes: dict[str, Vnode] = {}
        self._main: list[JobStatus] = []  # main-workload jobs queued ahead of our queue
        self._vnodes_at: float | None = None
        self._polled_at: float | None = None
        self._events: list[PilotEvent] = []
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        """Free usable vnodes, less those promised to the main workload and our waiting pilots'
        (cached for ``poll_s``)."""
        if self.node_types:
            return sum((self.idle_by_type() or {}).values())
        return self._idle(self._pbsnodes(max_age=self.config.poll_s))

    def idle_by_type(self) -> dict[str, int] | None:
        """Idle vnodes of each configured type (those offering its select resources), as ``idle_nodes`` counts them."""
        if not self.node_types:
            return None
        vnodes = self._pbsnodes(max_age=self.config.poll_s)
        return {t.name: self._idle(vnodes, t.name) for t in self.node_types}

    def capacity(self) -> int | None:
        """Chunks one pilot could take on the whole machine (every usable vnode, as ``place`` allows; of one type on a
        machine with several)."""
        vnodes = self._pbsnodes(max_age=self.config.poll_s)
        if self.node_types:
            return max(
                placeable([v.name for v in vnodes.values() if v.usable(c)], vnodes, self.config.place)
                for c in self._type_chunks.values()
            )
        return placeable([v.name for v in vnodes.values() if v.usable(self.chunk)], vnodes, self.config.place)

    def submit_pilot(self, pilot_id: str, nodes: int, node_type: str | None = None) -> str:
        kind = next((t for t in self.node_types if t.name == node_type), None)
        if self.node_types and kind is None:
            raise SchedulerCommandError(
                ["qsub"],
                f"not submitted: no node type {node_type!r} in the config "
                f"({', '.join(t.name for t in self.node_types)})",
            )
        chunk = self._type_chunks[kind.name] if kind is not None else self.chunk
        chunk_text = self.config.chunk + (f":{kind.select}" if kind is not None and kind.select else "")
        queue = kind.queue if kind is not None and kind.queue else self.config.queue
        vnodes = self._pbsnodes(max_age=0.0)
        usable = placeable([v.name for v in vnodes.values() if v.usable(chunk)], vnodes, self.config.place)
        idle = self._idle(vnodes, kind.name if kind is not None else None)
        count = min(nodes, self.config.nodes_per_pilot, usable, idle)
        if count < 1:
            raise NothingIdle(
                f"qsub: not submitted: {nodes} node(s) wanted, {idle} idle of {usable} usable vnode(s)",
                reason=f"{idle} idle of {usable} usable vnodes",
            )
        argv = [
            "qsub", "-q", queue, "-N", f"pf-{pilot_id}", "-r", "y",
            "-l", f"select={count}:{chunk_text}", "-l", f"place={self.config.place}",
            "-l", f"min_walltime={self.config.min_walltime},max_walltime={self.config.max_walltime}",
            *(["-A", self.config.account] if self.config.account else []), *self.config.extra_args,
            "-o", str(self.run_dir / "logs" / f"pilot-{pilot_id}.out"), "-j", "oe", "--", *self._agent_argv(pilot_id),
        ]  # fmt: skip
        # No retry: a qsub that timed out may have queued the job, and a second one would queue it twice.
        # The pilot manager tries again on a later tick, with a new pilot id.
        try:
            result = self._run(argv, retries=0)
        except SchedulerCommandError as exc:
            said = exc.output.strip()[-500:]
            reason = f"{said.splitlines()[-1] if said else 'no message'} (exit {exc.returncode})"
            if exc.returncode is not None and is_policy_refusal(exc.returncode, exc.output):
                raise PilotRefused(
                    f"`{' '.join(argv)}` refused by PBS policy (exit {exc.returncode}): {said}", reason=reason
                ) from None
            if exc.returncode in NEVER_CODES:
                key = self._key_for(exc.returncode, said)
                raise SchedulerConfigError(
                    f"{key}: PBS refuses every pilot: `{' '.join(argv)}` exited {exc.returncode}: {said}", reason=reason
                ) from None
            raise
        try:
            job = parse_job_id(result.stdout)
        except ValueError:
            raise SchedulerCommandError(argv, "printed no job id", 0, result.stdout + result.stderr) from None
        self._track(_Pilot(pilot_id, job, count, node_type=kind.name if kind is not None else None))
        self._vnodes_at = None  # the next idle count must see this pilot
        log.info("pilot %s is PBS job %s: %d x %s in %s", pilot_id, job, count, chunk_text, queue)
        return job

    def check(self) -> None:
        """A ``chunk`` that no vnode PBS lists could hold is a config error now (PBS would queue such a pilot forever,
        recheck (g)). Cannot ask pbsnodes: nothing to say yet."""
        try:
            vnodes = self._pbsnodes(max_age=0.0)
        except SchedulerCommandError as exc:
            log.warning("cannot check pbs.chunk against the vnodes now: %s", exc)
            return
        real = [v for v in vnodes.values() if (_number(v.resources.get("ncpus")) or 0) >= 1]  # not natural vnodes
        if not real or any(all((_number(v.resources.get(k)) or 0) >= n for k, n in self.chunk.items()) for v in real):
            return  # some vnode could hold it (whether up now or not)
        lacking = []
        for key, want in self.chunk.items():
            most = max((_number(v.resources.get(key)) or 0 for v in real), default=0)
            if most < want:
                lacking.append(
                    f"{key}={want} (no vnode has it)" if most == 0 else f"{key}={want} (at most {most:g} on a vnode)"
                )
        raise SchedulerConfigError(
            f"pbs.chunk {self.config.chunk!r}: no vnode of the {len(real)} PBS lists can hold it: "
            f"{', '.join(lacking) or 'none is usable'}",
            reason=f"no vnode has {', '.join(lacking) or self.config.chunk}",
        )

    def _key_for(self, code: int, said: str) -> str:
        """The config key a refusal that never goes away points at."""
        if code == UNKNOWN_RESOURCE:
            match = re.search(r"Unknown resource (?:Resource_List\.)?(\w+)", said)
            name = match.group(1) if match else ""
            if name and any(name in a for a in self.config.extra_args):
                return "pbs.extra_args"
            if name and name in self.config.chunk:
                return "pbs.chunk"
        return NEVER_CODES[code]

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        """Give back whole sister hosts; the primary host's vnodes, and those of a host partly still needed, stay."""
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
        sisters = [
            n
            for n in whole_hosts(wanted, pilot.nodes, pilot.hosts)
            if pilot.primary is not None and pilot.hosts.get(n) != pilot.primary
        ]
        kept = [n for n in wanted if n not in sisters]
        if kept:
            log.info(
                "pilot %s keeps %s: on its primary execution host %s or on a host it still uses",
                pilot_id,
                kept,
                pilot.primary,
            )
        if not sisters:
            return not_held
        released = set(self._release_vnodes(pilot, sisters))
        gone = whole_hosts([n for n in sisters if n in released], pilot.nodes, pilot.hosts)  # what PBS can really use
        pilot.nodes = [n for n in pilot.nodes if n not in gone]
        if gone:
            self._vnodes_at = None
        return not_held + gone

    def following(self) -> set[str]:
        """The pilots this adapter still follows: submitted or adopted, not yet reported ended (what :meth:`poll`
        asks ``qstat`` about)."""
        return {pilot_id for pilot_id, pilot in self._pilots.items() if not pilot.ended}

    def primary_host(self, pilot_id: str) -> str | None:
        """The host of a running pilot that PBS never releases (the first of ``exec_host``),
        as this adapter knows it."""
        pilot = self._pilots.get(pilot_id)
        return pilot.primary if pilot is not None else None

    def cancel(self, pilot_id: str) -> None:
        pilot = self._pilots.get(pilot_id)
        if pilot is not None and not pilot.ended:
            self._qdel([pilot.job])
            pilot.deleted, pilot.deleted_run = True, max(pilot.run, pilot.deleted_run)
            self._vnodes_at = None

    def poll(self, now: float) -> list[PilotEvent]:
        """Started/ended events from ``qstat``, asked at most every ``poll_s`` seconds."""
        if self._polled_at is None or now - self._polled_at >= self.config.poll_s:
            self._polled_at = now
            self._refresh([p for p in self._pilots.values() if not p.ended])
        events, self._events = self._events, []
        return events

    def adopt(self, pilots: list[tuple[str, str]]) -> list[str]:
        """Track the pilots a previous controller submitted that PBS still has queued or running (and named as ours)."""
        if not pilots:
            return []
        answer = self._qstat([job for _, job in pilots])
        again = [job for _, job in pilots if job in answer.unknown]
        if again:  # asked once more before taken for gone
            second = self._qstat(again)
            answer.statuses.update(second.statuses)
            answer.finished |= second.finished
        adopted = []
        for pilot_id, job in pilots:
            status = answer.statuses.get(job)
            if status is None or status.finished or job in answer.finished:
                continue
            if status.name and status.name != f"pf-{pilot_id}":
                log.warning("not adopting PBS job %s: it is %r, not pilot %s", job, status.name, pilot_id)
                continue
            pilot = _Pilot(pilot_id, job, status.nodect or len(status.vnodes) or 1, state=status.state)
            self._track(pilot)
            adopted.append(pilot_id)
            log.info("adopted pilot %s (PBS job %s, %s)", pilot_id, job, status.state)
        self._vnodes_at = None
        return adopted

    def close(self) -> None:
        """qdel every pilot ever submitted or adopted, tracked or not, that PBS still has (and that still carries
        our pilot's name: a job id is never someone else's job we delete); then once more whatever is still queued."""
        jobs = [j for j in self._jobs if j not in self._finished]
        try:
            answer = self._qstat(jobs)
        except SchedulerCommandError:
            self._qdel([p.job for p in self._pilots.values() if not p.ended])  # cannot look: delete what we track
            raise
        ours = [j for j, s in answer.statuses.items() if not s.finished and s.name in ("", f"pf-{self._jobs[j]}")]
        # A pilot deleted already (the pilot manager cancels what no job needs) is ending: deleting it again is a
        # second qdel every admin sees (turn 4 (g)) — unless PBS lost the first (queued again, or on a new run).
        deleted = {p.job: p for p in self._pilots.values() if p.deleted and not p.ended}
        again = [j for j in ours if j not in deleted or self._deletion_lost(deleted[j], answer.statuses[j])]
        self._qdel(again)
        queued = [j for j, s in self._qstat(again).statuses.items() if s.state in QUEUED_STATES] if again else []
        if queued:
            self._qdel(queued)
        self._pilots.clear()
        self._jobs.clear()

    # ------------------------------------------------------------ helpers

    def _track(self, pilot: _Pilot) -> None:
        self._pilots[pilot.id] = pilot
        self._jobs[pilot.job] = pilot.id

    def _agent_argv(self, pilot_id: str) -> list[str]:
        """The pilot's command: the agent itself, as the job's top process (an executable job, ``qsub … -- argv``).

        Not a job script: a preemption's SIGTERM ends the script's login shell first, and MOM, its child gone, sees
        the session empty only at its ``kill_delay`` check, which the main job waits for (docs/sites.md). As the top
        process, the agent's own exit, after everything it started, is what MOM waits for. PBS's commands are found
        where ``qsub`` was: the job gets no login shell's PATH."""
        python = self.config.python or sys.executable
        qsub = shutil.which("qsub")
        return agent_argv(
            self.run_dir,
            pilot_id,
            "pbs",
            self.pilot_config,
            python=python,
            bin_dir=str(Path(qsub).parent) if qsub else None,
        )

    def _release_vnodes(self, pilot: _Pilot, vnodes: list[str]) -> list[str]:
        """``pbs_release_nodes``; the vnodes the job no longer holds afterwards (after a failure: what qstat says)."""
        waits, gone = list(BAD_STATE_RETRY_S), []
        while True:
            argv = ["pbs_release_nodes", "-j", pilot.job, *vnodes]
            try:
                result = self._run(argv, retries=0, final_codes=(SYSTEM_ERROR, BAD_STATE, UNKNOWN_JOB, FINISHED_JOB))
            except SchedulerCommandError as exc:
                # It timed out or failed: it may have worked anyway. Trust what the job holds now.
                done = self._not_held(pilot, vnodes)
                if not done and not gone:
                    raise
                log.warning("pilot %s: %s; the job no longer holds %s", pilot.id, exc, gone + (done or []))
                return gone + (done or [])
            message = (result.stderr + result.stdout).strip()
            if result.returncode in (0, UNKNOWN_JOB, FINISHED_JOB):
                return gone + vnodes  # released; or the job is over and poll reports its end
            if result.returncode == BAD_STATE and waits:
                self.sleep(waits.pop(0))  # sister MOMs still joining right after the start
                continue
            if result.returncode == SYSTEM_ERROR and PRIMARY_HOST_MESSAGE in message:
                log.warning("pilot %s: PBS refused to release %s: %s", pilot.id, vnodes, message)
                self._learn_primary(pilot, message)
                return gone
            if result.returncode == SYSTEM_ERROR and not gone:
                # Some are no longer in the job (a retry of a release whose first try worked, or released by
                # someone else), and then PBS releases none: release the others.
                done = self._not_held(pilot, vnodes) or []
                gone, vnodes = done, [n for n in vnodes if n not in done]
                if done and vnodes:
                    continue
                if done:
                    return gone
            raise SchedulerCommandError(argv, f"exited {result.returncode}", result.returncode, message)

    def _not_held(self, pilot: _Pilot, vnodes: list[str]) -> list[str] | None:
        """Which of ``vnodes`` the job no longer has in exec_vnode; None when qstat cannot tell."""
        try:
            answer = self._qstat([pilot.job])
        except SchedulerCommandError:
            return None
        status = answer.statuses.get(pilot.job)
        if status is None:
            return list(vnodes) if pilot.job in answer.finished else None
        return [n for n in vnodes if n not in status.vnodes]

    def _learn_primary(self, pilot: _Pilot, message: str) -> None:
        """PBS named a vnode on the primary host: our view of the hosts was stale."""
        match = re.search(r"Can't free '([^']+)'", message)
        if match and match.group(1) in pilot.hosts:
            pilot.primary = pilot.hosts[match.group(1)]

    def _refresh(self, pilots: list[_Pilot]) -> None:
        """Ask qstat about ``pilots`` now; what changed waits in ``_events`` for the next poll."""
        if not pilots:
            return
        answer = self._qstat([p.job for p in pilots])
        details = self._exit_details(sorted(answer.finished))
        for pilot in pilots:
            status = answer.statuses.get(pilot.job)
            if status is not None and not status.finished:
                pilot.missing = 0
                self._events += self._changes(pilot, status)
            elif status is not None or pilot.job in answer.finished:
                self._finished.add(pilot.job)
                why = details.get(pilot.job) or (f"Exit_status {status.exit_status}" if status is not None else "")
                self._events += self._end(pilot, "finished" + (f", {why}" if why else ""))
            else:
                pilot.missing += 1
                if pilot.missing >= 2 or pilot.deleted:  # asked once more (or we deleted it): gone
                    self._events += self._end(pilot, "gone")
        self._pilots = {k: p for k, p in self._pilots.items() if not p.ended}

    def _changes(self, pilot: _Pilot, status: JobStatus) -> list[PilotEvent]:
        """The events between what we last reported and the job's status now (the job still exists)."""
        events = []
        pilot.state, pilot.rerunning = status.state, status.rerunning
        new_run = status.running and status.run_count != pilot.run
        if pilot.running and (not status.running or new_run):
            requeued = status.rerunning or status.state in QUEUED_STATES or new_run
            why = "requeued (preempted)" if requeued else f"exiting ({status.state})"
            events.append(PilotEvent(EventKind.ENDED, pilot.id, pilot.job, tuple(pilot.nodes), detail=why,
                                     reason=EndReason.REQUEUED if requeued else EndReason.OTHER))  # fmt: skip
            pilot.running = False
        if status.rerunning:
            self._exiting[pilot.job] = list(status.vnodes or pilot.nodes or self._exiting.get(pilot.job, []))
        else:
            self._exiting.pop(pilot.job, None)
        if pilot.deleted:
            return events + self._delete_again(pilot, status)
        if not pilot.running and not (status.running and status.vnodes):
            pilot.nodes, pilot.hosts, pilot.primary = [], {}, None
        if status.running and status.vnodes and not pilot.running:
            hosts = vnode_hosts(status, self._vnodes)
            if len(hosts) < len(status.vnodes):
                try:
                    hosts = vnode_hosts(status, self._pbsnodes(max_age=self.config.poll_s))
                except SchedulerCommandError as exc:  # hosts unknown: nothing is released until they are known
                    log.warning("pilot %s: hosts of %s unknown: %s", pilot.id, status.vnodes, exc)
            pilot.running, pilot.run, pilot.hosts = True, status.run_count, hosts
            pilot.nodes = list(status.vnodes)  # the whole run: a requeued pilot gets its original select back
            pilot.primary = status.chunk_hosts[0] if status.chunk_hosts else pilot.hosts.get(pilot.nodes[0])
            deadline = time.time() + status.walltime_left_s if status.walltime_left_s is not None else None
            events.append(
                PilotEvent(
                    EventKind.STARTED,
                    pilot.id,
                    pilot.job,
                    tuple(pilot.nodes),
                    deadline=deadline,
                    detail=f"run {status.run_count}",
                )
            )
        return events

    def _end(self, pilot: _Pilot, why: str) -> list[PilotEvent]:
        """The job is gone or finished: its last run ends (or it ended before it ran)."""
        pilot.ended = True
        self._exiting.pop(pilot.job, None)
        if pilot.running:
            pilot.running = False
            return [PilotEvent(EventKind.ENDED, pilot.id, pilot.job, tuple(pilot.nodes), detail=why)]
        if pilot.run:
            return []  # its last run's end was reported already (requeued, or exiting)
        return [PilotEvent(EventKind.ENDED, pilot.id, pilot.job, detail=f"{why} before it ran")]

    def _delete_again(self, pilot: _Pilot, status: JobStatus) -> list[PilotEvent]:
        """A pilot we deleted that PBS still has: never a start; back in the queue or on a new run, deleted again
        (recheck (x): a qdel during a requeue is lost: the job shows R until it has exited, then Q, then runs again)."""
        if self._deletion_lost(pilot, status):
            log.warning(
                "pilot %s (PBS job %s) is %s again after it was deleted: deleting it again",
                pilot.id,
                pilot.job,
                status.state,
            )
            self._qdel([pilot.job])
            pilot.deleted_run = max(pilot.deleted_run, status.run_count)
        return []

    @staticmethod
    def _deletion_lost(pilot: _Pilot, status: JobStatus) -> bool:
        """PBS lost our qdel of ``pilot``: it is queued again, or runs again (a qdel during a requeue, recheck (x))."""
        return status.state in QUEUED_STATES or (status.running and status.run_count > pilot.deleted_run)

    def _idle(self, vnodes: dict[str, Vnode], node_type: str | None = None) -> int:
        """Chunks a new pilot could get now: idle vnodes (as ``place`` allows; of ``node_type``), less what the main
        workload and our waiting pilots (of that type) will take."""
        chunk = self._type_chunks[node_type] if node_type is not None else self.chunk
        free = idle_vnodes(vnodes, chunk)
        on_vnodes = {j for v in vnodes.values() for j in v.jobs}
        waiting = sum(
            p.requested
            for p in self._pilots.values()
            if (p.state in QUEUED_STATES or p.rerunning)
            and not (p.deleted or p.ended)
            and (p.rerunning or p.job not in on_vnodes)
            and (node_type is None or p.node_type == node_type)
        )
        ours = sum(len(p.nodes) for p in self._pilots.values() if p.running and not p.deleted)
        # A preempted pilot's vnodes stay job-busy while it exits (recheck (d)): never idle, and the main job's next.
        promised = sum(
            1 for job, names in self._exiting.items() for n in names if n in vnodes and job in vnodes[n].jobs
        )
        main = main_job_demand(self._main, len(free), promised, ours)
        return max(0, placeable(free, vnodes, self.config.place) - main - waiting)

    def _pbsnodes(self, max_age: float) -> dict[str, Vnode]:
        """The vnodes, and the main-workload jobs queued ahead of us, at most ``max_age`` seconds old."""
        if self._vnodes_at is not None and self.clock() - self._vnodes_at < max_age:
            return self._vnodes
        main = self._main_queued()  # first: a main job that starts meanwhile shows in pbsnodes as busy vnodes
        argv = ["pbsnodes", "-av", "-F", "json"]
        result = self._run(argv)
        try:
            vnodes = parse_pbsnodes(load_document(result.stdout))
        except ValueError as exc:
            raise SchedulerCommandError(argv, f"printed what we cannot parse ({exc})", 0, result.stdout) from None
        self._main, self._vnodes, self._vnodes_at = main, vnodes, self.clock()
        return self._vnodes

    def _main_queued(self) -> list[JobStatus]:
        """Jobs queued (``Q``) in queues of higher priority than ours, in priority order: they run before any pilot.
        Seen only where the server lets users see others' jobs (``query_other_jobs``, on by default)."""
        argv = ["qstat", "-Q", "-f", "-F", "json"]
        result = self._run(argv)
        try:
            queues = parse_queues(load_document(result.stdout))
        except ValueError as exc:
            raise SchedulerCommandError(argv, f"printed what we cannot parse ({exc})", 0, result.stdout) from None
        ours = queues.get(self.config.queue)
        floor = ours.priority if ours is not None and ours.priority is not None else None
        ahead = [
            q
            for q in queues.values()
            if q.name != self.config.queue and q.queued and (floor is None or q.priority is None or q.priority > floor)
        ]
        ahead.sort(key=lambda q: -(q.priority or 0))
        mine = set(self._jobs)
        ids: list[str] = []
        for q in ahead:
            out = self._run(["qselect", "-q", q.name, "-s", "Q"]).stdout
            ids += [j for j in out.split() if j not in mine and j not in ids]
        if not ids:
            return []
        answer = self._qstat(ids[:QSTAT_BATCH])
        order = {j: i for i, j in enumerate(ids)}
        queued = [s for s in answer.statuses.values() if s.state == "Q" and not s.comment.startswith("Can Never Run")]
        return sorted(queued, key=lambda s: order[s.id])

    def _qstat(self, jobs: Sequence[str]) -> _Answer:
        """Status of ``jobs`` (never with -x: with history off it shows nothing, even of a running job).
        A job qstat does not know (153) is in ``unknown``; one that finished under job history (35), in ``finished``."""
        answer = _Answer({}, set(), set())
        for i in range(0, len(jobs), QSTAT_BATCH):
            batch = list(jobs[i : i + QSTAT_BATCH])
            argv = ["qstat", "-f", "-F", "json", *batch]
            result = self._run(argv, final_codes=(UNKNOWN_JOB, FINISHED_JOB))
            unknown, finished = parse_qstat_errors(result.stderr)
            try:
                statuses = parse_jobs(load_document(result.stdout))
            except ValueError as exc:
                if result.returncode == 0 or not (unknown or finished):
                    raise SchedulerCommandError(
                        argv, f"printed what we cannot parse ({exc})", result.returncode, result.stdout + result.stderr
                    ) from None
                statuses = {}
                if len(batch) > 1:  # no document: never take the others for gone, ask one by one
                    for job in batch:
                        one = self._qstat([job])
                        answer.statuses.update(one.statuses)
                        answer.unknown |= one.unknown
                        answer.finished |= one.finished
                    continue
            answer.statuses.update(statuses)
            answer.finished |= {j for j in batch if j in finished}
            answer.unknown |= {j for j in batch if j not in statuses and j not in finished}
        return answer

    def _exit_details(self, jobs: list[str]) -> dict[str, str]:
        """``Exit_status`` of jobs PBS said have finished (35: history is on, so -x shows them). Best effort."""
        if not jobs:
            return {}
        try:
            result = self._run(
                ["qstat", "-x", "-f", "-F", "json", *jobs[:QSTAT_BATCH]], retries=0, final_codes=(UNKNOWN_JOB,)
            )
            statuses = parse_jobs(load_document(result.stdout))
        except (SchedulerCommandError, ValueError):
            return {}
        return {j: f"Exit_status {s.exit_status}" for j, s in statuses.items() if s.exit_status is not None}

    def _qdel(self, jobs: Sequence[str]) -> None:
        """Delete ``jobs``; one PBS no longer knows (153) or that has finished (35) is fine."""
        for i in range(0, len(jobs), QSTAT_BATCH):
            self._run(["qdel", *jobs[i : i + QSTAT_BATCH]], final_codes=(UNKNOWN_JOB, FINISHED_JOB))

    def _run(self, argv: Sequence[str], retries: int | None = None, final_codes: Sequence[int] = ()) -> Result:
        retries = self.retries if retries is None else retries
        return run(
            argv,
            timeout_s=self.config.command_timeout_s,
            retries=retries,
            backoff_s=self.backoff_s,
            final_codes=final_codes,
        )

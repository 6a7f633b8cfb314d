"""Slurm: pilots in a low-priority, preemptible partition, sized by a node range.

* idle nodes: ``sinfo -N -h -p PARTITION -t idle -o %N`` (nodes in no job),
  less what our own pending pilots have asked for (Slurm gives them those
  nodes next);
* pilots: ``sbatch --parsable -p PARTITION -N MIN-MAX --time=MAX --time-min=MIN``
  with a job script of our own (Parsl's Slurm template writes a fixed
  ``--nodes``/``--time``; a pilot wants whatever is idle, as long as it fits).
  MAX is never more than the nodes idle now: a pilot must not wait for nodes
  the main workload holds;
* status: ``squeue -h -t all -j IDS -o "%i|%T|%N|%L|%j|%D"``. A finished job
  stays listed (COMPLETED, CANCELLED…) for ``MinJobAge``, then slurmctld
  purges it and ``squeue`` no longer knows it ("Invalid job id specified",
  or nothing printed): a pilot missing once is asked about again, on its own,
  before it is declared ended — a live job is never declared gone;
* giving nodes back: ``scontrol update JobId=ID NodeList=KEPT`` — Slurm shrinks
  a running job in place; the batch host (first node) holds the job script,
  so it is released only by ending the pilot (``scancel``);
* preemption: the partition's ``PreemptMode`` with ``GraceTime`` sends the job
  SIGTERM first, which the agent inside turns into ``pilot.leaving``;
* a submission refused by policy (``QOSMaxSubmitJobPerUserLimit``,
  ``AssocMaxSubmitJobLimit``, "Job violates accounting/QOS policy") raises
  :class:`PilotRefused` so the pilot manager backs off;
* several kinds of node (``[node_types.NAME]``): each type is a partition, a
  ``--constraint`` on node features (``&``, ``|`` and brackets) and/or a
  ``--gres`` type; idle nodes are read with their partitions, features and
  generic resources (``sinfo -N -h -t idle -o "%N|%P|%f|%G"``) and counted
  per type (a node matching several types counts for the first), and a
  pilot asks for one type: ``-p``, ``--constraint``, ``--gres`` of that type.

Every command goes through :func:`pilotfill.schedulers.commands.run` (timeout,
retries with backoff, errors naming the command and its output).
"""

from __future__ import annotations

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

from ..config import Config, ConfigError, NodeTypeConfig, PilotConfig, check_range, check_walltime, section
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
    agent_command,
)
from .commands import Result, SchedulerCommandError, run

log = logging.getLogger("pilotfill.schedulers.slurm")

ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
}
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}  # asked for nodes, holds none
INVALID_JOB = "Invalid job id"  # squeue/scancel of a job slurmctld has purged (MinJobAge) or never had
ALREADY_DONE = re.compile(r"already completing or completed|Invalid job id", re.IGNORECASE)
POLICY_MESSAGE = re.compile(
    r"accounting/QOS policy|QOSMax\w*Limit|AssocMax\w*Limit|MaxSubmitJobs|jobs per hour limit", re.IGNORECASE
)
SQUEUE_FORMAT = "%i|%T|%N|%L|%j|%D"
SCANCEL_BATCH = 200

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


class SlurmNodes(RemoteNodes):
    """Inside a pilot: its nodes from Slurm's environment, a process on another of them through ``srun --overlap``
    (a step of the pilot's own job; ending the ``srun`` ends the step, so nothing more is needed to end it)."""

    def id_of_this_job(self) -> str:
        return os.environ["SLURM_JOB_ID"]

    def nodes_of_this_job(self) -> list[str]:
        return hostnames(os.environ["SLURM_JOB_NODELIST"])

    def run_on(self, node: str, argv: list[str], env: dict[str, str], log_path: Path) -> list[str]:
        return [
            "srun",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--kill-on-bad-exit=1",
            *self.with_env(node, argv, env),
        ]


@dataclass(frozen=True)
class Row:
    """One line of ``squeue -o SQUEUE_FORMAT``."""

    job_id: str
    state: str
    nodelist: str
    time_left: str
    name: str
    nodes: int


def parse_squeue(text: str) -> dict[str, Row]:
    """``squeue -h -o "%i|%T|%N|%L|%j|%D"`` -> rows by job id (pure)."""
    rows = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 6:
            rows[parts[0]] = Row(
                parts[0], parts[1], parts[2], parts[3], parts[4], int(parts[5]) if parts[5].isdigit() else 0
            )
    return rows


def is_policy_refusal(output: str) -> bool:
    """sbatch refused by a QOS/association/site limit rather than failing."""
    return bool(POLICY_MESSAGE.search(output))


def features_match(constraint: str, features: set[str]) -> bool:
    """Whether a node with ``features`` satisfies a ``--constraint`` of features joined by ``&`` and ``|`` (brackets
    read as grouping; counts such as ``a*2`` are not supported and never match)."""
    expr = constraint.replace("[", "(").replace("]", ")")
    tokens = re.findall(r"[()&|]|[^()&|\s]+", expr)
    pos = 0

    def atom() -> bool:
        nonlocal pos
        tok = tokens[pos] if pos < len(tokens) else ""
        pos += 1
        if tok == "(":
            value = either()
            pos += 1  # ")"
            return value
        return tok in features

    def both() -> bool:
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] == "&":
            pos += 1
            value = atom() and value
        return value

    def either() -> bool:
        nonlocal pos
        value = both()
        while pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            value = both() or value
        return value

    return bool(tokens) and either()


def gres_match(gres: str, node_gres: str) -> bool:
    """Whether a node's ``%G`` (``gpu:a100:4(S:0-1),…``) offers the ``--gres`` asked for
    (``gpu:a100`` or ``gpu:a100:4``)."""
    want = gres.split(":")
    for item in node_gres.split(","):
        have = re.sub(r"\(.*?\)", "", item).split(":")
        if have[0] != want[0]:
            continue
        if len(want) == 1:
            return True
        if len(want) >= 2 and not want[1].isdigit():
            if len(have) < 3 or have[1] != want[1]:
                continue
            return len(want) == 2 or (have[2].isdigit() and int(have[2]) >= int(want[2]))
        return have[-1].isdigit() and int(have[-1]) >= int(want[1])
    return False


@dataclass
class _Pilot:
    id: str
    job_id: str
    requested: int  # -N's upper bound: what Slurm may give it when it starts
    nodes: list[str] = field(default_factory=list)
    running: bool = False
    state: str = "PENDING"  # at the last squeue
    missing: int = 0  # consecutive squeue answers that did not know the job
    cancelled: bool = False
    node_type: str | None = None


@dataclass(frozen=True)
class SlurmConfig:
    """Pilots as Slurm jobs in a low-priority, preemptible partition: the ``[slurm]`` section."""

    partition: str = "scavenger"
    account: str = ""
    qos: str = ""
    time_min: str = "00:10:00"  # --time-min: Slurm may shorten the pilot down to this to fit it in
    time_max: str = "02:00:00"  # --time
    min_nodes: int = 1  # -N min-max: a pilot takes whatever is idle in this range
    max_nodes: int = 16
    poll_s: float = 5.0
    command_timeout_s: float = 10.0
    extra_args: tuple[str, ...] = ()
    python: str = ""  # interpreter on the compute nodes (default: the controller's)


@dataclass
class SlurmScheduler(BatchScheduler):
    config: SlurmConfig
    pilots: PilotConfig
    run_dir: Path
    name: str = "slurm"
    title: ClassVar[str] = "Slurm"
    selects: ClassVar[tuple[str, ...]] = ("partition", "constraint", "gres")
    node_access: ClassVar[type[NodeAccess]] = SlurmNodes
    config_class: ClassVar[type] = SlurmConfig
    bounds: ClassVar[dict[str, tuple[float, float, str]]] = {
        "slurm.poll_s": (0.05, 600.0, "squeue is asked this often"),
        "slurm.command_timeout_s": (1.0, 3600.0, "a Slurm command taking longer is an error"),
    }
    node_types: tuple[NodeTypeConfig, ...] = ()  # several kinds of node: how each is selected
    _pilots: dict[str, _Pilot] = field(default_factory=dict)
    # every job id submitted or adopted -> pilot: close() cancels them all
    _jobs: dict[str, str] = field(default_factory=dict)
    _ended: set[str] = field(default_factory=set)  # job ids seen in a final state or purged
    # found outside poll() (by release), reported by the next poll
    _events: list[PilotEvent] = field(default_factory=list)
    _last_poll: float = 0.0
    _idle_cache: tuple[float, int] | None = None
    _types_cache: tuple[float, dict[str, int]] | None = None

    @classmethod
    def parse_section(cls, raw: Any, name: str, where: Callable[[str], str], lead_s: float) -> SlurmConfig:
        """``[slurm]``: a time range whose longest outlasts a pilot's drain, a node range that is one."""
        slurm = section(SlurmConfig, raw, name, where, cls.bounds)
        check_range(slurm.time_min, slurm.time_max, "slurm.time_min", "slurm.time_max", where)
        check_walltime(slurm.time_max, "slurm.time_max", lead_s, where)
        if slurm.min_nodes > slurm.max_nodes:
            raise ConfigError(f"{where('slurm.min_nodes')}: {slurm.min_nodes} > slurm.max_nodes {slurm.max_nodes}")
        return slurm

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, on_spawn: OnSpawn) -> SlurmScheduler:
        return cls(config.slurm, config.pilots, run_dir, node_types=config.node_types)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        (self.run_dir / "pilots").mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def _run(self, argv: list[str], **kw) -> Result:
        # One retry inside the call; the controller backs off between failing calls.
        return run(argv, timeout_s=self.config.command_timeout_s, **{"retries": 1, **kw})

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        """Idle nodes of the partition less what our pending pilots asked for (sinfo cached for up to a second)."""
        if self.node_types:
            return sum((self.idle_by_type() or {}).values())
        waiting = sum(p.requested for p in self._pilots.values() if p.state in WAITING and not p.cancelled)
        return max(0, self._sinfo_idle(max_age=min(self.config.poll_s, 1.0)) - waiting)

    def idle_by_type(self) -> dict[str, int] | None:
        """Idle nodes of each configured type less what our pending pilots of that type asked for."""
        if not self.node_types:
            return None
        out = dict(self._typed_nodes(idle=True, max_age=min(self.config.poll_s, 1.0)))
        for p in self._pilots.values():
            if p.state in WAITING and not p.cancelled and p.node_type in out:
                out[p.node_type] = max(0, out[p.node_type] - p.requested)
        return out

    def capacity(self) -> int | None:
        """Nodes in the partition, whatever their state: the most a pilot could ever hold
        (of one type, on a machine with several)."""
        if self.node_types:
            return max(self._typed_nodes(idle=False, max_age=0.0).values(), default=0)
        out = self._run(["sinfo", "-N", "-h", "-p", self.config.partition, "-o", "%N"]).stdout
        return len({line.strip() for line in out.splitlines() if line.strip()})

    def _kind(self, name: str | None) -> NodeTypeConfig | None:
        kind = next((t for t in self.node_types if t.name == name), None)
        if self.node_types and kind is None:
            raise SchedulerCommandError(
                ["sbatch"],
                f"not submitted: no node type {name!r} in the config ({', '.join(t.name for t in self.node_types)})",
            )
        return kind

    def _typed_nodes(self, idle: bool, max_age: float) -> dict[str, int]:
        """Nodes of each type (idle ones, or all), from one ``sinfo`` over the types' partitions."""
        now = time.monotonic()
        if idle and self._types_cache is not None and now - self._types_cache[0] < max_age:
            return self._types_cache[1]
        partitions = sorted({t.partition or self.config.partition for t in self.node_types})
        argv = ["sinfo", "-N", "-h", "-p", ",".join(partitions), *(["-t", "idle"] if idle else []), "-o", "%N|%P|%f|%G"]
        counts = {t.name: 0 for t in self.node_types}
        seen: dict[str, tuple[set[str], set[str], str]] = {}
        for line in self._run(argv).stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4:
                continue
            name, partition, features, gres = parts
            parts_of, feats, _ = seen.setdefault(
                name, (set(), set(f for f in features.split(",") if f and f != "(null)"), gres)
            )
            parts_of.add(partition.rstrip("*"))
        for name, (partitions_of, feats, gres) in seen.items():
            for t in self.node_types:
                if (t.partition or self.config.partition) not in partitions_of:
                    continue
                if t.constraint and not features_match(t.constraint, feats):
                    continue
                if t.gres and not gres_match(t.gres, gres):
                    continue
                counts[t.name] += 1
                break
        if idle:
            self._types_cache = (now, counts)
        return counts

    def submit_pilot(self, pilot_id: str, nodes: int, node_type: str | None = None) -> str:
        kind = self._kind(node_type)
        self._idle_cache = self._types_cache = None
        idle = self.idle_nodes() if kind is None else (self.idle_by_type() or {}).get(kind.name, 0)
        hi = min(nodes, self.config.max_nodes, idle)
        if hi < 1:
            raise NothingIdle(f"sbatch: not submitted: {nodes} node(s) wanted, {idle} idle", reason=f"{idle} idle")
        lo = min(self.config.min_nodes, hi)
        script = self.run_dir / "pilots" / f"{pilot_id}.sh"
        python = self.config.python or sys.executable
        agent = agent_command(self.run_dir, pilot_id, "slurm", self.pilots, python)
        script.write_text(SCRIPT.format(pilot=pilot_id, agent=agent))
        script.chmod(0o700)
        partition = kind.partition if kind is not None and kind.partition else self.config.partition
        argv = [
            "sbatch", "--parsable", "-p", partition, "-N", f"{lo}-{hi}",
            "--time", self.config.time_max, "--time-min", self.config.time_min,
            "--job-name", f"pf-{pilot_id}", "--output", str(self.run_dir / "logs" / f"pilot-{pilot_id}.out"),
            "--chdir", str(self.run_dir),
        ]  # fmt: skip
        if self.config.account:
            argv += ["--account", self.config.account]
        if self.config.qos:
            argv += ["--qos", self.config.qos]
        if kind is not None and kind.constraint:
            argv += ["--constraint", kind.constraint]
        if kind is not None and kind.gres:
            argv += ["--gres", kind.gres]
        argv += [*self.config.extra_args, str(script)]
        try:
            out = self._run(argv, retries=0).stdout.strip()  # never twice: a timed-out sbatch may have queued it
        except SchedulerCommandError as exc:
            if exc.returncode is not None and is_policy_refusal(exc.output):
                raise PilotRefused(f"`{' '.join(argv)}` refused by Slurm policy: {exc.output.strip()[-500:]}") from None
            raise
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SchedulerCommandError(argv, "printed no job id", 0, out)
        self._track(_Pilot(pilot_id, job_id, hi, node_type=kind.name if kind is not None else None))
        self._idle_cache = self._types_cache = None
        return job_id

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        pilot = self._pilots.get(pilot_id)
        if pilot is not None and not set(nodes) <= set(pilot.nodes):
            self._events += self._refresh([pilot])  # its agent may have registered before our last poll saw it start
            pilot = self._pilots.get(pilot_id)
        if pilot is None:
            return list(nodes)  # not ours any more
        if not pilot.running:
            log.info("pilot %s is %s: nothing to give back yet", pilot_id, pilot.state)
            return []
        not_held = [n for n in nodes if n not in pilot.nodes]
        keep = [n for n in pilot.nodes if n not in nodes]
        if not keep:
            self.cancel(pilot_id)
            return list(nodes)
        batch_host = pilot.nodes[0]
        if batch_host not in keep:
            keep.insert(0, batch_host)  # the job script runs there: only ending the pilot frees it
        given = [n for n in pilot.nodes if n not in keep]
        if not given:
            return not_held
        argv = ["scontrol", "update", f"JobId={pilot.job_id}", f"NodeList={','.join(keep)}"]
        try:
            self._run(argv, retries=0)
        except SchedulerCommandError:
            # It may have worked before it failed or timed out, or the job may be over: trust what it holds now.
            held = self._nodes_now(pilot)
            if held is None or all(n in held for n in given):
                raise
            given = [n for n in given if n not in held]
            keep = [n for n in pilot.nodes if n not in given]
            if not keep:  # the job is over: poll reports its end
                return list(nodes)
        pilot.nodes = keep
        self._idle_cache = self._types_cache = None
        return not_held + given

    def cancel(self, pilot_id: str) -> None:
        pilot = self._pilots.get(pilot_id)
        if pilot is not None:
            self._scancel([pilot.job_id])
            pilot.cancelled = True
            self._idle_cache = self._types_cache = None

    def poll(self, now: float) -> list[PilotEvent]:
        """Started/ended events from squeue (at most every ``poll_s``), and those found meanwhile by release()."""
        if self._pilots and now - self._last_poll >= self.config.poll_s:
            self._last_poll = now
            self._events += self._refresh(list(self._pilots.values()))
        events, self._events = self._events, []
        return events

    def adopt(self, pilots: list[tuple[str, str]]) -> list[str]:
        """Track the pilots a previous controller submitted that Slurm still has pending or running (named as ours)."""
        if not pilots:
            return []
        rows = self._squeue([job for _, job in pilots])
        for job in [j for _, j in pilots if j not in rows]:
            rows.update(self._squeue([job]))  # asked once more, on its own, before taken for gone
        adopted = []
        for pilot_id, job in pilots:
            row = rows.get(job)
            if row is None or row.state not in ACTIVE:
                continue
            if row.name and row.name != f"pf-{pilot_id}":
                log.warning("not adopting Slurm job %s: it is %r, not pilot %s", job, row.name, pilot_id)
                continue
            self._track(_Pilot(pilot_id, job, max(1, row.nodes), state=row.state))
            adopted.append(pilot_id)
            log.info("adopted pilot %s (Slurm job %s, %s)", pilot_id, job, row.state)
        self._idle_cache = self._types_cache = None
        return adopted

    def close(self) -> None:
        """scancel every pilot ever submitted or adopted, tracked or not, that Slurm still has (by our pilot's name:
        never someone else's job); then once more whatever is still pending."""
        ids = [j for j in self._jobs if j not in self._ended]
        if ids:
            try:
                rows = self._squeue(ids)
            except SchedulerCommandError:
                self._scancel([p.job_id for p in self._pilots.values()])  # cannot look: cancel what we track
                raise
            ours = [j for j, r in rows.items() if r.state in ACTIVE and r.name in ("", f"pf-{self._jobs[j]}")]
            if ours:
                self._scancel(ours)
                pending = [j for j, r in self._squeue(ours).items() if r.state in WAITING]
                if pending:
                    self._scancel(pending)
        self._pilots.clear()
        self._jobs.clear()

    # ------------------------------------------------------------ helpers

    def _track(self, pilot: _Pilot) -> None:
        self._pilots[pilot.id] = pilot
        self._jobs[pilot.job_id] = pilot.id

    def _sinfo_idle(self, max_age: float) -> int:
        now = time.monotonic()
        if self._idle_cache is not None and now - self._idle_cache[0] < max_age:
            return self._idle_cache[1]
        out = self._run(["sinfo", "-N", "-h", "-p", self.config.partition, "-t", "idle", "-o", "%N"]).stdout
        idle = len({line.strip() for line in out.splitlines() if line.strip()})
        self._idle_cache = (now, idle)
        return idle

    def _squeue(self, ids: Sequence[str]) -> dict[str, Row]:
        """Rows of ``ids`` in any state; a purged job is simply absent. Fails (never says "gone") when squeue fails."""
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
        result = self._run(argv, final_codes=(1,))
        if result.returncode == 1:
            if INVALID_JOB in result.stderr:
                return {}  # every one of them purged
            raise SchedulerCommandError(argv, "exited 1", 1, result.stderr + result.stdout)
        return parse_squeue(result.stdout)

    def _refresh(self, pilots: list[_Pilot]) -> list[PilotEvent]:
        if not pilots:
            return []
        rows = self._squeue([p.job_id for p in pilots])
        events = []
        for pilot in pilots:
            row = rows.get(pilot.job_id)
            if row is None and pilot.missing >= 1:
                row = self._squeue([pilot.job_id]).get(pilot.job_id)  # asked once more, on its own
            if row is None:
                pilot.missing += 1
                if pilot.missing >= 2:
                    events += self._end(pilot, "gone (purged by slurmctld)")
                continue
            pilot.missing, pilot.state = 0, row.state
            if row.state == "RUNNING" and not pilot.running:
                pilot.running, pilot.nodes = True, hostnames(row.nodelist)
                left = _seconds(row.time_left)
                events.append(
                    PilotEvent(
                        EventKind.STARTED,
                        pilot.id,
                        pilot.job_id,
                        tuple(pilot.nodes),
                        deadline=time.time() + left if left is not None else None,
                    )
                )
            elif row.state not in ACTIVE:
                events += self._end(
                    pilot, row.state.lower(), EndReason.CANCELLED if row.state == "CANCELLED" else EndReason.OTHER
                )
            elif row.state in WAITING and pilot.running:
                pilot.running, pilot.nodes = False, []
                events.append(
                    PilotEvent(
                        EventKind.ENDED, pilot.id, pilot.job_id, (), detail="requeued", reason=EndReason.REQUEUED
                    )
                )
        return events

    def _end(self, pilot: _Pilot, why: str, reason: EndReason = EndReason.OTHER) -> list[PilotEvent]:
        self._pilots.pop(pilot.id, None)
        self._ended.add(pilot.job_id)
        self._idle_cache = self._types_cache = None
        return [PilotEvent(EventKind.ENDED, pilot.id, pilot.job_id, tuple(pilot.nodes), detail=why, reason=reason)]

    def _nodes_now(self, pilot: _Pilot) -> list[str] | None:
        """The nodes squeue says the job holds now (none once it is over); None when it cannot tell."""
        try:
            row = self._squeue([pilot.job_id]).get(pilot.job_id)
            if row is None:
                return None
            return hostnames(row.nodelist) if row.state in ACTIVE else []
        except SchedulerCommandError:
            return None

    def _scancel(self, ids: Sequence[str]) -> None:
        """Cancel ``ids``; one that has already ended or been purged is fine."""
        for i in range(0, len(ids), SCANCEL_BATCH):
            argv = ["scancel", *ids[i : i + SCANCEL_BATCH]]
            result = self._run(argv, final_codes=(1,))
            errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
            if result.returncode == 1 and not (errors and all(ALREADY_DONE.search(e) for e in errors)):
                raise SchedulerCommandError(argv, "exited 1", 1, result.stderr + result.stdout)


def _seconds(time_left: str) -> float | None:
    """squeue's %L (``1-02:03:04``, ``29:51``; ``UNLIMITED``/``NOT_SET`` -> None)."""
    from ..config import parse_duration

    try:
        return float(parse_duration(time_left))
    except ValueError:
        return None


def sbatch_available() -> bool:
    """True when the Slurm client commands are installed (``sinfo --version`` needs a reachable config,
    so not asked)."""
    return all(shutil.which(c) for c in ("sbatch", "squeue", "sinfo", "scontrol", "scancel"))

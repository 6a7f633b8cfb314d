"""The embedded default: a virtual cluster of N named nodes on this machine.

A main workload takes nodes back and returns them over time — by default each
virtual node replays one real Summit node's idle/busy history (from the
bundled excerpt, a window in which it was mostly idle), time-compressed and
looped, so a node changes hands every few tens of seconds; or exactly the
changes a config scripts (for tests). Pilots are agent processes holding one
or more nodes; a node the main workload wants is preempted like a batch
system would: SIGTERM to the pilot, SIGKILL after the grace period. With
``pilot_walltime_s`` a pilot also has a walltime, ended the way Slurm ends one
(SIGTERM at its end, SIGKILL a grace later); its end is told with its start.

Nodes are called ``pf-node-0`` … rather than ``localhost``: Elastic Horovod
blacklists a host whose rank dies, and with one host name the whole job
would stop (DESIGN, "Elastic runtime").

With ``[node_types.NAME] nodes = K`` tables the virtual nodes have types (the
first K nodes the first type, and so on), and a pilot asks for one type, as
on a machine with several kinds of node. They are labels only: every virtual
node is this machine's CPU, so a job runs as fast on one type as on another —
what differs is where pilotfill places it (by its curves per type or the
similarity policy), not how fast it then runs.

Across a controller restart it behaves as a batch system does: pilots keep
running and the main workload keeps its clock. The cluster lives inside the
controller's process, but where ``pilotfill run`` restarts a controller that
dies (:func:`pilotfill.lease.restarted_if_it_dies`) its pilot agents are
started to outlive it, and everything else it knows — the workload's clock and
position in its schedule, the nodes it has taken, each running pilot's id,
nodes, agent (pid and kernel start time) and walltime — is written to
``RUN_DIR/local_cluster.json`` whenever it changes, so the next controller's
cluster re-attaches to them (:meth:`LocalScheduler.adopt`), as PBS's adapter
re-attaches to its jobs. Why not a process of its own: it would be a second
long-lived server with its own protocol, lease and failure modes, to keep a
few hundred bytes of state that a file keeps; the agents it starts already end
themselves when the campaign's lease is gone. A controller nobody restarts
keeps today's rule: its agents die with it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import procs
from ..config import MIN_TRAIN_S, NODE_NAME, Config, ConfigError, PilotConfig, section, too_short
from ..lease import holder, restarted_if_it_dies
from ..traces import read_trace
from .base import BatchScheduler, EndReason, EventKind, NodeAccess, NothingIdle, OnSpawn, PilotEvent


@dataclass(frozen=True)
class ScriptedChange:
    """The main workload takes (``busy``) or returns (``idle``) a node ``at`` seconds after start."""

    at: float
    node: str
    state: str


@dataclass(frozen=True)
class LocalConfig:
    """The embedded local virtual cluster: its ``[local]`` section."""

    nodes: int = 4
    node_prefix: str = "pf-node-"
    workload: str = "trace"  # "trace": compressed Summit excerpt; "script": exactly `script`; "none"
    trace_seconds_per_second: float = 120.0
    # a pilot's walltime, as a batch system would impose it (0: none); its pilot is ended then
    pilot_walltime_s: float = 0.0
    script: tuple[ScriptedChange, ...] = ()


EXCERPT = Path(__file__).resolve().parent.parent / "data" / "summit-2021-02-10-week-64nodes.csv.gz"
WINDOW_HOURS = 6.0
MIN_PERIOD_S = 4.0
"""Idle or busy spells shorter than this (after compression) are dropped: too short to be seen."""
STATE_FILE = "local_cluster.json"
"""What a restarted controller's local cluster re-attaches to (written only where a controller is restarted)."""
FAILURE_NOTICE_S = 15.0
"""A pilot that dies on its own is a failed node to a batch system, which notices only after its own
timeout (Slurm's SlurmdTimeout, PBS's node down detection). Until then, only the missed heartbeats tell."""


def summit_schedule(
    nodes: list[str], seconds_per_second: float, hours: float = WINDOW_HOURS, trace: Path = EXCERPT
) -> tuple[list[ScriptedChange], float]:
    """Changes for ``nodes`` from the bundled trace, and the period after which they repeat.

    Virtual node i replays the real node with the i-th most idle window of
    ``hours`` hours, starting from that window's beginning.
    """
    tr = read_trace(trace)
    grid = np.arange(tr.start, tr.end, 60.0)
    idle_now = {n: n in tr.initial_idle for n in tr.nodes}
    changes: dict[str, list[tuple[float, bool]]] = {n: [] for n in tr.nodes}
    for s in tr.steps:
        for n in s.to_idle:
            changes[n].append((s.time, True))
        for n in s.to_busy:
            changes[n].append((s.time, False))
    width = int(hours * 60)
    best: list[tuple[float, str, float]] = []
    for n in tr.nodes:
        state = np.zeros(len(grid), dtype=float)
        idle, last = idle_now[n], 0
        for t, becomes in changes[n]:
            k = int(np.searchsorted(grid, t))
            state[last:k] = idle
            idle, last = becomes, k
        state[last:] = idle
        sums = np.concatenate([[0.0], np.cumsum(state)])
        frac = (sums[width:] - sums[:-width]) / width
        k = int(np.argmax(frac))
        best.append((float(frac[k]), n, float(grid[k])))
    best.sort(key=lambda b: (-b[0], b[1]))
    period = hours * 3600 / seconds_per_second
    out: list[ScriptedChange] = []
    for virtual, (_, real, start) in zip(nodes, best):
        idle = idle_now[real]
        for t, becomes in changes[real]:
            if t <= start:
                idle = becomes
        spells = [(0.0, idle)]
        for t, becomes in changes[real]:
            if start < t < start + hours * 3600 and becomes != spells[-1][1]:
                spells.append(((t - start) / seconds_per_second, becomes))
        # Drop spells too short to matter, merging their neighbours.
        kept = [spells[0]]
        for i, (t, becomes) in enumerate(spells[1:], 1):
            end = spells[i + 1][0] if i + 1 < len(spells) else period
            if end - t >= MIN_PERIOD_S and becomes != kept[-1][1]:
                if len(kept) == 1 and t < MIN_PERIOD_S:
                    kept[0] = (0.0, becomes)  # too soon after the start: start in that state
                else:
                    kept.append((t, becomes))
        out += [ScriptedChange(t, virtual, "idle" if becomes else "busy") for t, becomes in kept]
    return sorted(out, key=lambda c: (c.at, c.node)), period


@dataclass
class _Pilot:
    id: str
    scheduler_id: str
    nodes: list[str]
    process: subprocess.Popen | procs.Adopted  # Adopted: started by a predecessor controller
    ticks: int | None = None  # its agent's kernel start time (a recycled pid is never taken for it)
    started_reported: bool = False
    walltime_end: float | None = None
    kill_at: float | None = None
    why: str = ""
    reason: EndReason = EndReason.OTHER  # why its run ends, for the controller
    died_at: float | None = None


def local_node_types(config: Config) -> dict[str, str]:
    """The local cluster's virtual nodes and their types: the first ``nodes`` of the first type, and so on."""
    out, i = {}, 0
    for kind in config.node_types:
        for _ in range(kind.nodes):
            out[f"{config.local.node_prefix}{i}"] = kind.name
            i += 1
    return out


@dataclass
class LocalScheduler(BatchScheduler):
    """Virtual nodes, a main workload, and pilots as local agent processes."""

    title: ClassVar[str] = "the local cluster"
    selects: ClassVar[tuple[str, ...]] = ("nodes",)
    # every virtual node is this machine; the agent is told its nodes
    node_access: ClassVar[type[NodeAccess]] = NodeAccess
    config_class: ClassVar[type] = LocalConfig
    bounds: ClassVar[dict[str, tuple[float, float, str]]] = {
        "local.trace_seconds_per_second": (1e-3, 1e6, "trace seconds per real second"),
        "local.pilot_walltime_s": (0.0, 31_536_000.0, "a pilot's walltime"),
    }

    config: LocalConfig
    pilots: PilotConfig
    run_dir: Path
    on_spawn: Callable[[subprocess.Popen, str, str], None] = lambda p, kind, host: None
    clock: Callable[[], float] = time.time
    name: str = "local"
    node_types: dict[str, str] = field(default_factory=dict)  # node -> type (a typed virtual cluster)
    _busy: set[str] = field(default_factory=set)
    _running: dict[str, _Pilot] = field(default_factory=dict)
    _events: list[PilotEvent] = field(default_factory=list)
    _next_id: int = 0
    _saved: str = ""  # what local_cluster.json holds now

    @classmethod
    def parse_section(cls, raw: Any, name: str, where: Callable[[str], str], lead_s: float) -> LocalConfig:
        """``[local]``: the cluster's size and names, its main workload (a scripted one's changes name its nodes), and a
        pilot walltime that leaves time to train."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{where(name)}: must be a table")
        raw = dict(raw)
        script_raw = raw.pop("script", [])
        local = section(LocalConfig, raw, name, where, cls.bounds)
        if not isinstance(script_raw, list):
            raise ConfigError(f"{where('local.script')}: must be a list of {{at, node, state}} tables")
        script = []
        for i, item in enumerate(script_raw):
            key = f"local.script[{i}]"
            if not isinstance(item, dict) or set(item) != {"at", "node", "state"}:
                raise ConfigError(f"{where(key)}: must have exactly at, node and state")
            if item["state"] not in ("busy", "idle") or not isinstance(item["at"], (int, float)) or item["at"] < 0:
                raise ConfigError(f"{where(key)}: state must be busy or idle and at a time >= 0")
            script.append(ScriptedChange(float(item["at"]), str(item["node"]), item["state"]))
        local = LocalConfig(**{**local.__dict__, "script": tuple(sorted(script, key=lambda c: c.at))})
        if local.nodes < 1:
            raise ConfigError(f"{where('local.nodes')}: must be at least 1")
        if local.nodes > 4096:
            raise ConfigError(f"{where('local.nodes')}: at most 4096 virtual nodes on one machine, got {local.nodes}")
        if not NODE_NAME.fullmatch(local.node_prefix):
            raise ConfigError(
                f"{where('local.node_prefix')}: {local.node_prefix!r} must be letters, digits, '.', '_' or '-' (it "
                "names hosts and files)"
            )
        if local.workload not in ("trace", "script", "none"):
            raise ConfigError(f"{where('local.workload')}: must be trace, script or none")
        names = {f"{local.node_prefix}{i}" for i in range(local.nodes)}
        for i, change in enumerate(local.script):
            if change.node not in names:
                raise ConfigError(f"{where(f'local.script[{i}].node')}: {change.node!r} is not a node of this cluster")
        if 0 < local.pilot_walltime_s < lead_s + MIN_TRAIN_S:
            raise ConfigError(
                f"{where('local.pilot_walltime_s')}: {local.pilot_walltime_s:g} s cannot work: "
                f"{too_short(local.pilot_walltime_s, lead_s)} (0: no walltime)"
            )
        return local

    @classmethod
    def check_node_types(cls, node_types: tuple, config: Any, where: Callable[[str], str]) -> None:
        """The types' virtual nodes are the cluster's: they add up to ``[local] nodes``."""
        total = sum(t.nodes for t in node_types)
        if node_types and total != config.nodes:
            raise ConfigError(
                f"{where('node_types')}: the types' nodes add up to {total}, but [local] nodes = {config.nodes}"
            )

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, on_spawn: OnSpawn) -> LocalScheduler:
        return cls(config.local, config.pilots, run_dir, on_spawn=on_spawn, node_types=local_node_types(config))

    def __post_init__(self) -> None:
        self.nodes = [f"{self.config.node_prefix}{i}" for i in range(self.config.nodes)]
        # A controller `pilotfill run` restarts: its pilots outlive it and the next one re-attaches (see the module).
        self.outlives = restarted_if_it_dies(self.run_dir)
        self._campaign = list(holder(self.run_dir) or ()) if self.outlives else []
        self._predecessor = self._load()  # read before anything of ours overwrites it
        self._t0 = self.clock()
        self._cursor = 0
        self._period: float | None = None
        if self.config.workload == "trace":
            self._schedule, self._period = summit_schedule(self.nodes, self.config.trace_seconds_per_second)
        elif self.config.workload == "script":
            self._schedule = list(self.config.script)
        else:
            self._schedule = []
        # The state at time 0 (changes scripted at 0 apply before any pilot starts).
        self._advance_workload(self._t0)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ BatchScheduler

    def idle_nodes(self) -> int:
        return len(self._free())

    def idle_by_type(self) -> dict[str, int] | None:
        if not self.node_types:
            return None
        out = {t: 0 for t in self.node_types.values()}
        for n in self._free():
            out[self.node_types[n]] += 1
        return out

    def capacity(self) -> int:
        if self.node_types:  # a job runs on one type at a time
            kinds = list(self.node_types.values())
            return max(kinds.count(t) for t in set(kinds))
        return len(self.nodes)

    def submit_pilot(self, pilot_id: str, nodes: int, node_type: str | None = None) -> str:
        free = [n for n in self._free() if node_type is None or self.node_types.get(n) == node_type]
        free = free[: max(1, min(nodes, self.pilots.nodes_per_pilot))]
        if not free:
            raise NothingIdle(
                f"no idle node{' of type ' + repr(node_type) if node_type else ''} to start a pilot on", reason="0 idle"
            )
        self._next_id += 1
        scheduler_id = f"local.{self._next_id}"
        argv = [
            sys.executable,
            "-m",
            "pilotfill.pilots.agent",
            "--run-dir",
            str(self.run_dir),
            "--pilot",
            pilot_id,
            "--nodes",
            ",".join(free),
            "--scheduler-id",
            scheduler_id,
            "--heartbeat-s",
            str(self.pilots.heartbeat_s),
            "--deadline-s",
            str(self.pilots.heartbeat_deadline_s),
            "--grace-s",
            str(self.pilots.grace_s),
        ]
        proc = procs.spawn(
            argv, log_path=str(self.run_dir / "logs" / f"pilot-{pilot_id}.log"), outlive_parent=self.outlives
        )
        self.on_spawn(proc, "pilot", ",".join(free))
        walltime = self.config.pilot_walltime_s
        self._running[pilot_id] = _Pilot(pilot_id, scheduler_id, list(free), proc, procs.start_ticks(proc.pid),
                                         walltime_end=self.clock() + walltime if walltime > 0 else None)  # fmt: skip
        self._save()
        return scheduler_id

    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        pilot = self._running.get(pilot_id)
        if pilot is None:
            return list(nodes)
        pilot.nodes = [n for n in pilot.nodes if n not in nodes]
        if not pilot.nodes:
            self.cancel(pilot_id)
        self._save()
        return list(nodes)

    def cancel(self, pilot_id: str) -> None:
        pilot = self._running.get(pilot_id)
        if pilot is not None and pilot.kill_at is None:
            self._terminate(pilot, "cancelled", EndReason.CANCELLED)
            self._save()

    def poll(self, now: float) -> list[PilotEvent]:
        self._advance_workload(now)
        for pilot in list(self._running.values()):
            if not pilot.started_reported:
                pilot.started_reported = True
                self._events.append(
                    PilotEvent(
                        EventKind.STARTED, pilot.id, pilot.scheduler_id, tuple(pilot.nodes), deadline=pilot.walltime_end
                    )
                )
            if pilot.walltime_end is not None and now >= pilot.walltime_end and pilot.kill_at is None:
                self._terminate(pilot, "walltime")  # as Slurm ends a job at its time limit
            code = pilot.process.poll()
            if code is not None and pilot.kill_at is None and code != 0:
                # Died on its own (a node failure to the batch system): noticed late.
                pilot.died_at = pilot.died_at or now
                if now - pilot.died_at < FAILURE_NOTICE_S:
                    continue
                pilot.why = f"died ({code})"
            if code is not None:
                del self._running[pilot.id]
                self._events.append(
                    PilotEvent(
                        EventKind.ENDED,
                        pilot.id,
                        pilot.scheduler_id,
                        tuple(pilot.nodes),
                        detail=pilot.why or f"exit {code}",
                        reason=pilot.reason,
                    )
                )
            elif pilot.kill_at is not None and now >= pilot.kill_at:
                procs.kill_group(pilot.process.pid, pilot.ticks)
        self._save()
        events, self._events = self._events, []
        return events

    def adopt(self, pilots: list[tuple[str, str]]) -> list[str]:
        """A restarted controller's cluster carries on where its predecessor's left off (``local_cluster.json``, written
        by a cluster of the same ``pilotfill run``): the main workload's clock and the pilots whose agents still run.
        An agent the journal no longer lists as a live pilot is ended; a pilot whose agent is gone is not adopted (the
        controller takes it for lost)."""
        saved, self._predecessor = self._predecessor, None
        if saved is None:
            return []
        self._t0, self._cursor, self._busy = float(saved["t0"]), int(saved["cursor"]), set(saved["busy"])
        self._next_id = max(self._next_id, int(saved["next_id"]))
        wanted = dict(pilots)
        for row in saved["pilots"]:
            agent = procs.Adopted(int(row["pid"]), row["ticks"])
            if agent.poll() is not None:
                continue
            if wanted.get(row["id"]) != row["scheduler_id"]:
                procs.kill_group(agent.pid, agent.ticks)  # a pilot its controller had ended: nobody's now
                continue
            self._running[row["id"]] = _Pilot(
                row["id"],
                row["scheduler_id"],
                list(row["nodes"]),
                agent,
                agent.ticks,
                started_reported=row["started_reported"],
                walltime_end=row["walltime_end"],
                kill_at=row["kill_at"],
                why=row["why"],
                reason=EndReason(row["reason"]),
                died_at=row["died_at"],
            )
            # this controller's now: not killed as a predecessor's leftover
            self.on_spawn(agent, "pilot", ",".join(row["nodes"]))
        self._save()
        return list(self._running)

    def close(self) -> None:
        for pilot in list(self._running.values()):
            procs.kill_group(pilot.process.pid, pilot.ticks)
            try:
                pilot.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass  # unkillable (uninterruptible sleep): nothing more to do here
        self._running.clear()
        self._save()

    # ------------------------------------------------------------ across controller restarts

    def _save(self) -> None:
        """Write what a restarted controller's cluster re-attaches to, when it changed (only where one will)."""
        if not self.outlives:
            return
        text = json.dumps(
            {
                "campaign": self._campaign,
                "t0": self._t0,
                "cursor": self._cursor,
                "busy": sorted(self._busy),
                "next_id": self._next_id,
                "pilots": [
                    {
                        "id": p.id,
                        "scheduler_id": p.scheduler_id,
                        "nodes": p.nodes,
                        "pid": p.process.pid,
                        "ticks": p.ticks,
                        "started_reported": p.started_reported,
                        "walltime_end": p.walltime_end,
                        "kill_at": p.kill_at,
                        "why": p.why,
                        "reason": str(p.reason),
                        "died_at": p.died_at,
                    }
                    for p in self._running.values()
                ],
            }
        )
        if text == self._saved:
            return
        path = self.run_dir / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError:
            return  # a full disk: the journal says so; a restart then finds the cluster as it was last written
        self._saved = text

    def _load(self) -> dict | None:
        """``local_cluster.json`` if a cluster of this same ``pilotfill run`` wrote it
        (a new campaign starts a new machine)."""
        if not self.outlives:
            return None
        try:
            saved = json.loads((self.run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return saved if isinstance(saved, dict) and saved.get("campaign") == self._campaign else None

    # ------------------------------------------------------------ the main workload

    def main_busy(self) -> set[str]:
        """Nodes the main workload has now (for views and tests)."""
        return set(self._busy)

    def _free(self) -> list[str]:
        held = {n for p in self._running.values() for n in p.nodes}
        return [n for n in self.nodes if n not in self._busy and n not in held]

    def _advance_workload(self, now: float) -> None:
        elapsed = now - self._t0
        while self._schedule:
            if self._cursor >= len(self._schedule):
                if self._period is None:
                    return
                self._t0 += self._period  # loop the compressed trace
                elapsed = now - self._t0
                self._cursor = 0
            change = self._schedule[self._cursor]
            if change.at > elapsed:
                return
            self._cursor += 1
            if change.state == "busy":
                self._busy.add(change.node)
                for pilot in self._running.values():
                    if change.node in pilot.nodes and pilot.kill_at is None:
                        self._terminate(pilot, f"preempted for {change.node}")
                        self._events.append(
                            PilotEvent(
                                EventKind.PREEMPTED,
                                pilot.id,
                                pilot.scheduler_id,
                                tuple(pilot.nodes),
                                deadline=pilot.kill_at,
                            )
                        )
            else:
                self._busy.discard(change.node)

    def _terminate(self, pilot: _Pilot, why: str, reason: EndReason = EndReason.OTHER) -> None:
        pilot.why, pilot.reason = why, reason
        pilot.kill_at = self.clock() + self.pilots.grace_s
        procs.signal_group(pilot.process.pid, signal.SIGTERM)

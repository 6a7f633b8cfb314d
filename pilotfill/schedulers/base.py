"""The one interface every batch system is adapted to (Parsl's providers, plus what they lack).

The controller never calls qsub, sbatch or a process launcher itself: it asks
a :class:`BatchScheduler` how many nodes the main workload leaves idle,
submits pilots sized to demand, gives back nodes it does not need, cancels
pilots, and polls for what changed. Preemption notices reach the controller
from the pilot agents themselves (SIGTERM -> ``pilot.leaving``); the adapter
reports what the batch system sees (a pilot started, ended, was killed).
"""

from __future__ import annotations

import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..config import PilotConfig

if TYPE_CHECKING:
    import subprocess

    from ..config import Config

OnSpawn = Callable[["subprocess.Popen", str, str], None]
"""Told of every process an adapter starts on this machine (process, what it is, its host): the journal keeps them."""


def host_of(node: str) -> str:
    """The host a node is on: ``vm`` for PBS's vnode ``vm[2]``, ``nid001`` for ``nid001.cluster``."""
    return node.split(".")[0].split("[")[0]


class NodeAccess:
    """What a pilot's agent asks of its batch system from inside the job: this job's id and nodes, and how a process
    reaches another node of it. The default is the local virtual cluster's: every node is this machine.

    One subclass per batch system, named by its adapter's ``node_access``; the agent makes it from the name on its
    command line (:func:`pilotfill.schedulers.registry.adapter_class`), so it has no ``if scheduler ==``."""

    def __init__(self, python: str = sys.executable):
        self.python = python

    def id_of_this_job(self) -> str:
        """This pilot's job id in the batch system (when the agent's command line gives none)."""
        raise NotImplementedError(f"{type(self).__name__} cannot find its job's id: pass --scheduler-id")

    def nodes_of_this_job(self) -> list[str]:
        """The nodes the batch system gave this job (when the agent's command line names none)."""
        raise NotImplementedError(f"{type(self).__name__} cannot find its job's nodes: pass --nodes")

    def is_here(self, node: str, here: str) -> bool:
        """Whether ``node``'s processes run on this machine, whose short hostname is ``here``."""
        return True

    def run_on(self, node: str, argv: list[str], env: dict[str, str], log_path: Path) -> list[str]:
        """The command that runs ``argv`` with ``env`` on ``node`` of this job from the agent's host (not ``is_here``).
        ``log_path``: where that process's output belongs, for a launch that cannot hand it back."""
        return argv

    def end_on(self, node: str, argv: list[str]) -> list[str] | None:
        """The command that runs ``argv`` (the agent's ``--end-on``) on ``node``'s host, for a batch system whose
        remote shell forwards no signal; None where ending the launch ends the process there (``srun`` does)."""
        return None


class RemoteNodes(NodeAccess):
    """A job whose nodes are separate hosts: a node is here when it is on this host."""

    def is_here(self, node: str, here: str) -> bool:
        return host_of(node) == here

    @staticmethod
    def with_env(node: str, argv: list[str], env: dict[str, str]) -> list[str]:
        """``env K=V … argv``: a remote shell passes no environment of ours."""
        return ["env", *(f"{k}={v}" for k, v in {**env, "PILOTFILL_HOST": node}.items()), *argv]


class EventKind(StrEnum):
    """What the batch system did to a pilot."""

    STARTED = "started"  # it runs, on ``nodes``
    PREEMPTED = "preempted"  # it is being killed: its nodes go by ``deadline``
    ENDED = "ended"  # its run is over (see :class:`EndReason`)


class EndReason(StrEnum):
    """Why a pilot's run ended, where the controller acts on it (``detail`` says it to people)."""

    REQUEUED = "requeued"  # the batch system put it back in the queue: the same pilot may run again
    CANCELLED = "cancelled"  # cancelled (by us, or before it ran): its nodes were not taken from a running job
    OTHER = "other"  # finished, killed, gone: its nodes were taken


@dataclass(frozen=True)
class PilotEvent:
    """Something the batch system did to a pilot: ``started`` (with nodes), ``ended`` or ``preempted``."""

    kind: EventKind
    pilot: str
    scheduler_id: str
    nodes: tuple[str, ...] = ()
    deadline: float | None = None
    detail: str = ""
    reason: EndReason = EndReason.OTHER  # of an ``ended`` event


class BatchScheduler(ABC):
    """A batch system as pilotfill needs it.

    Each adapter also says, as class attributes, what the rest of pilotfill needs of it without making one: its
    ``title`` for people, the ``[node_types]`` keys that select its nodes (``selects``), and its pilots' job-side
    calls (``node_access``); :meth:`from_config` makes it from a site config. The names live in
    :mod:`pilotfill.schedulers.registry`."""

    name: str = "base"
    title: ClassVar[str] = "a batch system"
    selects: ClassVar[tuple[str, ...]] = ()
    node_access: ClassVar[type[NodeAccess]] = NodeAccess
    config_class: ClassVar[type] = object
    """Its section of a site config (``[pbs]``: the registry's name), a frozen dataclass of defaults."""
    bounds: ClassVar[dict[str, tuple[float, float, str]]] = {}
    """``section.key`` -> (lowest, highest, what goes wrong outside):
    values that validate as numbers and cannot work."""

    @classmethod
    def parse_section(cls, raw: Any, name: str, where: Callable[[str], str], lead_s: float) -> Any:
        """Its section of a site config, checked (a :class:`~pilotfill.config.ConfigError` naming the key); ``lead_s``:
        how long before a pilot's walltime ends its nodes are drained (a walltime must outlast it)."""
        from ..config import section

        return section(cls.config_class, raw, name, where, cls.bounds)

    @classmethod
    def check_node_types(cls, node_types: tuple, config: Any, where: Callable[[str], str]) -> None:
        """What a ``[node_types]`` table must agree on with this batch system's own section (nothing, by default)."""

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, on_spawn: OnSpawn) -> BatchScheduler:
        """The adapter a site config asks for; ``on_spawn`` is told of each process it starts on this machine.
        (An adapter no config names — the replay's — is made by its owner.)"""
        raise NotImplementedError(f"{cls.__name__} is not made from a site config")

    @abstractmethod
    def idle_nodes(self) -> int:
        """Nodes the main workload leaves free right now that no pilot of ours holds."""

    @abstractmethod
    def submit_pilot(self, pilot_id: str, nodes: int, node_type: str | None = None) -> str:
        """Ask for a pilot of up to ``nodes`` nodes (all of ``node_type``, on a machine with several kinds of node);
        returns the batch system's job id."""

    def idle_by_type(self) -> dict[str, int] | None:
        """On a machine with several kinds of node (the config's ``[node_types]``): the idle nodes of each type, as
        ``idle_nodes`` counts them. None: one kind of node (the default)."""
        return None

    @abstractmethod
    def release(self, pilot_id: str, nodes: list[str]) -> list[str]:
        """Give ``nodes`` of a running pilot back to the main workload now; return those given back.

        A batch system may refuse some (PBS never releases the primary
        execution host; Slurm keeps the batch host): those stay with the
        pilot until the whole pilot can be cancelled.
        """

    @abstractmethod
    def cancel(self, pilot_id: str) -> None:
        """End a pilot (queued or running)."""

    @abstractmethod
    def poll(self, now: float) -> list[PilotEvent]:
        """What changed since the last poll."""

    def capacity(self) -> int | None:
        """The most nodes pilots could ever hold here (the machine or partition), or None if unknown.

        A job needing more than this can never run: the controller refuses it
        rather than letting it wait forever.
        """
        return None

    def adopt(self, pilots: list[tuple[str, str]]) -> list[str]:
        """Take over pilots a previous controller on this run directory submitted.

        ``pilots`` are (pilot id, batch job id) pairs from the durable state.
        Returns the pilot ids this adapter now tracks (so that ``poll`` reports
        their changes and ``close`` deletes them); the others are gone. The
        default adopts none: pilots that die with their controller (the local
        cluster) cannot survive it.
        """
        return []

    def close(self) -> None:
        """Cancel everything this adapter started or adopted, queued or running, and stop its helpers."""


    def check(self) -> None:
        """Raise :class:`SchedulerConfigError` if no pilot could ever run as configured (checked once, at start)."""


class PilotRefused(RuntimeError):
    """The batch system refused a submission by policy (a queue or QOS limit), not by failing.

    The pilot manager backs off before asking again instead of retrying every tick. ``reason``: the batch
    system's own words, short enough for a progress line.
    """

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class NothingIdle(RuntimeError):
    """No node is idle to ask for (the main workload holds them all, or took the last one since it was counted): not
    a failure. The pilots are sized again when the batch system's idle nodes change. ``reason``: what it counted."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class SchedulerConfigError(RuntimeError):
    """The site config can never work with this batch system: asking again would get the same answer (a resource
    or queue the server does not know, a chunk no node can satisfy). The campaign stops with this one line, which
    names the config key and the batch system's words; ``reason`` is those words alone."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def agent_argv(
    run_dir: Path,
    pilot_id: str,
    scheduler: str,
    pilots: PilotConfig,
    python: str = sys.executable,
    bin_dir: str | None = None,
) -> list[str]:
    """The command line of a pilot's agent, which finds its nodes from the batch system. ``bin_dir``: where the batch
    system's commands are (put first on the agent's PATH: a job started without a login shell has no site profile)."""
    return [
        python,
        "-m",
        "pilotfill.pilots.agent",
        "--run-dir",
        str(run_dir),
        "--pilot",
        pilot_id,
        "--scheduler",
        scheduler,
        "--heartbeat-s",
        str(pilots.heartbeat_s),
        "--deadline-s",
        str(pilots.heartbeat_deadline_s),
        "--grace-s",
        str(pilots.grace_s),
        *(["--bin-dir", bin_dir] if bin_dir else []),
    ]


def agent_command(
    run_dir: Path, pilot_id: str, scheduler: str, pilots: PilotConfig, python: str = sys.executable
) -> str:
    """The shell line a pilot's job script runs: the agent, in place of the script's shell."""
    return "exec " + " ".join(shlex.quote(a) for a in agent_argv(run_dir, pilot_id, scheduler, pilots, python))

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
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..config import PilotConfig


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
    """A batch system as pilotfill needs it."""

    name: str = "base"

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


class SchedulerConfigError(RuntimeError):
    """The site config can never work with this batch system: asking again would get the same answer (a resource
    or queue the server does not know, a chunk no node can satisfy). The campaign stops with this one line, which
    names the config key and the batch system's words; ``reason`` is those words alone."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def agent_argv(run_dir: Path, pilot_id: str, scheduler: str, pilots: PilotConfig, python: str = sys.executable, bin_dir: str | None = None) -> list[str]:
    """The command line of a pilot's agent, which finds its nodes from the batch system. ``bin_dir``: where the batch
    system's commands are (put first on the agent's PATH: a job started without a login shell has no site profile)."""
    return [
        python, "-m", "pilotfill.pilots.agent", "--run-dir", str(run_dir), "--pilot", pilot_id, "--scheduler", scheduler,
        "--heartbeat-s", str(pilots.heartbeat_s), "--deadline-s", str(pilots.heartbeat_deadline_s), "--grace-s", str(pilots.grace_s),
        *(["--bin-dir", bin_dir] if bin_dir else []),
    ]  # fmt: skip


def agent_command(run_dir: Path, pilot_id: str, scheduler: str, pilots: PilotConfig, python: str = sys.executable) -> str:
    """The shell line a pilot's job script runs: the agent, in place of the script's shell."""
    return "exec " + " ".join(shlex.quote(a) for a in agent_argv(run_dir, pilot_id, scheduler, pilots, python))

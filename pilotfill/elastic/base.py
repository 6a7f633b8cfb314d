"""The runtime interface: what the controller asks of whatever runs a job's ranks.

The controller decides, the runtime acts: ``start`` a job on hosts, ``resize``
it to a new host list (the hosts it keeps are untouched), ``stop`` it, and
``poll`` for what happened on its own — a rank that exited, crashed or was
killed. ``poll`` is the failure callback: the controller calls it every tick
and turns each :class:`RankExit` into an event of its loop, so nothing moves
nodes but the controller. Results and tracebacks travel separately, as
authenticated ``job.result`` / ``job.failed`` messages from the ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import subprocess

    from ..config import Config
    from ..protocol import Reply
    from .launch import NodeLauncher

OnSpawn = Callable[["subprocess.Popen", str, str, str], None]
"""Told of every process a runtime starts on the controller's machine (process, what it is, its job, its host)."""


@dataclass(frozen=True)
class RankExit:
    """A rank ended. ``requested``: the runtime was asked to stop it (a shrink or a stop)."""

    job_id: str
    host: str
    returncode: int
    requested: bool
    output: str = ""  # the last of what it printed, where its runtime keeps it (a job's launcher: its log's tail)

    @property
    def crashed(self) -> bool:
        """Ended without being asked: the app's own end, status 0 included (``os._exit(0)``: a rank that returns
        normally reports first, so its job is over before its exit is seen)."""
        return not self.requested


class Runtime(ABC):
    """Runs jobs' ranks; one instance per controller.

    ``handles``: the message types of its own this runtime answers (:meth:`handle`); the controller routes each to
    the runtime of that kind. The names live in :mod:`pilotfill.elastic.registry`."""

    handles: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, config: Config, run_dir: Path, launcher: NodeLauncher, on_spawn: OnSpawn) -> Runtime:
        """The runtime a site config asks for: every process it puts on a compute node goes through ``launcher``
        (the node's pilot agent); ``on_spawn`` is told of each it starts on this machine. (A runtime no config names —
        the replay's — is made by its owner.)"""
        raise NotImplementedError(f"{cls.__name__} is not made from a site config")

    def answering(self, message_type: str) -> Runtime | None:
        """The runtime that answers ``message_type`` here: this one if it ``handles`` it, else None."""
        return self if message_type in self.handles else None

    def handle(self, message: Any, now: float) -> Reply:
        """Answer one of this runtime's own messages (``handles``): its type's reply class (``message.REPLY``)."""
        raise NotImplementedError(f"{type(self).__name__} answers no message {getattr(message, 'TYPE', message)!r}")

    @abstractmethod
    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        """Start ``job_id`` with one rank per host."""

    @abstractmethod
    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        """Grow or shrink to exactly ``hosts``; ranks on hosts kept go on undisturbed.

        ``lost``: hosts that went away on their own since the last call
        (preempted, released, their rank crashed) — not the allocator's choice.
        """

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        """Whether ranks (of ``job_id``) carry the work done since the job's last commit through a resize.

        Where a resize restarts ranks from their commit, the controller's count of
        the job's progress falls back to it, as after a stop. The safe answer is no.
        """
        return False

    def resize_restarts_ranks(self, job_id: str | None = None) -> bool:
        """Whether a resize of a job (``job_id``) ends every rank and starts the job's ranks anew at the new size (a new
        rendezvous round): until they report, what its old ranks still report describes the old size, not the new."""
        return False

    def shrinks_while_forming(self, job_id: str | None = None) -> bool:
        """Whether a job (``job_id``) can lose ranks while the others are still forming the group, before they have
        reported or committed since the job started. Where it cannot, the controller restarts it on the nodes it
        keeps."""
        return True

    def adopt(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> bool:
        """Take over a job a predecessor controller started, whose ranks still run on ``hosts``: this runtime's
        bookkeeping for it is rebuilt so that they go on as if nothing happened (:mod:`pilotfill.controller.recovery`).
        False: it cannot (the default), and the job is requeued from its last commit."""
        return False

    def silent_s(self, job_id: str, now: float) -> float | None:
        """Seconds since the job's ranks last showed a sign of life of this runtime's own (their output), where a job
        can stall out of sight of its collectives' timeouts (Elastic Horovod's driver waits up to its elastic timeout);
        None where the runtime's own timeouts end every stall."""
        return None

    @abstractmethod
    def stop(self, job_id: str) -> None:
        """Stop every rank of the job (not an error: it may be restarted later)."""

    @abstractmethod
    def hosts(self, job_id: str) -> list[str]:
        """Hosts the job has live ranks on."""

    @abstractmethod
    def poll(self) -> list[RankExit]:
        """Ranks that ended since the last poll."""

    @abstractmethod
    def close(self) -> None:
        """Stop everything."""

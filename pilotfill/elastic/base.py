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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankExit:
    """A rank ended. ``requested``: the runtime was asked to stop it (a shrink or a stop)."""

    job_id: str
    host: str
    returncode: int
    requested: bool

    @property
    def crashed(self) -> bool:
        return not self.requested and self.returncode != 0


class Runtime(ABC):
    """Runs jobs' ranks; one instance per controller."""

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

    def shrinks_while_forming(self, job_id: str | None = None) -> bool:
        """Whether a job (``job_id``) can lose ranks while the others are still forming the group, before they have
        reported or committed since the job started. Where it cannot, the controller restarts it on the nodes it keeps."""
        return True

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

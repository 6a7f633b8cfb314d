"""Each job on the runtime its code is written for: the runtime follows the code, not only the config.

An app names its runtime (``@elastic_app(runtime="horovod")``); a job whose spec
names none runs on the configured one (``[runtime] kind``). :class:`JobRuntimes`
is the one :class:`~pilotfill.elastic.base.Runtime` the controller talks to: it
keeps a runtime of each kind a job has needed (made on first use; the
configured one at once) and sends every call for a job to that job's. So a
Horovod campaign under the default config runs under Horovod — one
``horovodrun`` per job, world size = nodes × ranks — beside torch jobs of the
same controller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import RankExit, Runtime


class JobRuntimes(Runtime):
    """``JobRuntimes(default, make)``: ``make(kind)`` builds the runtime of that kind (once)."""

    def __init__(self, default: str, make: Callable[[str], Runtime]):
        self.default = default
        self._make = make
        self._kinds: dict[str, Runtime] = {}
        self._of: dict[str, str] = {}  # running job -> its runtime's kind
        self.of_kind(default)

    def of_kind(self, kind: str) -> Runtime:
        runtime = self._kinds.get(kind)
        if runtime is None:
            runtime = self._kinds[kind] = self._make(kind)
        return runtime

    def kind_of(self, spec: dict[str, Any]) -> str:
        """The runtime a job spec names, else the configured one."""
        return spec.get("runtime") or self.default

    def _for(self, job_id: str) -> Runtime | None:
        kind = self._of.get(job_id)
        return self._kinds.get(kind) if kind is not None else None

    def answering(self, message_type: str) -> Runtime | None:
        """Of the runtimes a job has needed, the one that answers ``message_type`` (its own messages need its jobs)."""
        return next((r for r in self._kinds.values() if r.answering(message_type) is not None), None)

    # ------------------------------------------------------------ Runtime

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        kind = self.kind_of(spec)
        runtime = self.of_kind(kind)  # a runtime that cannot be made fails this job's start, not the controller
        self._of[job_id] = kind
        runtime.start(job_id, spec, hosts)

    def adopt(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> bool:
        """A predecessor's job, on the runtime its spec names (made now if need be:
        the torch store is adopted with it)."""
        kind = self.kind_of(spec)
        try:
            runtime = self.of_kind(kind)
        except Exception:
            # a runtime that cannot be made adopts nothing: the job is requeued, and its start will say why
            return False
        if not runtime.adopt(job_id, spec, hosts):
            return False
        self._of[job_id] = kind
        return True

    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        runtime = self._for(job_id)
        if runtime is not None:
            runtime.resize(job_id, hosts, lost=lost)

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        runtime = self._for(job_id) if job_id is not None else None
        return (runtime or self.of_kind(self.default)).resize_keeps_progress(grow_only, job_id)

    def resize_restarts_ranks(self, job_id: str | None = None) -> bool:
        runtime = self._for(job_id) if job_id is not None else None
        return (runtime or self.of_kind(self.default)).resize_restarts_ranks(job_id)

    def shrinks_while_forming(self, job_id: str | None = None) -> bool:
        runtime = self._for(job_id) if job_id is not None else None
        return (runtime or self.of_kind(self.default)).shrinks_while_forming(job_id)

    def silent_s(self, job_id: str, now: float) -> float | None:
        runtime = self._for(job_id)
        return runtime.silent_s(job_id, now) if runtime is not None else None

    def stop(self, job_id: str) -> None:
        runtime = self._for(job_id)
        self._of.pop(job_id, None)
        if runtime is not None:
            runtime.stop(job_id)

    def hosts(self, job_id: str) -> list[str]:
        runtime = self._for(job_id)
        return runtime.hosts(job_id) if runtime is not None else []

    def poll(self) -> list[RankExit]:
        return [exit_ for runtime in self._kinds.values() for exit_ in runtime.poll()]

    def close(self) -> None:
        for runtime in self._kinds.values():
            runtime.close()
        self._of.clear()

"""The Python API over the controller's messages: submit jobs, read them, wait for them.

Used by the Parsl executor, ``pilotfill top``/``status`` and tests. Every call
is one authenticated request (:mod:`pilotfill.transport`); a reply read for a field
is checked into its class first (``JobSubmitReply.parse``), so a reply of the wrong
shape is a :class:`~pilotfill.protocol.ProtocolError` naming the field, not a ``KeyError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .lifecycle import TERMINAL
from .protocol import (
    JobCancel,
    JobGet,
    JobGetReply,
    JobStatusQuery,
    JobStatusReply,
    JobSubmit,
    JobSubmitReply,
    StateSnapshot,
)
from .transport import Client


class ControllerClient:
    def __init__(self, run_dir: Path | str, timeout_s: float = 30.0, interrupt: Callable[[], bool] | None = None):
        """``interrupt``: checked while a request waits; when true the request raises ``transport.Interrupted`` (a
        campaign shutting down does not wait out the timeout of a controller that has stopped)."""
        self.run_dir = Path(run_dir)
        self._client = Client(self.run_dir, timeout_s=timeout_s)
        self._interrupt = interrupt

    def submit(self, spec: dict[str, Any]) -> str:
        """Queue a job; returns its id once the controller has committed it."""
        return JobSubmitReply.parse(self._client.request(JobSubmit(spec), interrupt=self._interrupt)).job_id

    def job(self, job_id: str) -> dict[str, Any]:
        return JobGetReply.parse(self._client.request(JobGet(job_id), interrupt=self._interrupt)).job

    def status(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Status, progress, result and error of each job (one request; the jobs' code is not sent back)."""
        return JobStatusReply.parse(self._client.request(JobStatusQuery(job_ids), interrupt=self._interrupt)).jobs

    def cancel(self, job_id: str) -> None:
        self._client.request(JobCancel(job_id), interrupt=self._interrupt)

    def snapshot(self) -> dict[str, Any]:
        return self._client.request(StateSnapshot(), interrupt=self._interrupt)

    def wait(self, job_ids: list[str], timeout_s: float = 600.0, poll_s: float = 0.5) -> dict[str, dict[str, Any]]:
        """Block until every job is finished, failed or cancelled; return their records."""
        deadline = time.monotonic() + timeout_s
        done: dict[str, dict[str, Any]] = {}
        while True:
            for job_id in job_ids:
                if job_id not in done:
                    job = self.job(job_id)
                    if job["status"] in TERMINAL:
                        done[job_id] = job
            if len(done) == len(job_ids):
                return done
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs not done after {timeout_s:.0f} s: {sorted(set(job_ids) - set(done))}")
            time.sleep(poll_s)

    def close(self) -> None:
        self._client.close()

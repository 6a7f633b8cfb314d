"""``pilotfill.report(samples=n)``: the one line a training loop adds.

Every rank reports the samples it processed since its last report; the
controller sums them over ranks into the job's progress and its throughput
(for the profiler). With :class:`~pilotfill.elastic.loader.ElasticLoader`,
rank 0 alone reports each global batch as it hands it out, with the loader's
position: the job's progress is then that position, and what a stop makes it
do again is counted redone exactly. Progress counted since the job's last commit is
provisional: a stop, or a resize that restarts ranks, loses it, and the job
redoes it from its commit — so the controller's count falls back there too.
:func:`committed` (called by ``ElasticState.commit`` and pilotfill's Horovod
``TorchState``) tells the controller that what was counted is now durable.
``report`` returns the job's progress over all ranks, so a loop can stop when
the work is done. Outside pilotfill
(no ``PILOTFILL_JOB_ID`` in the environment) it does nothing and returns None,
so the same training code runs standalone.
"""

from __future__ import annotations

import os
import time

from .protocol import JobCommit, JobDescribe, JobReport
from .transport import Client

_client: Client | None = None
_last: float | None = None
_first = False  # the next report is the first since the process started or its group re-formed


def _connect() -> Client:
    global _client
    if _client is None:
        _client = Client(os.environ["PILOTFILL_RUN_DIR"], timeout_s=120)
    return _client


def report(samples: float, position: float | None = None, noise_scale: float | None = None) -> float | None:
    """Report ``samples`` processed by this rank since its previous report; ``position``: where the job is after
    them, in global samples since it began (the elastic loader's, on rank 0); ``noise_scale``: an adaptive batch's
    measured gradient noise scale (:mod:`pilotfill.elastic.adaptive`), what the allocator values its sizes by."""
    global _client, _last, _first
    job_id = os.environ.get("PILOTFILL_JOB_ID")
    if not job_id:
        return None
    now = time.monotonic()
    first = _last is None or _first  # covers this process starting up, or its group re-forming: not the training rate
    _first = False
    if _last is None:
        _last = float(os.environ.get("PILOTFILL_STARTED", now))
    client = _connect()
    seconds = max(now - (_last if _last is not None else now), 1e-3)
    _last = now
    where = None if position is None else float(position)
    reply = client.request(
        JobReport(
            job_id,
            os.environ.get("PILOTFILL_HOST", ""),
            float(samples),
            seconds,
            pid=os.getpid(),
            first=first,
            position=where,
            noise_scale=None if noise_scale is None else float(noise_scale),
        ).to_dict()
    )
    return float(reply["progress"])


def measure_from(when: float) -> None:
    """This rank's next report is its first at a new size (it re-formed in place at ``when``, POSIX s): the controller
    measures what the change cost from it, not the training rate."""
    global _last, _first
    _last, _first = time.monotonic() - max(0.0, time.time() - when), True


def committed() -> float | None:
    """Tell the controller that the job's state was just saved durably (rank 0, after the save):
    the progress counted so far survives any stop. Returns the committed progress (None outside pilotfill)."""
    job_id = os.environ.get("PILOTFILL_JOB_ID")
    if not job_id:
        return None
    return float(_connect().request(JobCommit(job_id))["committed"])


def describe(model: dict) -> bool | None:
    """Tell the controller the job's model descriptor (:mod:`pilotfill.describe`; ``ElasticState`` does it on the
    first forward pass). True if it was kept (the job had none yet); None outside pilotfill."""
    job_id = os.environ.get("PILOTFILL_JOB_ID")
    if not job_id:
        return None
    return bool(_connect().request(JobDescribe(job_id, model)).get("kept"))

"""``pilotfill.report(samples=n)``: the one line a training loop adds.

Every rank reports the samples it processed since its last report; the
controller sums them over ranks into the job's progress (durable) and its
throughput (for the profiler). The call returns the job's committed progress
over all ranks, so a loop can stop when the work is done. Outside pilotfill
(no ``PILOTFILL_JOB_ID`` in the environment) it does nothing and returns None,
so the same training code runs standalone.
"""

from __future__ import annotations

import os
import time

from .transport import Client

_client: Client | None = None
_last: float | None = None


def report(samples: float) -> float | None:
    """Report ``samples`` processed by this rank since its previous report."""
    global _client, _last
    job_id = os.environ.get("PILOTFILL_JOB_ID")
    if not job_id:
        return None
    now = time.monotonic()
    first = _client is None  # covers this process starting up: the controller does not take it for the training rate
    if _client is None:
        _client = Client(os.environ["PILOTFILL_RUN_DIR"], timeout_s=120)
        _last = float(os.environ.get("PILOTFILL_STARTED", now))
    seconds = max(now - (_last if _last is not None else now), 1e-3)
    _last = now
    reply = _client.request(
        {"type": "job.report", "job_id": job_id, "host": os.environ.get("PILOTFILL_HOST", ""), "samples": float(samples), "seconds": seconds, "first": first}
    )
    return float(reply["progress"])

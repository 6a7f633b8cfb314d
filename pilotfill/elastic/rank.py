"""Entry point of one rank (both runtimes): fetch the job, run its function, send the outcome.

    PILOTFILL_RUN_DIR=… PILOTFILL_JOB_ID=… PILOTFILL_HOST=… python -m pilotfill.elastic.rank

The function's return value (JSON) goes back as ``job.result`` — from rank 0
when the function used Horovod, from whichever rank finishes first otherwise;
an exception on any rank goes back as ``job.failed`` with its full traceback,
and the rank exits 1.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from ..procs import die_with_parent
from ..transport import Client


def resolve(entry: str):
    """``"package.module:function"`` -> the function."""
    module, _, name = entry.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def horovod_rank() -> int | None:
    """This process's Horovod rank if the function initialised Horovod, else None."""
    hvd = sys.modules.get("horovod.torch")
    try:
        return hvd.rank() if hvd is not None and hvd.is_initialized() else None
    except Exception:
        return None


def main() -> int:
    die_with_parent()
    run_dir, job_id = os.environ["PILOTFILL_RUN_DIR"], os.environ["PILOTFILL_JOB_ID"]
    client = Client(run_dir, timeout_s=60)
    job = client.request({"type": "job.get", "job_id": job_id})["job"]
    spec = job["spec"]
    try:
        value = resolve(spec["entry"])(*spec["args"], **spec["kwargs"])
    except Exception:
        client.request({"type": "job.failed", "job_id": job_id, "error": traceback.format_exc()})
        return 1
    if horovod_rank() in (None, 0):
        client.request({"type": "job.result", "job_id": job_id, "value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main())

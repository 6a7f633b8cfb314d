"""Entry point of one rank (both runtimes): fetch the job, run its function, send the outcome.

    PILOTFILL_RUN_DIR=… PILOTFILL_JOB_ID=… PILOTFILL_HOST=… python -m pilotfill.elastic.rank

The function's return value (JSON) goes back as ``job.result`` — from rank 0
when the function used Horovod, from whichever rank finishes first otherwise;
an exception on any rank goes back as ``job.failed`` with its full traceback,
and the rank exits 1.
"""

from __future__ import annotations

import base64
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
    if spec.get("payload"):
        return run_parsl_task(client, job_id, spec["payload"])
    try:
        value = resolve(spec["entry"])(*spec["args"], **spec["kwargs"])
    except Exception:
        client.request({"type": "job.failed", "job_id": job_id, "error": traceback.format_exc()})
        return 1
    if horovod_rank() in (None, 0):
        client.request({"type": "job.result", "job_id": job_id, "value": value})
    return 0


def run_parsl_task(client: Client, job_id: str, payload: str) -> int:
    """A call shipped by the Parsl executor: Parsl already wraps the function so that an exception
    comes back as a ``RemoteExceptionWrapper`` carrying the traceback; both outcomes travel
    serialized by Parsl's own serializer."""
    from parsl.app.errors import RemoteExceptionWrapper
    from parsl.serialize import serialize, unpack_apply_message

    func, args, kwargs = unpack_apply_message(base64.b64decode(payload))
    value = func(*args, **kwargs)
    packed = {"parsl": base64.b64encode(serialize(value)).decode()}
    if isinstance(value, RemoteExceptionWrapper):
        tb = value.e_traceback.as_traceback() if value.e_traceback is not None else None
        error = "".join(traceback.format_exception(value.e_type, value.e_value, tb))
        client.request({"type": "job.failed", "job_id": job_id, "error": error, "value": packed})
        return 1
    if horovod_rank() in (None, 0):
        client.request({"type": "job.result", "job_id": job_id, "value": packed})
    return 0


if __name__ == "__main__":
    sys.exit(main())

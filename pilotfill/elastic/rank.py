"""Entry point of one rank (processes and Horovod runtimes): fetch the job, run its function, send the outcome.

    PILOTFILL_RUN_DIR=… PILOTFILL_JOB_ID=… PILOTFILL_HOST=… python -m pilotfill.elastic.rank [--nproc N]

The function's return value (JSON) goes back as ``job.result`` — from rank 0
when the function used Horovod, from whichever rank finishes first otherwise;
an exception on any rank goes back as ``job.failed`` with its full traceback,
and the rank exits 1. ``--nproc N`` starts a node's share of a job: N ranks,
each with ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (ended together on SIGTERM).
Where the node has GPUs (``PILOTFILL_GPUS_PER_NODE`` > 0) each rank sees only
its own: ``CUDA_VISIBLE_DEVICES`` is its local rank, so it uses ``cuda:0``.
A rank of the processes runtime refuses Horovod, and a rank of either refuses torch.distributed's env://
rendezvous (:mod:`pilotfill.elastic.guard`).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable

from ..procs import die_with_parent
from ..protocol import JobFailed, JobGet, JobResult
from ..results import pack
from ..transport import Client
from .ending import AppExited, exited, exited_text
from .guard import refuse_horovod, refuse_torch_distributed
from .horovod_sync import always_sync


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


def local_rank() -> int | None:
    """This rank's index on its node, as whichever launcher started it says."""
    for name in ("LOCAL_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def bind_device() -> None:
    """One GPU per rank: its local rank's, before anything imports CUDA (nothing to do without GPUs)."""
    gpus = int(os.environ.get("PILOTFILL_GPUS_PER_NODE", "0") or 0)
    rank = local_rank()
    if gpus > 0 and rank is not None and "PILOTFILL_DEVICE_BOUND" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank % gpus)
        os.environ["PILOTFILL_DEVICE_BOUND"] = "1"


def node_share(nproc: int) -> int:
    """Run ``nproc`` ranks of the job on this node and wait for them; SIGTERM ends them all."""
    import signal
    import subprocess

    node = int(os.environ.get("PILOTFILL_NODE_RANK", "0") or 0)
    children = []
    for i in range(nproc):
        env = {
            **os.environ,
            "LOCAL_RANK": str(i),
            "LOCAL_WORLD_SIZE": str(nproc),
            "PILOTFILL_RANK": str(node * nproc + i),
        }
        children.append(
            subprocess.Popen([sys.executable, "-m", "pilotfill.elastic.rank"], env=env, preexec_fn=die_with_parent)
        )

    def forward(signum, frame) -> None:
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    codes = [child.wait() for child in children]
    return next((c for c in codes if c != 0), 0)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    args = sys.argv[1:] if argv is None else argv
    if "--nproc" in args:
        nproc = int(args[args.index("--nproc") + 1])
        if nproc > 1:
            return node_share(nproc)
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
        if "PILOTFILL_NODE_RANK" in os.environ:  # the processes runtime, one rank on this node: its rank is the node's
            os.environ.setdefault("PILOTFILL_RANK", os.environ["PILOTFILL_NODE_RANK"])
    bind_device()
    runtime = os.environ.get("PILOTFILL_RUNTIME", "processes")
    refuse_horovod(runtime)  # before the app's code: hvd.init() here would be a world of one
    refuse_torch_distributed(runtime)  # and torch's env:// rendezvous would find no peers
    if runtime == "horovod":
        always_sync()  # a removal and an addition in one new group would otherwise hang it
    run_dir, job_id = os.environ["PILOTFILL_RUN_DIR"], os.environ["PILOTFILL_JOB_ID"]
    client = Client(run_dir, timeout_s=60)
    reply = client.request(JobGet(job_id))
    job = reply["job"]
    spec = job["spec"]
    if reply.get("checkpoint"):
        os.environ["PILOTFILL_CHECKPOINT"] = reply["checkpoint"]  # where this training's commits go, by its call
    if spec.get("payload"):
        return run_parsl_task(client, job_id, spec["payload"])
    try:
        value = resolve(spec["entry"])(*spec["args"], **spec["kwargs"])
    except Exception:
        client.request(JobFailed(job_id, traceback.format_exc()))
        return 1
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt raised by the app: its end, said once
        client.request(JobFailed(job_id, exited_text(exc)))
        return 1
    if horovod_rank() in (None, 0):
        client.request(JobResult(job_id, value))
    return 0


def run_parsl_task(client: Client, job_id: str, payload: str, sends_result: Callable[[], bool] | None = None,
                   transient: Callable[[BaseException], int | None] | None = None) -> int:  # fmt: skip
    """A call shipped by the Parsl executor: Parsl already wraps the function so that an exception
    comes back as a ``RemoteExceptionWrapper`` carrying the traceback; both outcomes travel
    serialized by Parsl's own serializer.

    ``sends_result``: whether this rank is the one that answers (default: Horovod's rank 0, or any rank
    without Horovod); ``transient``: an exit status for a failure that is not the job's (a lost peer), else None.
    """
    from parsl.app.errors import RemoteExceptionWrapper
    from parsl.serialize import serialize

    from ..executors.shipping import CannotShip, unpack_call

    try:
        func, args, kwargs = unpack_call(payload)
    except CannotShip as exc:  # a module the app needs is not here: said once, naming it
        client.request(JobFailed(job_id, str(exc)))
        return 1
    try:
        value = func(*args, **kwargs)
    except BaseException as exc:
        # Parsl's wrapper catches Exception only: sys.exit(), KeyboardInterrupt end the app here
        value = RemoteExceptionWrapper(AppExited, exited(exc), exc.__traceback__)
    run_dir = client.run_dir
    if isinstance(value, RemoteExceptionWrapper):
        code = transient(value.e_value) if transient is not None else None
        if code is not None:
            return code
        tb = value.e_traceback.as_traceback() if value.e_traceback is not None else None
        error = "".join(traceback.format_exception(value.e_type, value.e_value, tb))
        try:
            packed = pack(run_dir, job_id, serialize(value))
        except OSError as exc:  # the traceback still goes, without the exception object
            client.request(JobFailed(job_id, f"{error}\n{exc.strerror}"))
            return 1
        client.request(JobFailed(job_id, error, packed))
        return 1
    if (sends_result or (lambda: horovod_rank() in (None, 0)))():
        try:
            packed = pack(run_dir, job_id, serialize(value))
        except OSError as exc:  # a result too large for this run directory's disk: said, not retried
            client.request(JobFailed(job_id, f"the app returned a result it cannot deliver: {exc.strerror}"))
            return 1
        client.request(JobResult(job_id, packed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

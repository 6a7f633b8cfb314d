"""One rank under the torch runtime: :mod:`pilotfill.elastic.rank`, adapted to torch elastic.

The elastic agent (:mod:`pilotfill.elastic.torch_agent`) starts it — forked
from a warm forkserver as a function (:func:`entry`), or as
``python -m pilotfill.elastic.torch_worker``. It fetches the job and runs its
function like ``rank`` does, with three differences:

* the round's store namespace: a plain ``dist.init_process_group()``
  (``env://``) uses the run's store at ``MASTER_ADDR:MASTER_PORT`` — an
  authenticated store only the run's processes can use (:mod:`.torch_store`),
  not a ``TCPStore`` — under the round's prefix (``PILOTFILL_RDZV_PREFIX``), so
  it never sees another round's or another job's keys;
* a collective failing because a peer went away (gloo's "Connection reset by
  peer", a ``DistError``) is not the job's failure: the rank exits with
  :data:`EXIT_PEER_LOST`, and its agent re-forms with the controller's hosts;
* only global rank 0 sends ``job.result`` (every rank returns a value).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from ..procs import die_with_parent
from ..transport import Client
from .rank import resolve, run_parsl_task

EXIT_PEER_LOST = 75
"""Exit status of a rank whose collective failed because another rank is gone (EX_TEMPFAIL)."""

PEER_LOST_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Connection refused",
    "Socket Timeout",
    "Timed out waiting",
    "/gloo/",
    "NCCL communicator was aborted",
)


def peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a collective failing, not the user's code."""
    try:
        from torch.distributed import DistError
    except ImportError:  # pragma: no cover - torch is there whenever this runtime is
        DistError = ()  # type: ignore[assignment]  # noqa: N806
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DistError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc) for m in PEER_LOST_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def bind_store(prefix: str | None = None) -> None:
    """Make ``env://`` rendezvous (plain ``init_process_group``) use the run's store under the round's prefix.

    The store is :class:`~pilotfill.elastic.run_store.RunStore` at ``MASTER_ADDR:MASTER_PORT`` (the run's store,
    which only holders of the run's secret can use), not a ``TCPStore`` client: torch's own ``env://`` handler is
    replaced, for this process, by one that reads the same variables and query (rank, world_size)."""
    prefix = prefix or os.environ.get("PILOTFILL_RDZV_PREFIX")
    if not prefix:
        return
    import importlib
    from datetime import timedelta
    from urllib.parse import parse_qs, urlparse

    from torch.distributed import PrefixStore

    from .run_store import RunStore

    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module; torch.distributed.rendezvous is also a function
    handlers = rdzv._rendezvous_handlers  # torch's scheme -> handler table (register_rendezvous_handler refuses to replace)
    if getattr(handlers["env"], "pilotfill_prefix", None) == prefix:
        return

    def env_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any):
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank = int(query.get("rank", os.environ.get("RANK", "0")))
        world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "1")))
        store = RunStore(os.environ["PILOTFILL_RUN_DIR"], os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=timeout)
        yield PrefixStore(prefix, store), rank, world_size
        raise RuntimeError("env:// cannot re-rendezvous; pilotfill restarts the workers instead")

    env_handler.pilotfill_prefix = prefix  # type: ignore[attr-defined]
    handlers["env"] = env_handler


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main() -> int:
    die_with_parent()
    bind_store()
    run_dir, job_id = os.environ["PILOTFILL_RUN_DIR"], os.environ["PILOTFILL_JOB_ID"]
    client = Client(run_dir, timeout_s=60)
    reply = client.request({"type": "job.get", "job_id": job_id})
    spec = reply["job"]["spec"]
    if reply.get("checkpoint"):
        os.environ["PILOTFILL_CHECKPOINT"] = reply["checkpoint"]  # where this training's commits go (as in rank.py)
    if spec.get("payload"):
        return run_parsl_task(client, job_id, spec["payload"], sends_result=lambda: global_rank() == 0,
                              transient=lambda exc: EXIT_PEER_LOST if peer_lost(exc) else None)  # fmt: skip
    try:
        value = resolve(spec["entry"])(*spec["args"], **spec["kwargs"])
    except Exception as exc:
        if peer_lost(exc):
            print(f"pilotfill: rank {global_rank()} lost a peer ({type(exc).__name__}: {str(exc)[:200]}); re-forming", file=sys.stderr, flush=True)
            return EXIT_PEER_LOST
        client.request({"type": "job.failed", "job_id": job_id, "error": traceback.format_exc()})
        return 1
    if global_rank() == 0:
        client.request({"type": "job.result", "job_id": job_id, "value": value})
    return 0


def entry() -> None:
    """The agent's function entrypoint: a non-zero status must end the process, not be a return value."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == EXIT_PEER_LOST:
        os._exit(code)  # at once: tearing down a broken process group can take seconds, and nothing is left to save
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())

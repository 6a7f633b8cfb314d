"""Job entries for the process-group and grace tests: what a rank of the torch runtime gets, and does.

Each writes JSON lines to ``out``.
"""

from __future__ import annotations

import json
import os
import signal
import time


def _write(out: str, **record) -> None:
    with open(out, "a") as f:
        f.write(json.dumps({"rank": int(os.environ.get("RANK", -1)), "pid": os.getpid(), "time": time.time(), **record}) + "\n")


def settings(out: str) -> int:
    """The NCCL variables this rank has, and the timeout of the process groups it creates (no ``timeout=`` given)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    dist.init_process_group("gloo")
    world = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    sub = dist.new_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    nccl = c10d._get_default_timeout(c10d.Backend.NCCL).total_seconds()  # what an NCCL group would get (no NCCL on CPU)
    env = {k: v for k, v in os.environ.items() if k.startswith("TORCH_NCCL_")}
    _write(out, world_timeout_s=world, new_group_timeout_s=sub, nccl_timeout_s=nccl, env=env)
    dist.barrier()
    return dist.get_rank()


def survivor(out: str) -> str:
    """Rank 1 hangs outside the collective (a peer that stopped answering); rank 0's all-reduce must fail, not wait."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() != 0:
        time.sleep(3600)
    began = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - what the survivor sees is the point
        _write(out, raised=type(exc).__name__, message=str(exc)[:300], after_s=time.monotonic() - began)
        return "raised"
    _write(out, raised=None)
    return "returned"


def commits_on_sigterm(out: str, save_s: float) -> None:
    """Train until told to stop; on SIGTERM take ``save_s`` to save (a large model's checkpoint), then leave."""

    def on_term(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # saving once: the agents' further SIGTERMs must not restart it
        _write(out, event="term")
        time.sleep(save_s)
        _write(out, event="saved")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    _write(out, event="up")
    while True:
        time.sleep(0.1)

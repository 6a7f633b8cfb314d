"""A job entry for the runtime tests: every rank writes what it sees (its rank, the world, its node, its GPU)."""

from __future__ import annotations

import json
import os
import time


def probe(out: str, runtime: str, hold_s: float = 5.0) -> dict:
    """Write one JSON line per rank to ``out``; hold a while so that every rank is up before the job ends."""
    env = os.environ
    if runtime == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size, local, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    elif runtime == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        local, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        dist.barrier()
    else:
        rank, size = int(env["PILOTFILL_RANK"]), int(env["PILOTFILL_SIZE"])
        local, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    record = {"host": env.get("PILOTFILL_HOST"), "rank": rank, "size": size, "local_rank": local, "local_size": local_size,
              "cuda": env.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}  # fmt: skip
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    time.sleep(hold_s)
    return record

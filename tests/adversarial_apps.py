"""Job entries that do odd things, for tests/test_adversarial.py (importable by ranks: the tests put this folder on
their PYTHONPATH)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import pilotfill


def refused(steps: int = 3) -> None:
    """Every rank trains a little, then raises the user's own error, worded like a network failure."""
    dist.init_process_group("gloo")
    for _ in range(steps):
        t = torch.ones(4)
        dist.all_reduce(t)
        pilotfill.report(samples=1)
    raise RuntimeError("could not fetch the next shard: [Errno 111] Connection refused")


def one_rank_raises() -> None:
    """Rank 1 raises its own error while rank 0 waits for it in a collective."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    pilotfill.report(samples=1)
    if dist.get_rank() == 1:
        raise ValueError("rank 1's own bug")
    dist.all_reduce(t)  # waits for rank 1, which never comes
    return None


def dies_every_time(at_step: int = 2) -> None:
    """Rank 1's process dies at the same step in every round (a crash in native code, say), before any commit."""
    dist.init_process_group("gloo")
    for step in range(1_000_000):
        t = torch.ones(4)
        dist.all_reduce(t)
        pilotfill.report(samples=1)
        if step == at_step and dist.get_rank() == 1:
            os._exit(9)
        time.sleep(0.05)

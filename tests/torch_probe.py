"""A job entry for the torch runtime's tests: ``digits.train`` with a log of what each rank saw.

Every worker start (with the position it restored), every durable commit and
each process's first training step go as JSON lines to ``$PROBE_LOG``, with
the rank's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
CUDA_VISIBLE_DEVICES, PILOTFILL_HOST).
"""

from __future__ import annotations

import json
import os
import time

import held_digits

from pilotfill.elastic import state as elastic_state

_stepped = False


def log(event: str, **fields) -> None:
    env = os.environ
    record = {
        "event": event, "time": time.time(), "pid": os.getpid(), "host": env.get("PILOTFILL_HOST"),
        "rank": int(env.get("RANK", -1)), "world": int(env.get("WORLD_SIZE", -1)),
        "local_rank": int(env.get("LOCAL_RANK", -1)), "local_world": int(env.get("LOCAL_WORLD_SIZE", -1)),
        "cuda": env.get("CUDA_VISIBLE_DEVICES"), "round": int(env.get("PILOTFILL_RDZV_ROUND", -1)), **fields,
    }  # fmt: skip
    with open(env["PROBE_LOG"], "a") as f:
        f.write(json.dumps(record) + "\n")


class ProbedState(elastic_state.ElasticState):
    def restore(self) -> bool:
        restored = super().restore()
        log("start", epoch=self.epoch, batch=self.batch, restored=restored)
        return restored

    def commit(self) -> None:
        super().commit()
        if elastic_state.rank() == 0:
            log("commit", epoch=self.epoch, batch=self.batch)

    def _resume_from_memory(self, membership) -> bool:
        """A worker restarted in place after a hard loss: the commit its node held in memory (logged as a start)."""
        held = super()._resume_from_memory(membership)
        if self._held:
            log("start", epoch=self.epoch, batch=self.batch, restored="memory")
        return held

    def _take(self, payload, from_disk: bool) -> None:
        """A joining rank took the job's state from a peer (or the commit, where nobody held it)."""
        super()._take(payload, from_disk)
        log("joined", epoch=self.epoch, batch=self.batch, position=self.loader.position, from_disk=from_disk)


def first_step(batch) -> None:
    """After each optimizer step (digits' ``on_step``): the process's first is logged."""
    global _stepped
    if not _stepped:
        _stepped = True
        log("step")


def train(startup_s: float = 0.0, hold_file: str | None = None, **kwargs) -> dict:
    """``startup_s``: what a slow start costs before training (loading a big model, say); ``hold_file``: training goes
    on past its epochs while this file exists (:mod:`held_digits`)."""
    time.sleep(startup_s)
    elastic_state.ElasticState = ProbedState  # digits imports it at call time
    return held_digits.train(hold_file, on_step=first_step, **kwargs)

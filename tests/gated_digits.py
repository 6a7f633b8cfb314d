"""``digits.train`` paced by a gate and recording what each rank was given (both runtimes: torch and Elastic Horovod).

A test that churns a training job's nodes must know where the job is when it takes a node, and the job must not end
before the test is done — on a busy machine neither may depend on timing. The gate file holds a global sample
position: after each optimizer step a rank waits while the job is at or past it (what it learns does not change; only
when). Each rank logs to ``record`` (JSON lines) every fetch from the training set — its rank and world, its process
and the dataset indices — and each time it starts waiting at the gate. Ranks import this from the tests' folder.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from pilotfill.elastic.loader import Batch, current_world
from pilotfill.workloads import digits


def _log(record: str, **fields) -> None:
    rank, world = current_world()
    with open(record, "a") as f:  # one short line per write: lines from many processes do not interleave
        f.write(json.dumps({"pid": os.getpid(), "rank": rank, "world": world, "time": time.time(), **fields}) + "\n")


class RecordedSet(Dataset):
    """The training tensors, each fetch written down (the same samples, collated as ``TensorDataset``'s would be)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, record: str):
        self.x, self.y, self.record = x, y, record

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        _log(self.record, event="fetch", indices=[int(i) for i in indices])
        return [(self.x[i], self.y[i]) for i in indices]


def allowed(gate: str) -> float:
    try:
        return float(Path(gate).read_text())
    except (OSError, ValueError):  # being replaced: the last value stands a moment longer
        return -1.0


def open_gate(gate: Path, position: float) -> None:
    """Let the job train until its position reaches ``position`` (written whole: ranks read it at any moment)."""
    tmp = gate.with_suffix(".tmp")
    tmp.write_text(str(position))
    os.replace(tmp, gate)


def train(gate: str | None = None, record: str | None = None, **kwargs) -> dict:
    length = {}

    def train_set(x: torch.Tensor, y: torch.Tensor) -> Dataset:
        length["n"] = len(x)
        return RecordedSet(x, y, record) if record else digits.TensorDataset(x, y)

    def on_step(batch: Batch) -> None:
        position = batch.epoch * length["n"] + batch.start + batch.size
        if gate is None or position < allowed(gate):
            return
        if record:
            _log(record, event="gate", position=position, epoch=batch.epoch, step=batch.step)
        while position >= allowed(gate):
            time.sleep(0.05)

    digits.train_set = train_set
    return digits.train(on_step=on_step, **kwargs)

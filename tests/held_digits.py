"""``digits.train`` that keeps training while a file exists (both runtimes: torch and Elastic Horovod).

A test that waits for something to happen to a training job — a node taken back and given again, a rank killed,
a failed neighbour's nodes handed over — keeps the job training until it has seen it, then removes the file and the
job ends at its epochs. Without it the job may simply finish first on a busy machine, and the test fails for a
reason that is not the behaviour it checks. Ranks import this from the tests' folder (on their ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import time

from pilotfill.workloads import digits


class HeldEpochs(int):
    """A number of epochs that is not reached while ``hold_file`` exists (``state.epoch < epochs`` asks this first);
    while ``stall_file`` exists, a rank asking waits there without a word (a stuck job, as a hung collective leaves it)."""

    def __new__(cls, epochs: int, hold_file: str | None, stall_file: str | None = None):
        held = super().__new__(cls, epochs)
        held.hold_file, held.stall_file = hold_file, stall_file
        return held

    def __gt__(self, epoch: object) -> bool:
        while self.stall_file is not None and os.path.exists(self.stall_file):
            time.sleep(0.2)
        return (self.hold_file is not None and os.path.exists(self.hold_file)) or int(self) > epoch


def train(hold_file: str | None = None, stall_file: str | None = None, **kwargs) -> dict:
    """``digits.train(**kwargs)``; past its epochs while ``hold_file`` exists, stalled while ``stall_file`` does."""
    if hold_file is not None or stall_file is not None:
        kwargs["epochs"] = HeldEpochs(kwargs.get("epochs", 20), hold_file, stall_file)
    result = digits.train(**kwargs)
    return {**result, "epochs": int(result["epochs"])} if isinstance(result, dict) and "epochs" in result else result
